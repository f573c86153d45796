"""Text completions: ``POST /v1/completions`` (OpenAI's legacy API, which editors use for inline
completion) and llama-server's ``POST /infill``.

``/v1/completions`` takes ``prompt`` (text, a list holding one text, or token ids) and, for fill in
the middle, ``suffix``: the prompt is the code before the cursor, the suffix the code after it, and
the answer the middle (``decoding/completion.py`` builds the FIM prompt from the GGUF's own tokens; a
model without them answers 400). ``max_tokens``, ``stop``, ``temperature``, ``top_p``, ``seed`` and
``stream`` work as in chat; the answer carries the same ``usage`` and ``timings``.

``/infill`` takes llama-server's fields: ``input_prefix``, ``input_suffix`` and an optional
``prompt`` (text typed after the prefix), ``n_predict`` for ``max_tokens``; it answers in the same
``text_completion`` shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..decoding import checks
from ..decoding.chat import ChatSettings
from ..decoding.completion import CompletionPrompt
from .protocol import Defaults, check_model, generation
from .validation import ApiError, checked, shown

MAX_PROMPT_IDS = 1_000_000  # token ids a prompt may list (the context window limits it far sooner)


@dataclass(frozen=True)
class CompletionRequest:
    prompt: CompletionPrompt
    settings: ChatSettings
    stream: bool
    tools = None  # completions never read tool calls

    def run(self, session, cancel, stats):
        """The completion's steps, on the worker thread (``session``: the ``ChatSession``)."""
        return session.complete(self.prompt, self.settings, cancel, stats)


def completion_request(body: dict, defaults: Defaults) -> CompletionRequest:
    """Validate a ``/v1/completions`` body. Unknown fields are ignored."""
    check_model(body, defaults)
    if body.get("echo"):
        raise ApiError(400, "echo is not supported: the answer holds the completion only.", "echo")
    if body.get("best_of", 1) != 1:
        raise ApiError(400, "best_of must be 1: this server returns one completion.", "best_of")
    prompt = _prompt(body.get("prompt"))
    suffix = body.get("suffix")
    if suffix is not None:
        if not isinstance(suffix, str):
            raise ApiError(400, "suffix must be a string (the text after the gap to fill).", "suffix")
        if prompt.token_ids is not None:
            raise ApiError(400, "fill in the middle takes the prompt as text, not token ids.", "prompt")
        checked(checks.check_text, suffix, "suffix")
        prompt = CompletionPrompt(prompt.text, None, suffix)
    return CompletionRequest(prompt, _settings(body, defaults), _stream(body))


def infill_request(body: dict, defaults: Defaults) -> CompletionRequest:
    """Validate a llama-server ``/infill`` body."""
    check_model(body, defaults)
    fields = {}
    for name in ("input_prefix", "input_suffix", "prompt"):
        value = body.get(name, "")
        if not isinstance(value, str):
            raise ApiError(400, f"{name} must be a string.", name)
        checked(checks.check_text, value, name)
        fields[name] = value
    if "n_predict" in body and "max_tokens" not in body:
        body = {**body, "max_tokens": body["n_predict"]}
    prompt = CompletionPrompt(fields["input_prefix"] + fields["prompt"], None, fields["input_suffix"])
    return CompletionRequest(prompt, _settings(body, defaults), _stream(body))


def _prompt(value) -> CompletionPrompt:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        checked(checks.check_text, value, "prompt")
        return CompletionPrompt(value)
    if (
        isinstance(value, list)
        and 0 < len(value) <= MAX_PROMPT_IDS
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        return CompletionPrompt("", tuple(value))
    raise ApiError(
        400,
        f"prompt must be a string or a list of token ids (one prompt per request), not {shown(value)}.",
        "prompt",
    )


def _settings(body: dict, defaults: Defaults) -> ChatSettings:
    return ChatSettings(**generation(body, defaults))


def _stream(body: dict) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream must be true or false, not {shown(stream)}.", "stream")
    return stream
