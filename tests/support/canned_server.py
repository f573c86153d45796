"""A stand-in for an OpenAI-compatible server that answers every POST with one canned reply, for
`edgespec bench --server` against servers that answer nonsense (tests/test_hostile_cli.py,
tests/test_fuzz_input.py)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Canned(BaseHTTPRequestHandler):
    """Answers every POST with the server's ``reply``: (status, content type, body)."""

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, kind, body = self.server.reply
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading (a reply over its limit): what the test asks of it

    def log_message(self, *args):
        pass


@contextmanager
def canned_server():
    """A running server (its ``reply`` set by the caller) and its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    server.reply = (200, "application/json", b"{}")
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)  # a quick shutdown
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
