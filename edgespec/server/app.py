"""The HTTP side: a Starlette app that validates requests, queues them for the worker and streams back.

Routes: ``POST /v1/chat/completions`` (JSON or server-sent events; tools: ``tools.py``),
``POST /v1/completions`` and llama-server's ``POST /infill`` (text and fill in the middle:
``completions.py``), ``GET /v1/models``, ``GET /health``; the answers' shapes: ``answers.py``.
A handler never touches the models: it submits a ``Job`` and awaits what the worker thread delivers
(bridged onto the event loop with ``call_soon_threadsafe``). When a client goes away, the job's cancel
event is set and the decoder stops at its next step (or the job is skipped if it still waits).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Sequence
from dataclasses import replace

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import protocol
from .answers import Answer, ChatAnswer, CompletionAnswer
from .completions import completion_request, infill_request
from .guard import DEFAULT_MAX_BODY, BodyLimit, HostGuard, allowed_hosts, client_error, log
from .protocol import Defaults
from .validation import ApiError, parse_body
from .worker import Job, QueueFull, Worker

RETRY_AFTER_SECONDS = 5  # told to clients when the queue is full


def create_app(
    worker: Worker,
    defaults: Defaults,
    strategy: str,
    api_key: str | Sequence[str] | None = None,
    hosts: frozenset[str] | None = None,
    max_body: int = DEFAULT_MAX_BODY,
) -> Starlette:
    """``api_key``: the key, or keys, a request must carry (each key its own prompt-cache scope);
    ``hosts``: the Host/Origin allow-list (``edgespec.server.guard``; default: loopback names);
    ``max_body``: the largest request body in bytes."""
    keys = (api_key,) if isinstance(api_key, str) else tuple(api_key or ())

    async def chat_completions(request: Request) -> Response:
        return await answer(request, protocol.chat_request, ChatAnswer)

    async def completions(request: Request) -> Response:
        return await answer(request, completion_request, CompletionAnswer)

    async def infill(request: Request) -> Response:
        return await answer(request, infill_request, CompletionAnswer)

    async def answer(request: Request, parse, kind: type[Answer]) -> Response:
        """Parse the body, queue the job, answer as JSON or as server-sent events."""
        try:
            raw = await request.body()
        except ClientDisconnect:  # the client left before its body arrived: nothing to answer
            log.info("%s %s: the client went away before sending its body", request.method, request.url.path)
            return Response(status_code=400)
        body = parse_body(raw)
        parsed = parse(body, defaults)
        # the prompt cache's boundary: the key the request came with and the client's own cache key
        scope = (getattr(request.state, "key", None), protocol.cache_key(body))
        parsed = replace(parsed, settings=replace(parsed.settings, cache_scope=scope))
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()

        def deliver(item: object) -> None:  # on the worker thread
            try:
                loop.call_soon_threadsafe(items.put_nowait, item)
            except RuntimeError:  # the event loop is gone (server shutting down)
                pass

        job = Job(parsed, deliver)
        try:
            worker.submit(job)
        except QueueFull:
            raise ApiError(
                503,
                f"the server is busy: {worker.waiting} requests are waiting. Retry in a few seconds.",
                code="queue_full",
            ) from None
        answer = kind(job, items, defaults.model, strategy)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            first = await answer.next_event()  # errors before the first token are still plain 4xx/5xx
        except BaseException:
            job.cancel.set()
            watcher.cancel()
            raise
        headers = protocol.truncation_headers(job.stats)
        if not parsed.stream:
            try:
                return JSONResponse(await answer.whole(first), headers=headers)
            finally:
                job.cancel.set()  # a no-op once finished; stops the worker if this handler was cancelled
                watcher.cancel()
        # StreamingResponse watches for the disconnect itself (cancelling the stream below)
        watcher.cancel()
        headers["Cache-Control"] = "no-cache"
        return StreamingResponse(answer.events(first), media_type="text/event-stream", headers=headers)

    async def models(request: Request) -> Response:
        entry = {"id": defaults.model, "object": "model", "created": 0, "owned_by": "edgespec"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def health(request: Request) -> Response:
        if keys and getattr(request.state, "key", None) is None:
            return JSONResponse({"status": "ok"})  # without the key: only that the server is up
        health = {"status": "ok", "model": defaults.model, "waiting": worker.waiting}
        if worker.session is not None:  # read across threads: numbers, possibly a step old
            health["prompt_cache"] = worker.session.engine.cache_info()
            runs_on = getattr(worker.session.engine, "runs_on", None)  # where each model runs (not a fake's)
            if runs_on is not None:
                health["runs_on"] = runs_on
        return JSONResponse(health)

    async def api_error(request: Request, exc: ApiError) -> Response:
        if exc.status < 500:
            client_error(request, exc)
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if exc.status == 503 else None
        if exc.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = f"{request.method} {request.url.path} does not exist here; see /v1/chat/completions."
        if status == 405:
            message = f"{request.url.path} does not take {request.method}."
        return await api_error(request, ApiError(status, message))

    async def crash(request: Request, exc: Exception) -> Response:
        return await api_error(request, ApiError(500, f"internal error: {exc!r}. Please report it."))

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/completions", completions, methods=["POST"]),
            Route("/infill", infill, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={ApiError: api_error, 404: not_found, 405: not_found, Exception: crash},
        middleware=[
            Middleware(HostGuard, hosts=hosts or allowed_hosts("127.0.0.1"), on_error=api_error),
            Middleware(BodyLimit, limit=max_body, on_error=api_error),
            *([Middleware(_BearerAuth, keys=keys, on_error=api_error)] if keys else []),
        ],
    )


class _BearerAuth:
    """Every request but /health must carry ``Authorization: Bearer <key>`` with one of the keys, else
    401; which one (its index) goes into the request's state as ``key`` (/health: None without one)."""

    def __init__(self, app, keys: Sequence[str], on_error):
        self.app, self.on_error = app, on_error
        self.expected = [b"Bearer " + key.encode() for key in keys]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            # every key compared, each in constant time: the time says nothing of which one matched
            matches = [hmac.compare_digest(given, expected) for expected in self.expected]
            key = matches.index(True) if any(matches) else None
            scope.setdefault("state", {})["key"] = key
            if key is None and scope["path"] != "/health":
                error = ApiError(
                    401,
                    "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the "
                    "key given to `edgespec serve --api-key` (or EDGESPEC_API_KEY).",
                    code="invalid_api_key",
                )
                response = await self.on_error(Request(scope), error)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Set the job's cancel event when the client disconnects (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return
