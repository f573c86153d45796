"""`edgespec serve`: the OpenAI-compatible HTTP API (``protocol``: wire format, ``worker``: the one
generation thread, ``app``: the Starlette routes)."""
