"""Text tokenised as text, whatever it holds.

llama.cpp's tokenizer matches a vocabulary's *user-defined* added tokens in any text, even with
special-token parsing off: ``tokenizer_st_partition`` (llama-vocab.cpp) skips only control and
unknown tokens then. Qwen2.5's ``<tool_call>`` and ``</tool_call>`` are user-defined, so a user's or
a tool's message that says ``<tool_call>`` would reach the model as the very token its chat template
writes before a real call. ``as_text`` tokenises such text again with each match cut after its first
character, so the characters are read as characters (``<`` then ``tool_call>``); text without a
match (nearly all) costs one look at its distinct tokens.
"""

from __future__ import annotations

import llama_cpp as C


def as_text(model, text: str, tokens: list[int], add_special: bool) -> list[int]:
    """``tokens`` (``text`` as llama.cpp tokenised it without special-token parsing), with every
    user-defined added token that the text spelled out tokenised as its characters instead."""
    added = {
        t for t in set(tokens) if C.llama_vocab_get_attr(model.vocab, t) & C.LLAMA_TOKEN_ATTR_USER_DEFINED
    }
    spelled = {model.piece(t, special=True).decode("utf-8", errors="replace") for t in added}
    cuts = sorted({at + 1 for word in spelled if len(word) > 1 for at in _occurrences(text, word)})
    if not cuts:
        return tokens  # none, or only one-character tokens, which no cut can avoid
    bounds = [0, *cuts, len(text)]
    out: list[int] = []
    for i, (start, end) in enumerate(zip(bounds, bounds[1:])):
        out += model.tokenize(text[start:end], add_special=add_special and i == 0, parse_special=False)
    return out


def _occurrences(text: str, word: str) -> list[int]:
    found, at = [], text.find(word)
    while at >= 0:
        found.append(at)
        at = text.find(word, at + 1)
    return found
