"""Turning token ids back into text as they stream. Pure Python, tested without a model."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class Detokenizer:
    """Incremental detokenisation that never splits a multi-byte UTF-8 character and never raises.

    Token pieces are bytes; a character may straddle two tokens (emoji, CJK): Python's incremental
    UTF-8 decoder holds the bytes of an incomplete character until the next token completes them, and
    writes U+FFFD for bytes no character can begin with (a model may emit any token sequence: a lone
    continuation byte, an overlong or surrogate encoding).
    """

    def __init__(self, piece: Callable[[int], bytes]):
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._piece(token))

    def flush(self) -> str:
        """Whatever is held at the end (an incomplete character is shown as U+FFFD)."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text


class _StopMatcher:
    """Knuth–Morris–Pratt over the stream for one stop string: ``state`` is the length of the longest
    prefix of ``stop`` that the text fed so far ends with. Each character moves the state forward by
    one or falls back along ``fail``; the fallbacks never outnumber the forward moves, so the cost is
    linear in the text fed, whatever the stop string's length."""

    def __init__(self, stop: str):
        self.stop = stop
        # fail[k]: the longest proper prefix of stop[:k+1] that is also its suffix
        self.fail = [0] * len(stop)
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = self.fail[k - 1]
            if stop[i] == stop[k]:
                k += 1
            self.fail[i] = k
        self.state = 0

    def feed(self, text: str) -> int:
        """Where in ``text`` the first whole stop string ends (just past it), or -1."""
        stop, fail, k = self.stop, self.fail, self.state
        for i, char in enumerate(text):
            while k and stop[k] != char:
                k = fail[k - 1]
            if stop[k] == char:
                k += 1
                if k == len(stop):
                    self.state = k
                    return i + 1
        self.state = k
        return -1


class StopStrings:
    """Cuts the stream at the first stop string, holding back text that might begin one.

    Linear in the text added: each stop string's matcher reads only the new text, and what is held
    back is at most the longest stop string less one character (``limits``: how long that may be)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._matchers = [_StopMatcher(s) for s in self.stops]
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Returns the text that is safe to show now."""
        if not self.stops or self.stopped:
            return "" if self.stopped else text
        buf = self._pending + text
        # a match ending at end_in_text began len(stop) characters earlier in buf (pending ⊂ buf)
        starts = [
            len(self._pending) + end - len(m.stop) for m in self._matchers if (end := m.feed(text)) >= 0
        ]
        if starts:
            self.stopped = True
            self._pending = ""
            return buf[: min(starts)]
        hold = max(m.state for m in self._matchers)  # the longest tail that may still begin a stop
        self._pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
