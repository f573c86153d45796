"""The terminal chat app (Textual): ``edgespec chat``.

``app.py`` wires things together; ``screens/`` and ``widgets/`` hold the views by role;
``backend.py`` is the only bridge to model loading and generation; ``storage.py`` keeps conversations.
"""
