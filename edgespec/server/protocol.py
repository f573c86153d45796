"""The OpenAI chat-completions wire format: request validation and response shapes (pure, no I/O).

Validation turns a parsed JSON body into a ``ChatRequest`` or raises ``ApiError`` with the HTTP status
and a message that says what to fix. Response helpers build OpenAI's objects plus a ``timings`` object
in llama-server's shape (so clients written for llama-server read edgespec's numbers too) extended
with edgespec's own (strategy, mean accepted length, target calls).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..decoding import checks
from ..decoding.chat import ChatSettings, Message
from ..decoding.events import GenerationStats
from ..decoding.sampling import SamplingParams
from .tools import ToolSetup, tool_message, tool_setup
from .validation import ApiError, checked, field, message_text, shown

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}  # decoder → OpenAI


@dataclass(frozen=True)
class Defaults:
    """What a request gets for the fields it leaves out (the server's command-line settings)."""

    model: str  # the one model id this server answers for (and names in every response)
    strict_model: bool = False  # True: another model name is a 404; False: any name gets this pair
    sampling: SamplingParams = SamplingParams()
    max_tokens: int = 512
    max_messages: int = 1024  # messages one request may carry (serve --max-messages)
    special_tokens: bool = False  # parse special-token text in messages as markup (serve --special-tokens)


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[Message, ...]  # user and assistant turns, oldest first
    settings: ChatSettings  # sampling, max_tokens, stop strings and the joined system messages
    stream: bool
    tools: ToolSetup | None = None  # the request's tools (server/tools.py), None without

    def run(self, session, cancel, stats):
        """The answer's steps, on the worker thread (``session``: the ``ChatSession``)."""
        return session.stream(self.messages, self.settings, cancel, stats)


def chat_request(body: dict, defaults: Defaults) -> ChatRequest:
    """Validate a chat-completions body. Unknown fields are ignored (clients send many)."""
    check_model(body, defaults)
    system, turns = _messages(body.get("messages"), defaults.max_messages)
    tools = tool_setup(body)
    settings = ChatSettings(
        **generation(body, defaults),
        system_prompt=system,
        special_tokens=defaults.special_tokens,
        tools=tools.definitions if tools else (),
        prefill=tools.prefill if tools else "",
    )
    return ChatRequest(turns, settings, field(body, "stream", bool, False), tools)


def generation(body: dict, defaults: Defaults) -> dict:
    """The fields chat and text completions share: ``n``, ``max_tokens``, sampling, ``stop`` (as
    ``ChatSettings`` arguments)."""
    check_unsupported(body)
    if field(body, "n", int, 1) != 1:
        raise ApiError(400, "n must be 1: this server returns one choice per request.", "n")
    max_tokens = field(body, "max_completion_tokens", int, None)
    max_tokens = field(body, "max_tokens", int, max_tokens if max_tokens is not None else defaults.max_tokens)
    d = defaults.sampling
    temperature = field(body, "temperature", float, d.temperature)
    top_p = field(body, "top_p", float, d.top_p)
    seed = field(body, "seed", int, d.seed)
    checked(checks.check_max_tokens, max_tokens)
    checked(checks.check_sampling, temperature, top_p, d.top_k, seed)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise ApiError(400, "stop must be a string or a list of non-empty strings.", "stop")
    checked(checks.check_stops, stop)
    sampling = SamplingParams(temperature=temperature, top_k=d.top_k, top_p=top_p, seed=seed)
    return {"sampling": sampling, "max_tokens": max_tokens, "stop": tuple(stop)}


MAX_CACHE_KEY = 256  # characters of a client's prompt_cache_key or user


def cache_key(body: dict) -> str:
    """The client's own prompt-cache key: OpenAI's ``prompt_cache_key``, else ``user`` ("": none).
    Requests with different keys never reuse each other's cached prompts (docs/security.md)."""
    for name in ("prompt_cache_key", "user"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > MAX_CACHE_KEY:
            raise ApiError(400, f"{name} must be a string of at most {MAX_CACHE_KEY} characters.", name)
        return value
    return ""


def check_unsupported(body: dict) -> None:
    """Log-probabilities are not returned: asking for them is a 400, not a silent ``null``."""
    for name in ("logprobs", "top_logprobs", "n_probs"):
        value = body.get(name)
        if value is None or value is False or (name != "logprobs" and value == 0):
            continue
        raise ApiError(400, f"{name} is not supported: this server returns no log-probabilities.", name)


def check_model(body: dict, defaults: Defaults) -> None:
    """Any model name gets the one pair (as llama-server does; the response's ``model`` says which),
    unless the server runs with ``--strict-model``: then another name is a 404."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f"model must be a string, not {shown(model)}.", "model")
    if defaults.strict_model and model is not None and model != defaults.model:
        raise ApiError(
            404,
            f"model {shown(model)} is not served here; this server answers for {defaults.model!r} "
            "(see GET /v1/models).",
            "model",
            "model_not_found",
        )


def _messages(value, limit: int) -> tuple[str, tuple[Message, ...]]:
    """(system prompt, the other turns). System messages are joined: the chat template takes one."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, 'messages must be a non-empty list of {"role", "content"} objects.', "messages")
    if len(value) > limit:
        raise ApiError(
            400,
            f"messages holds {len(value)} messages; this server takes at most {limit} per request "
            "(serve --max-messages). Send the recent part of the conversation.",
            "messages",
            "too_many_messages",
        )
    system, turns = [], []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ApiError(400, f"{where} must be an object with role and content.", where)
        role = message.get("role")
        if role == "tool" or (role == "assistant" and message.get("tool_calls") is not None):
            turns.append(tool_message(message, where))
            continue
        role = ROLES.get(role) if isinstance(role, str) else None
        if role is None:
            raise ApiError(
                400,
                f"{where}.role must be one of {', '.join(ROLES)}, tool, not {shown(message.get('role'))}.",
                f"{where}.role",
            )
        text = message_text(message.get("content"), f"{where}.content")
        (system if role == "system" else turns).append(text if role == "system" else Message(role, text))
    if not turns or turns[-1].role not in ("user", "tool"):
        raise ApiError(
            400, "the last non-system message must be the user's (or a tool's result).", "messages"
        )
    return "\n\n".join(system), tuple(turns)


# -- responses --------------------------------------------------------------------------------------
def usage(stats: GenerationStats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.tokens,
        "total_tokens": stats.prompt_tokens + stats.tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def truncation(stats: GenerationStats) -> dict:
    """Whether earlier messages were left out to fit the context window, and how many."""
    return {"truncated": stats.dropped_messages > 0, "dropped_messages": stats.dropped_messages}


def truncation_headers(stats: GenerationStats) -> dict[str, str]:
    """The same as response headers (known once the prompt is built, before the first token)."""
    return {"X-Edgespec-Dropped-Messages": str(stats.dropped_messages)}


def timings(stats: GenerationStats, strategy: str) -> dict:
    """llama-server's ``timings`` (prompt = prefill: ``prompt_n`` tokens decoded, ``cache_n`` taken from
    the prompt cache; predicted = the decoding steps), plus edgespec's."""
    prompt_ms = stats.prefill_seconds * 1000
    predicted_ms = stats.timings.total * 1000
    decoded = stats.prompt_tokens - stats.cached_tokens
    return {
        "cache_n": stats.cached_tokens,
        "prompt_n": decoded,
        "prompt_ms": prompt_ms,
        "prompt_per_second": decoded / stats.prefill_seconds if stats.prefill_seconds else 0.0,
        "predicted_n": stats.tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_second": stats.tokens * 1000 / predicted_ms if predicted_ms else 0.0,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
        "strategy": strategy,
        "mean_accepted_length": stats.mean_accepted_length,
        "target_calls": stats.target_calls,
    }


def sse(data: dict | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line (``[DONE]`` is sent as is)."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()
