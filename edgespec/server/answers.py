"""What the worker delivers for one job, as OpenAI objects: a chat answer (with tool calls when the
request offered tools) or a text completion, whole or as server-sent events.

An ``Answer`` reads the job's queue (each ``StepEvent``, an error, then ``DONE``); a subclass says how
text becomes choices and deltas. An error before the first token is still a plain 4xx/5xx; after it,
the headers are sent and the error goes into the stream.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from ..decoding.events import StepEvent
from ..errors import ContextFullError, EdgespecError, PromptError
from . import protocol
from .tools import ToolStream, merged
from .validation import ApiError
from .worker import DONE, Job


class Answer:
    prefix = "cmpl"

    def __init__(self, job: Job, items: asyncio.Queue, model: str, strategy: str):
        self.job, self.items, self.model, self.strategy = job, items, model, strategy
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.finish = "stop"

    async def next_event(self) -> StepEvent | None:
        """The next step, or None at the end; a generation error becomes an ``ApiError``."""
        item = await self.items.get()
        if item is DONE:
            return None
        if isinstance(item, ContextFullError):
            raise ApiError(400, str(item), self.prompt_field, "context_length_exceeded")
        if isinstance(item, PromptError):
            raise ApiError(400, str(item), self.prompt_field)
        if isinstance(item, EdgespecError):
            raise ApiError(500, str(item))
        if isinstance(item, Exception):
            raise ApiError(500, f"generation failed: {item!r}. Please report it.")
        if item.finish_reason is not None:
            self.finish = protocol.FINISH_REASONS.get(item.finish_reason, "stop")
        return item

    prompt_field = "prompt"  # the request field an oversized or impossible prompt comes from

    def extra(self) -> dict:
        stats = self.job.stats
        return {
            "usage": protocol.usage(stats),
            "timings": protocol.timings(stats, self.strategy),
            **protocol.truncation(stats),
        }

    async def text(self, event: StepEvent | None) -> str:
        parts = []
        while event is not None:
            parts.append(event.text)
            event = await self.next_event()
        return "".join(parts)

    async def whole(self, event: StepEvent | None) -> dict:
        raise NotImplementedError

    async def events(self, event: StepEvent | None) -> AsyncIterator[bytes]:
        """The stream: the opening chunk, a chunk per piece of text, the finish, usage, ``[DONE]``."""
        try:
            for chunk in self.opening():
                yield protocol.sse(chunk)
            while event is not None:
                for chunk in self.pieces(event.text):
                    yield protocol.sse(chunk)
                try:
                    event = await self.next_event()
                except ApiError as exc:  # headers are sent: the error goes in the stream
                    yield protocol.sse(exc.body())
                    return
            for chunk in self.closing():
                yield protocol.sse(chunk)
            yield protocol.sse({**self.chunk_base(), "choices": [], **self.extra()})
            yield protocol.sse("[DONE]")
        finally:
            self.job.cancel.set()  # the client went away (or we are done: then a no-op)

    def opening(self) -> list[dict]:
        return []

    def pieces(self, text: str) -> list[dict]:
        raise NotImplementedError

    def closing(self) -> list[dict]:
        raise NotImplementedError

    def chunk_base(self) -> dict:
        raise NotImplementedError


class ChatAnswer(Answer):
    """``chat.completion`` objects; with tools, the text read for calls (``server/tools.py``)."""

    prefix = "chatcmpl"
    prompt_field = "messages"

    def __init__(self, job: Job, items: asyncio.Queue, model: str, strategy: str):
        super().__init__(job, items, model, strategy)
        tools = job.request.tools
        self.tools = ToolStream(tools) if tools is not None and tools.parses else None
        self.called = False

    def _finish(self) -> str:
        return "tool_calls" if self.called else self.finish

    async def whole(self, event: StepEvent | None) -> dict:
        text = await self.text(event)
        message: dict = {"role": "assistant", "content": text}
        if self.tools is not None:
            content, calls = merged(self.tools.feed(text) + self.tools.finish())
            message["content"] = content
            if calls:
                message["tool_calls"], self.called = calls, True
        choice = {"index": 0, "message": message, "finish_reason": self._finish()}
        return {**self.chunk_base(), "object": "chat.completion", "choices": [choice], **self.extra()}

    def opening(self) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def pieces(self, text: str) -> list[dict]:
        if self.tools is None:
            return [self._chunk({"content": text})] if text else []
        return self._deltas(self.tools.feed(text))

    def closing(self) -> list[dict]:
        rest = self._deltas(self.tools.finish()) if self.tools is not None else []
        return [*rest, self._chunk({}, self._finish())]

    def _deltas(self, deltas: list[dict]) -> list[dict]:
        self.called = self.called or any("tool_calls" in d for d in deltas)
        return [self._chunk(d) for d in deltas]

    def chunk_base(self) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }

    def _chunk(self, delta: dict, finish: str | None = None) -> dict:
        return {**self.chunk_base(), "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


class CompletionAnswer(Answer):
    """``text_completion`` objects (``/v1/completions``)."""

    async def whole(self, event: StepEvent | None) -> dict:
        choice = self._choice(await self.text(event), self.finish)
        return {**self.chunk_base(), "choices": [choice], **self.extra()}

    def pieces(self, text: str) -> list[dict]:
        return [{**self.chunk_base(), "choices": [self._choice(text, None)]}] if text else []

    def closing(self) -> list[dict]:
        return [{**self.chunk_base(), "choices": [self._choice("", self.finish)]}]

    def chunk_base(self) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}

    @staticmethod
    def _choice(text: str, finish: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
