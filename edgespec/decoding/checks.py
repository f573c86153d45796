"""The one validation of generation settings: the CLI's flags, the chat app's settings dialog and the
server's request fields all pass through these checks and get the same messages.

Each check raises ``SettingError`` (an ``EdgespecError``) naming the setting, its range and the value
it got; ``check_text`` refuses text that cannot reach the tokenizer intact.
"""

from __future__ import annotations

import math

from ..errors import EdgespecError

TEMPERATURE_MAX = 2.0  # OpenAI's range: 0 (greedy) to 2
MAX_TOKENS_MAX = 1_000_000
TOP_K_MAX = 1_000_000
SEED_MAX = 2**64 - 1  # numpy's generators take any non-negative integer; llama.cpp's seeds are 64-bit
# Stop strings: OpenAI takes 4; clients send a few short ones ("\n\n", "```", "</s>"). Matching is
# linear in the text and holds back up to the longest one, so both are bounded, far above any use.
MAX_STOPS = 16
MAX_STOP_CHARS = 4096


class SettingError(EdgespecError, ValueError):
    """A generation setting out of its range; ``name`` is the setting (a request field's name)."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


def _shown(value) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(name: str, value, kind: type) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingError(name, f"{name} must be a number, not {_shown(value)}.")
    if kind is int and not isinstance(value, int):
        raise SettingError(name, f"{name} must be a whole number, not {_shown(value)}.")
    if isinstance(value, float) and not math.isfinite(value):
        raise SettingError(name, f"{name} must be a finite number, not {_shown(value)}.")


def check_temperature(value) -> None:
    _number("temperature", value, float)
    if not 0 <= value <= TEMPERATURE_MAX:
        raise SettingError(
            "temperature", f"temperature must be from 0 (greedy) to {TEMPERATURE_MAX:g}, not {value}."
        )


def check_top_p(value) -> None:
    _number("top_p", value, float)
    if not 0 < value <= 1:
        raise SettingError("top_p", f"top_p must be above 0 and at most 1 (1 turns it off), not {value}.")


def check_top_k(value) -> None:
    _number("top_k", value, int)
    if not 0 <= value <= TOP_K_MAX:
        raise SettingError("top_k", f"top_k must be from 0 (off) to {TOP_K_MAX}, not {value}.")


def check_seed(value) -> None:
    if value is None:
        return
    _number("seed", value, int)
    if not 0 <= value <= SEED_MAX:
        raise SettingError("seed", f"seed must be from 0 to 2**64 - 1, not {value}.")


def check_max_tokens(value) -> None:
    _number("max_tokens", value, int)
    if not 1 <= value <= MAX_TOKENS_MAX:
        raise SettingError("max_tokens", f"max_tokens must be from 1 to {MAX_TOKENS_MAX}, not {value}.")


def check_sampling(temperature, top_p, top_k, seed) -> None:
    check_temperature(temperature)
    check_top_p(top_p)
    check_top_k(top_k)
    check_seed(seed)


def check_text(text: str, what: str) -> None:
    """Text must be valid Unicode (no lone surrogates: they cannot be encoded as UTF-8). NUL characters
    are kept: message text never passes through C strings."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SettingError(
            what,
            f"{what} is not valid Unicode (a lone surrogate {text[exc.start]!a} at character {exc.start}); "
            "send UTF-8 text.",
        ) from None


def check_stops(stops, what: str = "stop") -> None:
    """At most ``MAX_STOPS`` stop strings, each non-empty valid text of at most ``MAX_STOP_CHARS``."""
    if len(stops) > MAX_STOPS:
        raise SettingError(what, f"{what} holds {len(stops)} strings; at most {MAX_STOPS} are taken.")
    for i, text in enumerate(stops):
        where = f"{what}[{i}]" if what == "stop" else what
        if not isinstance(text, str) or not text:
            raise SettingError(what, f"{where} must be a non-empty string.")
        if len(text) > MAX_STOP_CHARS:
            raise SettingError(
                what,
                f"{where} is {len(text)} characters long; a stop string may have at most {MAX_STOP_CHARS}.",
            )
        check_text(text, where)
