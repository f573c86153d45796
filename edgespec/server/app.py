"""The HTTP side: a Starlette app that validates requests, queues them for the worker and streams back.

Routes: ``POST /v1/chat/completions`` (JSON or server-sent events), ``GET /v1/models``, ``GET /health``.
A handler never touches the models: it submits a ``Job`` and awaits what the worker thread delivers
(bridged onto the event loop with ``call_soon_threadsafe``). When a client goes away, the job's cancel
event is set and the decoder stops at its next step (or the job is skipped if it still waits).
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..decoding.events import StepEvent
from ..errors import ContextFullError, EdgespecError
from . import protocol
from .guard import DEFAULT_MAX_BODY, BodyLimit, HostGuard, allowed_hosts, client_error, log
from .protocol import ApiError, Defaults
from .worker import DONE, Job, QueueFull, Worker

RETRY_AFTER_SECONDS = 5  # told to clients when the queue is full


def create_app(
    worker: Worker,
    defaults: Defaults,
    strategy: str,
    api_key: str | None = None,
    hosts: frozenset[str] | None = None,
    max_body: int = DEFAULT_MAX_BODY,
) -> Starlette:
    """``hosts``: the Host/Origin allow-list (``edgespec.server.guard``; default: loopback names);
    ``max_body``: the largest request body in bytes."""

    async def chat_completions(request: Request) -> Response:
        try:
            raw = await request.body()
        except ClientDisconnect:  # the client left before its body arrived: nothing to answer
            log.info("%s %s: the client went away before sending its body", request.method, request.url.path)
            return Response(status_code=400)
        body = protocol.parse_body(raw)
        chat = protocol.chat_request(body, defaults)
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()

        def deliver(item: object) -> None:  # on the worker thread
            try:
                loop.call_soon_threadsafe(items.put_nowait, item)
            except RuntimeError:  # the event loop is gone (server shutting down)
                pass

        job = Job(chat, deliver)
        try:
            worker.submit(job)
        except QueueFull:
            raise ApiError(
                503,
                f"the server is busy: {worker.waiting} requests are waiting. Retry in a few seconds.",
                code="queue_full",
            ) from None
        answer = _Answer(job, items, defaults.model, strategy)
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            first = await answer.next_event()  # errors before the first token are still plain 4xx/5xx
        except BaseException:
            job.cancel.set()
            watcher.cancel()
            raise
        headers = protocol.truncation_headers(job.stats)
        if not chat.stream:
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
        return JSONResponse({"status": "ok", "model": defaults.model, "waiting": worker.waiting})

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
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={ApiError: api_error, 404: not_found, 405: not_found, Exception: crash},
        middleware=[
            Middleware(HostGuard, hosts=hosts or allowed_hosts("127.0.0.1"), on_error=api_error),
            Middleware(BodyLimit, limit=max_body, on_error=api_error),
            *([Middleware(_BearerAuth, key=api_key, on_error=api_error)] if api_key else []),
        ],
    )


class _BearerAuth:
    """Every request but /health must carry ``Authorization: Bearer <key>``, else 401."""

    def __init__(self, app, key: str, on_error):
        self.app, self.key, self.on_error = app, key.encode(), on_error

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, b"Bearer " + self.key):
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


class _Answer:
    """What the worker delivers for one job, as OpenAI objects."""

    def __init__(self, job: Job, items: asyncio.Queue, model: str, strategy: str):
        self.job, self.items, self.model, self.strategy = job, items, model, strategy
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.finish = "stop"

    async def next_event(self) -> StepEvent | None:
        """The next step, or None at the end; a generation error becomes an ``ApiError``."""
        item = await self.items.get()
        if item is DONE:
            return None
        if isinstance(item, ContextFullError):
            raise ApiError(400, str(item), "messages", "context_length_exceeded")
        if isinstance(item, EdgespecError):
            raise ApiError(500, str(item))
        if isinstance(item, Exception):
            raise ApiError(500, f"generation failed: {item!r}. Please report it.")
        if item.finish_reason is not None:
            self.finish = protocol.FINISH_REASONS.get(item.finish_reason, "stop")
        return item

    def extra(self) -> dict:
        stats = self.job.stats
        return {
            "usage": protocol.usage(stats),
            "timings": protocol.timings(stats, self.strategy),
            **protocol.truncation(stats),
        }

    async def whole(self, event: StepEvent | None) -> dict:
        text = []
        while event is not None:
            text.append(event.text)
            event = await self.next_event()
        return protocol.completion(
            self.id, self.created, self.model, "".join(text), self.finish, self.extra()
        )

    async def events(self, event: StepEvent | None) -> AsyncIterator[bytes]:
        try:
            yield protocol.sse(self._chunk({"role": "assistant", "content": ""}))
            while event is not None:
                if event.text:
                    yield protocol.sse(self._chunk({"content": event.text}))
                try:
                    event = await self.next_event()
                except ApiError as exc:  # headers are sent: the error goes in the stream
                    yield protocol.sse(exc.body())
                    return
            yield protocol.sse(self._chunk({}, self.finish))
            yield protocol.sse({**self._chunk({}), "choices": [], **self.extra()})
            yield protocol.sse("[DONE]")
        finally:
            self.job.cancel.set()  # the client went away (or we are done: then a no-op)

    def _chunk(self, delta: dict, finish: str | None = None) -> dict:
        return protocol.chunk(self.id, self.created, self.model, delta, finish)
