"""Request-level protection, in front of the routes: which Host and Origin may talk to the server, how
large a body may be, and one log line per refused request.

A server on 127.0.0.1 is reachable from every web page the user opens: a page may POST to it (a
"simple" request needs no CORS preflight), and through DNS rebinding (a name that first resolves to
the attacker's machine, then to 127.0.0.1) it may read the answers too. So, as local LLM servers have
adopted:

- **Host**: the ``Host`` header must name an allowed host — loopback names by default, the address
  the server is bound to, and any given with ``serve --allow-host`` (``*``: any host). A rebinding
  page sends its own name and gets 403.
- **Origin**: a browser names the page in ``Origin``; a request that carries one is refused unless
  its host is allowed too (``http://localhost:3000`` is; ``http://attacker.example`` is not).
  Non-browser clients (curl, the openai client, editors) send no Origin.
- **Body size**: a ``Content-Length`` over the limit is refused before reading; a chunked body is
  counted as it arrives and refused (413) once past it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

from .validation import ApiError

log = logging.getLogger("edgespec.server")

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
ANY_ADDRESS = ("0.0.0.0", "::", "")
DEFAULT_MAX_BODY = 8 * 1024 * 1024  # bytes: ~2M tokens of text, far past any context window


def allowed_hosts(bound: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """Loopback names, the bound address (unless it is a wildcard) and ``extra`` (``*``: any)."""
    hosts = {*LOOPBACK_HOSTS, *(h.strip().lower().rstrip(".").strip("[]") for h in extra)}
    if bound not in ANY_ADDRESS:
        hosts.add(bound.lower().strip("[]"))
    return frozenset(hosts)


def host_name(value: str) -> str:
    """The host of a ``Host`` header value (``name:port``, ``[v6]:port``), lowercased, no final dot."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0].rstrip(".") if value.count(":") <= 1 else value


class HostGuard:
    """403 unless the Host header (and the Origin header, when there is one) names an allowed host."""

    def __init__(self, app, hosts: frozenset[str], on_error):
        self.app, self.hosts, self.on_error = app, hosts, on_error

    def problem(self, headers: dict[bytes, bytes]) -> str | None:
        if "*" in self.hosts:
            return None
        host = headers.get(b"host")
        if host is not None and host_name(host.decode("latin-1")) not in self.hosts:
            name = host_name(host.decode("latin-1"))
            return (
                f"Host {name!r} is not served here (a guard against DNS rebinding). Use one of "
                f"{', '.join(sorted(self.hosts))}, or start the server with --allow-host {name}."
            )
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1")
            try:
                name = (urlsplit(text).hostname or "").rstrip(".")
            except ValueError:
                name = ""
            if name not in self.hosts:
                return (
                    f"requests from web pages at {text[:80]!r} are refused (Origin check: a page the user "
                    "opens must not drive this server). Start the server with --allow-host for a page "
                    "you trust."
                )
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            problem = self.problem(dict(scope["headers"]))
            if problem is not None:
                await _refuse(scope, receive, send, self.on_error, ApiError(403, problem, code="forbidden"))
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """413 for a body over ``limit`` bytes: by its Content-Length at once, or counted as it arrives."""

    def __init__(self, app, limit: int, on_error):
        self.app, self.limit, self.on_error = app, limit, on_error

    def error(self) -> ApiError:
        return ApiError(
            413,
            f"the request body is larger than this server's limit of {self.limit} bytes "
            "(serve --max-body-bytes).",
            code="request_too_large",
        )

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"0")
        try:
            declared = int(length)
        except ValueError:
            declared = 0
        if declared > self.limit:
            await _refuse(scope, receive, send, self.on_error, self.error())
            return
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise self.error()  # inside the route: the app's ApiError handler answers 413
            return message

        await self.app(scope, counted, send)


async def _refuse(scope, receive, send, on_error, error: ApiError) -> None:
    from starlette.requests import Request

    response = await on_error(Request(scope), error)
    await response(scope, receive, send)


def client_error(request, error: ApiError) -> None:
    """One log line per refused request (never a traceback): status, route, client and the message."""
    client = request.client.host if request.client else "?"
    log.info("%d %s %s from %s: %s", error.status, request.method, request.url.path, client, error.message)


def setup_logging(level: int = logging.INFO) -> None:
    """``edgespec: …`` lines on stderr for the server's own log (``edgespec serve``)."""
    if log.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("edgespec: %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
