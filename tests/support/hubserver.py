"""A small stand-in for the Hugging Face hub's file endpoint, for download tests without a network.

It speaks what huggingface_hub 2.4.0 asks for when fetching one file: ``HEAD`` and ``GET`` on
``/{repo}/resolve/{revision}/{filename}``, answering with ``X-Repo-Commit``, ``ETag``, and for LFS files
``X-Linked-Etag`` (the file's sha256) and ``X-Linked-Size``; ``Range: bytes=N-`` gets a 206 with
``Content-Range``; unknown files get a 404 with the hub's ``X-Error-Code``. Every request is recorded,
and a file can be set to drop the connection midway through its next GET.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
RESOLVE_RE = re.compile(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<filename>.+)")


@dataclass
class HubFile:
    data: bytes
    lfs: bool = True  # LFS files advertise their sha256 (X-Linked-Etag) and size (X-Linked-Size)
    advertised_sha256: str | None = None  # what the hub claims; default: the real sha256
    advertised_size: int | None = None  # what HEAD claims; default: the real size
    drop_after: int | None = None  # the next GET sends this many bytes, then closes the connection

    @property
    def etag(self) -> str:
        if self.lfs:
            return self.advertised_sha256 or hashlib.sha256(self.data).hexdigest()
        return hashlib.sha1(self.data).hexdigest()  # a git blob id, as for small non-LFS files


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    range: str | None  # the Range header, if any
    status: int
    body_bytes: int  # bytes of the file actually sent


@dataclass
class HubServer:
    files: dict[tuple[str, str], HubFile] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def add(self, repo: str, filename: str, data: bytes, **options) -> HubFile:
        self.files[(repo, filename)] = HubFile(data, **options)
        return self.files[(repo, filename)]

    def gets(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET"]

    def __enter__(self) -> HubServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"


def _handler_for(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_HEAD(self) -> None:
            self._serve(send_body=False)

        def do_GET(self) -> None:
            self._serve(send_body=True)

        def log_message(self, *args: object) -> None:
            return None  # keep test output clean

        def _serve(self, send_body: bool) -> None:
            match = RESOLVE_RE.fullmatch(unquote(urlsplit(self.path).path))
            file = hub.files.get((match["repo"], match["filename"])) if match else None
            if file is None:
                self._not_found(match["repo"] if match else "")
                return
            start = _range_start(self.headers.get("Range"))
            payload = file.data[start:]
            status = 206 if start else 200
            self.send_response(status)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{file.etag}"')
            self.send_header("Accept-Ranges", "bytes")
            if file.lfs:
                self.send_header("X-Linked-Etag", f'"{file.etag}"')
                self.send_header("X-Linked-Size", str(file.advertised_size or len(file.data)))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(file.data) - 1}/{len(file.data)}")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            sent = self._send(file, payload) if send_body else 0
            hub.seen.append(Seen(self.command, self.path, self.headers.get("Range"), status, sent))

        def _send(self, file: HubFile, payload: bytes) -> int:
            if file.drop_after is None:
                self.wfile.write(payload)
                return len(payload)
            cut, file.drop_after = payload[: file.drop_after], None
            self.wfile.write(cut)
            self.wfile.flush()
            self.close_connection = True  # the client sees the body end early
            return len(cut)

        def _not_found(self, repo: str) -> None:
            known_repo = any(r == repo for r, _ in hub.files)
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound" if known_repo else "RepoNotFound")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", "0")
            self.end_headers()
            hub.seen.append(Seen(self.command, self.path, self.headers.get("Range"), 404, 0))

    return Handler


def _range_start(header: str | None) -> int:
    """Start of ``bytes=N-`` (the only form huggingface_hub sends); 0 without a Range header."""
    if header is None:
        return 0
    match = re.fullmatch(r"bytes=(\d+)-", header.strip())
    if match is None:
        raise ValueError(f"unsupported Range header: {header}")
    return int(match[1])
