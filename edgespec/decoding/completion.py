"""Raw completions and fill in the middle: the prompt tokens for `/v1/completions`.

A raw prompt is tokenised as llama-server does (the model's BOS if it wants one; special-token text
such as ``<|im_start|>`` parsed: the client writes the whole prompt, markup included), or given as
token ids. Fill in the middle (an editor's inline completion: the text before the cursor, the text
after it) uses the model's own FIM tokens, found by llama.cpp in the GGUF's vocabulary::

    <|fim_prefix|>{before}<|fim_suffix|>{after}<|fim_middle|>   → the model writes the middle

(Qwen2.5-Coder's spelling; CodeLlama, StarCoder, DeepSeek-Coder … have their own, found the same
way). A model without them gets a ``PromptError``. Code is data: the text around the gap is tokenised
without special-token parsing. When it does not fit the window, the text nearest the gap is kept: the
end of the prefix and the start of the suffix (at most a quarter of the room, as llama-server's
``/infill``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ContextFullError, PromptError
from .chat import ChatSettings, prompt_room

SUFFIX_SHARE = 4  # the suffix keeps at most 1/SUFFIX_SHARE of the room when the text must be cut


@dataclass(frozen=True)
class CompletionPrompt:
    text: str = ""  # the prompt (fill in the middle: the text before the gap)
    token_ids: tuple[int, ...] | None = None  # the prompt as token ids instead of text
    suffix: str | None = None  # fill in the middle: the text after the gap; None: a plain completion


def completion_tokens(pair, prompt: CompletionPrompt, settings: ChatSettings) -> list[int]:
    model = pair.target.model
    room = prompt_room(pair, settings)
    if prompt.suffix is not None:
        return fim_tokens(model, prompt.text, prompt.suffix, room)
    if prompt.token_ids is not None:
        tokens = list(prompt.token_ids)
        bad = [t for t in tokens if not 0 <= t < model.n_vocab]
        if bad:
            raise PromptError(
                f"token id {bad[0]} is outside this model's vocabulary (0 to {model.n_vocab - 1})."
            )
    else:
        tokens = model.tokenize(prompt.text, add_special=True, parse_special=True)
    if not tokens:
        raise PromptError("the prompt is empty: send some text (or token ids) to continue.")
    if len(tokens) > room:
        raise ContextFullError(
            f"the prompt takes {len(tokens)} tokens; {max(room, 0)} fit (window {pair.target.n_ctx}, "
            f"{settings.max_tokens} kept for the answer). Shorten it, lower max_tokens, or load the "
            "models with a larger --ctx."
        )
    return tokens


def fim_tokens(model, prefix: str, suffix: str, room: int) -> list[int]:
    """``[BOS] <fim_prefix> prefix <fim_suffix> suffix <fim_middle>``, cut to ``room`` around the gap."""
    ids = model.fim_tokens()
    if ids is None:
        raise PromptError(
            f"{_name(model)} has no fill-in-the-middle tokens, so it cannot complete between a prefix and "
            "a suffix; leave out suffix, or serve a code model trained for it (e.g. Qwen2.5-Coder)."
        )
    pre, suf, mid = ids
    start = model.tokenize("", add_special=True, parse_special=False)  # the BOS, if the model wants one
    before = model.tokenize(prefix, add_special=False, parse_special=False)
    after = model.tokenize(suffix, add_special=False, parse_special=False)
    text_room = room - len(start) - 3
    if text_room < 2:
        raise ContextFullError(
            "no room for a fill-in-the-middle prompt: lower max_tokens, or load the models with a "
            "larger --ctx."
        )
    if len(before) + len(after) > text_room:
        after = after[: max(text_room // SUFFIX_SHARE, text_room - len(before))]
        before = before[max(0, len(before) - (text_room - len(after))) :]
    return [*start, pre, *before, suf, *after, mid]


def _name(model) -> str:
    return str(model.path).replace("\\", "/").rsplit("/", 1)[-1]
