"""The terminal chat app (Textual): ``edgespec chat``.

``app.py`` wires things together; ``screens/`` and ``widgets/`` hold the views by role;
models are loaded and answers streamed through ``edgespec.session`` (the chat facade `edgespec serve`
shares); ``display.py`` turns step events into what the widgets show; ``storage.py`` keeps conversations.
"""
