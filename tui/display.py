"""From step events to what the chat app shows and stores: text split by provenance (and its run
lengths, saved with each answer), the rolling tokens/s, the status bar's numbers and the tree panel's
snapshot. Pure helpers for the generation worker; loading pairs and streaming replies is
``edgespec.session``'s (the chat facade the app shares with `edgespec serve`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from time import monotonic

from edgespec.decoding.events import GenerationStats, Provenance, StepEvent

from .messages import Span, StatsSnapshot, TreeSnapshot


def provenance_spans(event: StepEvent, piece: Callable[[int], str]) -> list[Span]:
    """Split a step's text by the provenance of the tokens that produced it.

    ``event.text`` is authoritative (stop strings and split UTF-8 characters are handled upstream);
    each token claims its piece where the text matches it, and any rest goes to the step's last token.
    """
    text, pos, spans = event.text, 0, []
    for token in event.tokens:
        chunk = piece(token.id)
        if chunk and text.startswith(chunk, pos):
            spans.append((chunk, token.provenance))
            pos += len(chunk)
    if pos < len(text):
        spans.append((text[pos:], event.tokens[-1].provenance if event.tokens else Provenance.TARGET))
    return _merge_runs(spans)


def _merge_runs(spans: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for text, prov in spans:
        if merged and merged[-1][1] == prov:
            merged[-1] = (merged[-1][0] + text, prov)
        else:
            merged.append((text, prov))
    return merged


class RollingRate:
    """Tokens per second over roughly the last ``window`` seconds of wall-clock time.

    The rate is measured from a baseline sample (the newest one at least ``window`` old, or the start)
    to the newest sample, so it stays meaningful when single steps take longer than the window.
    """

    def __init__(self, window: float = 2.0, clock: Callable[[], float] = monotonic):
        self.window = window
        self.clock = clock
        self.samples: deque[tuple[float, int]] = deque([(clock(), 0)])  # (time, tokens); [0] is the baseline

    def add(self, tokens: int) -> None:
        now = self.clock()
        self.samples.append((now, tokens))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()

    @property
    def rate(self) -> float:
        (start, _), (end, _) = self.samples[0], self.samples[-1]
        tokens = sum(n for _, n in list(self.samples)[1:])
        return tokens / (end - start) if end > start else 0.0


def stats_snapshot(stats: GenerationStats, rate: RollingRate, context_used: int) -> StatsSnapshot:
    return StatsSnapshot(
        tokens=stats.tokens,
        tokens_per_second=rate.rate,
        mean_accepted_length=stats.mean_accepted_length,
        acceptance_rate=stats.acceptance_rate,
        drafted=stats.drafted,
        context_used=context_used,
    )


def tree_snapshot(event: StepEvent, piece: Callable[[int], str]) -> TreeSnapshot | None:
    tree = event.tree
    if tree is None:
        return None
    bonus = event.tokens[-1] if event.tokens and event.tokens[-1].provenance is Provenance.TARGET else None
    return TreeSnapshot(
        labels=tuple(piece(int(t)) for t in tree.tokens),
        parents=tuple(int(p) for p in tree.parents),
        draft_prob=tuple(float(p) for p in tree.draft_prob),
        merged=tuple(bool(m) for m in tree.merged),
        copied=tuple(bool(c) for c in tree.copied),
        accepted=frozenset(int(n) for n in event.accepted_path),
        bonus=piece(bonus.id) if bonus is not None else "",
    )


def provenance_runs(spans: Sequence[Span]) -> list[tuple[int, str]]:
    """Spans as run lengths for storage: [(chars, 'd'|'m'|'c'|'t'), ...] (draft, merged, copied, target)."""
    return [(len(text), prov.value[0]) for text, prov in _merge_runs(list(spans)) if text]


_CODES = {p.value[0]: p for p in Provenance}


def spans_from_runs(text: str, runs: Sequence[tuple[int, str]]) -> list[Span]:
    """The inverse of ``provenance_runs`` (text past the runs counts as the target's)."""
    spans, pos = [], 0
    for length, code in runs:
        spans.append((text[pos : pos + length], _CODES.get(code, Provenance.TARGET)))
        pos += length
    if pos < len(text):
        spans.append((text[pos:], Provenance.TARGET))
    return [s for s in spans if s[0]]
