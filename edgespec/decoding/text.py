"""Turning token ids back into text as they stream. Pure Python, tested without a model."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class Detokenizer:
    """Incremental detokenisation that never splits a multi-byte UTF-8 character.

    Token pieces are bytes; a character may straddle two tokens (emoji, CJK). Bytes that do not yet
    form a complete character are held back until the next token completes them.
    """

    def __init__(self, piece: Callable[[int], bytes]):
        self._piece = piece
        self._held = b""

    def push(self, token: int) -> str:
        data = self._held + self._piece(token)
        cut = _complete_prefix(data)
        self._held = data[cut:]
        return data[:cut].decode("utf-8")

    def flush(self) -> str:
        """Whatever is held at the end (an incomplete character is shown as U+FFFD)."""
        data, self._held = self._held, b""
        return data.decode("utf-8", errors="replace")


def _complete_prefix(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that ends on a character boundary."""
    end = len(data)
    # Look at most 3 bytes back for the lead byte of a trailing, possibly incomplete character.
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
        return end if back >= need else end - back
    return end  # no lead byte within reach: invalid bytes, let the decoder deal with them


class StopStrings:
    """Cuts the stream at the first stop string, holding back text that might begin one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Returns the text that is safe to show now."""
        if not self.stops:
            return text
        buf = self._pending + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return buf[: min(hits)]
        hold = max((k for s in self.stops for k in range(1, len(s)) if buf.endswith(s[:k])), default=0)
        self._pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
