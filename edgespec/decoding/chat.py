"""Multi-turn chat on a model pair: the GGUF's own chat template, context trimming, streaming.

Context policy: when the conversation plus the answer budget no longer fits the window, the oldest
turns are dropped (the system prompt and the newest user message are always kept). If even those
do not fit, ``ContextFullError`` says so. Dropped turns stay in the saved conversation; they are
only left out of what the model sees.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..errors import ContextFullError
from ..planner.tree import Planner
from .decoder import Request, generate
from .events import GenerationStats, StepEvent
from .sampling import SamplingParams


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user" or "assistant"
    content: str


@dataclass(frozen=True)
class ChatSettings:
    sampling: SamplingParams = SamplingParams()
    max_tokens: int = 512
    system_prompt: str = ""
    stop: Sequence[str] = ()


def prompt_tokens(pair, messages: Sequence[Message], settings: ChatSettings) -> tuple[list[int], int]:
    """Template + tokenise, trimming the oldest turns to leave ``max_tokens`` of room.

    Returns the tokens and how many earlier messages were left out.
    """
    model = pair.target.model
    system = [Message("system", settings.system_prompt)] if settings.system_prompt else []
    turns = [m for m in messages if m.role != "system"]
    room = pair.target.n_ctx - min(settings.max_tokens, pair.target.n_ctx // 2) - pair.max_nodes
    for dropped in range(len(turns)):
        kept = system + turns[dropped:]
        text = model.apply_chat_template([{"role": m.role, "content": m.content} for m in kept])
        tokens = model.tokenize(text, add_special=True, parse_special=True)
        if len(tokens) <= room:
            return tokens, dropped
        if len(turns) - dropped <= 1:
            break
    raise ContextFullError(
        f"the message needs more than the {room} tokens of context left for the prompt "
        f"(window {pair.target.n_ctx}, {settings.max_tokens} kept for the answer). Shorten the message, "
        "lower max tokens, or load the models with a larger --ctx."
    )


def stream_reply(
    pair,
    planner: Planner | None,
    messages: Sequence[Message],
    settings: ChatSettings,
    cancel: threading.Event | None = None,
    stats: GenerationStats | None = None,
) -> Iterator[StepEvent]:
    """The assistant's reply to ``messages``, step by step; totals accumulate into ``stats``."""
    tokens, _ = prompt_tokens(pair, messages, settings)
    if stats is not None:
        stats.prompt_tokens = len(tokens)
    request = Request(
        prompt=tokens, max_tokens=settings.max_tokens, sampling=settings.sampling, stop=settings.stop
    )
    for event in generate(pair, planner, request, cancel):
        if stats is not None and event.verified_nodes:
            stats.add(event)
        yield event
