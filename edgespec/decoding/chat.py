"""Multi-turn chat on a model pair: the GGUF's own chat template, context trimming, streaming.

Context policy: when the conversation plus the answer budget no longer fits the window, the oldest
turns are dropped (the system prompt and the newest user message are always kept). If even those
do not fit, ``ContextFullError`` says so. Dropped turns stay in the saved conversation; they are
only left out of what the model sees; ``stream_reply`` reports how many (``GenerationStats``).

Message text is data, never markup: the template is rendered around placeholders, its own text is
tokenised with special-token parsing (``<|im_start|>`` …) and each message's text without it, so a
message that contains ``<|im_end|>`` cannot close its turn or forge another
(``ChatSettings.special_tokens`` turns the parsing on for message text too). Trimming is linear in
the conversation: one render gives each turn's token count, and one more render checks the result.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..errors import ContextFullError, EdgespecError
from ..planner.base import Planner
from .decoder import Request, generate
from .events import GenerationStats, StepEvent
from .sampling import SamplingParams


@dataclass(frozen=True)
class ToolCall:
    name: str  # the function's name
    arguments: str  # its arguments as JSON text (as the OpenAI API carries them)
    id: str = ""


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user", "assistant" or "tool" (a tool's result)
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls of tools
    tool_call_id: str = ""  # a tool's result: the call it answers


@dataclass(frozen=True)
class ChatSettings:
    sampling: SamplingParams = SamplingParams()
    max_tokens: int = 512
    system_prompt: str = ""
    stop: Sequence[str] = ()
    special_tokens: bool = False  # parse special-token text (<|im_end|> …) inside messages as markup
    tools: tuple[dict, ...] = ()  # OpenAI function definitions ({"type": "function", "function": …})
    prefill: str = ""  # the answer's start, written for the model (a forced tool call's opening)
    # whose prompt cache the answer may reuse (serve: the API key and the client's prompt_cache_key);
    # another scope's cached text is never reused (engine/kv_cache.py)
    cache_scope: tuple = ()


def _system_and_turns(
    messages: Sequence[Message], settings: ChatSettings
) -> tuple[list[Message], list[Message]]:
    """The system prompt (the settings', else the first system message's) and the other messages."""
    text = settings.system_prompt or next((m.content for m in messages if m.role == "system"), "")
    return ([Message("system", text)] if text else []), [m for m in messages if m.role != "system"]


def prompt_tokens(pair, messages: Sequence[Message], settings: ChatSettings) -> tuple[list[int], int]:
    """Template + tokenise, trimming the oldest turns to leave ``max_tokens`` of room.

    Returns the tokens and how many earlier messages were left out. A conversation with tools (or
    tool calls, or a prefilled answer) is rendered by the template itself (``decoding/template.py``).
    """
    if settings.tools or settings.prefill or any(m.role == "tool" or m.tool_calls for m in messages):
        from .template import trimmed_tokens

        system, turns = _system_and_turns(messages, settings)
        return trimmed_tokens(pair, system + turns, settings, prompt_room(pair, settings))
    system, turns = _system_and_turns(messages, settings)
    room = prompt_room(pair, settings)
    render = _Renderer(pair.target.model, settings.special_tokens)
    # The whole conversation once: each turn costs its text's tokens and the template's before it.
    pieces = render.pieces(system + turns)
    first = len(system)
    cost = [len(pieces[2 * (first + i)]) + len(pieces[2 * (first + i) + 1]) for i in range(len(turns))]
    fixed = sum(len(p) for p in pieces) - sum(cost)
    kept = [fixed] * (len(turns) + 1)  # kept[d]: the estimate with the first d turns dropped
    for i in range(len(turns) - 1, -1, -1):
        kept[i] = kept[i + 1] + cost[i]
    dropped, slack = 0, 0  # slack: how far the estimate fell short of the exact count last time
    while True:
        while dropped < len(turns) - 1 and kept[dropped] + slack > room:
            dropped += 1
        tokens = pieces_tokens(pieces) if dropped == 0 else render.tokens(system + turns[dropped:])
        if len(tokens) <= room:
            return tokens, dropped
        if dropped >= len(turns) - 1:
            break
        slack = max(slack, len(tokens) - kept[dropped])
        dropped += 1
    raise ContextFullError(
        f"the message needs more than the {max(room, 0)} tokens of context left for the prompt "
        f"(window {pair.target.n_ctx}, {settings.max_tokens} kept for the answer). Shorten the message, "
        "lower max tokens, or load the models with a larger --ctx."
    )


def prompt_room(pair, settings: ChatSettings) -> int:
    """Tokens the prompt may take: the window less the answer's budget (at most half) and a tree."""
    return pair.target.n_ctx - min(settings.max_tokens, pair.target.n_ctx // 2) - pair.max_nodes


def pieces_tokens(pieces: list[list[int]]) -> list[int]:
    return [token for piece in pieces for token in piece]


class _Renderer:
    """The chat template around placeholders: template text parsed for special tokens, message text
    not (unless ``special``). Message text never passes through the template's C strings, so a NUL
    character is kept like any other."""

    def __init__(self, model, special: bool):
        self.model, self.special = model, special
        self.nonce = secrets.token_hex(8)
        probe = f" {self._marker(0)} "
        self.trims = probe not in model.apply_chat_template([{"role": "user", "content": probe}])

    def _marker(self, i: int) -> str:
        return f"\ue000{self.nonce}.{i}\ue001"  # private-use characters around a random nonce

    def pieces(self, messages: Sequence[Message]) -> list[list[int]]:
        """Tokens of [template, text of message 0, template, text of message 1, …, template]."""
        marks = [self._marker(i) for i in range(len(messages))]
        placeholders = [{"role": m.role, "content": k} for m, k in zip(messages, marks)]
        text = self.model.apply_chat_template(placeholders)
        out, at = [], 0
        for message, mark in zip(messages, marks):
            found = text.find(mark, at)
            if found < 0:
                raise EdgespecError(
                    "the model's chat template changes message text, so edgespec cannot keep it apart "
                    "from the template's markup; use a model with a standard chat template."
                )
            content = message.content.strip() if self.trims else message.content
            out.append(self.model.tokenize(text[at:found], add_special=at == 0, parse_special=True))
            out.append(self.model.tokenize(content, add_special=False, parse_special=self.special))
            at = found + len(mark)
        out.append(self.model.tokenize(text[at:], add_special=at == 0, parse_special=True))
        return out

    def tokens(self, messages: Sequence[Message]) -> list[int]:
        return pieces_tokens(self.pieces(messages))


def stream_reply(
    pair,
    planner: Planner | None,
    messages: Sequence[Message],
    settings: ChatSettings,
    cancel: threading.Event | None = None,
    stats: GenerationStats | None = None,
) -> Iterator[StepEvent]:
    """The assistant's reply to ``messages``, step by step; totals accumulate into ``stats``."""
    tokens, dropped = prompt_tokens(pair, messages, settings)
    if stats is not None:
        stats.dropped_messages = dropped
    yield from stream_tokens(pair, planner, tokens, settings, cancel, stats)


def stream_tokens(
    pair,
    planner: Planner | None,
    tokens: Sequence[int],
    settings: ChatSettings,
    cancel: threading.Event | None = None,
    stats: GenerationStats | None = None,
) -> Iterator[StepEvent]:
    """The continuation of the prompt ``tokens`` (a rendered chat, a completion prompt), step by step;
    the caches keep whatever prefix of ``tokens`` they hold already."""
    if stats is not None:
        stats.prompt_tokens = len(tokens)
    request = Request(
        prompt=tokens, max_tokens=settings.max_tokens, sampling=settings.sampling, stop=settings.stop
    )
    for event in generate(pair, planner, request, cancel):
        if stats is not None and event.verified_nodes:
            stats.add(event)
        yield event
