"""The bridge between the chat app and edgespec.

The app needs two small things, written down as protocols: a ``Backend`` lists pairs, loads one and
builds planners; a loaded pair is a ``ChatEngine`` that streams replies as ``StepEvent``s.
``LlamaBackend`` implements them on llama-cpp-python (model store → ``ModelPair`` → planner registry →
``stream_reply``); the tests use a fake with the same shape, so both run through the same worker and
message code. Modules that import llama_cpp are imported lazily: the app and its tests run without it.

Also here: the pure helpers the generation worker uses to turn step events into UI payloads.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from time import monotonic
from typing import Protocol

from edgespec.decoding.chat import ChatSettings, Message
from edgespec.decoding.events import GenerationStats, Provenance, StepEvent
from edgespec.planner.tree import Planner
from edgespec.strategy import CHOICES, PairDefaults, StrategyChoice, make_planner, needs_draft

from .messages import Span, StatsSnapshot, TreeSnapshot

LoadCallback = Callable[[str, int, int], None]  # (stage, done bytes, total bytes; 0 = unknown)


class ChatEngine(Protocol):
    """A loaded pair, as the chat app uses it."""

    n_ctx: int  # the context window
    has_draft: bool  # False when loaded for plain decoding only

    def piece(self, token: int) -> str:
        """A token's text (for drawing tree nodes)."""
        ...

    def context_used(self) -> int:
        """Tokens in the target's cache (prompt + answer so far)."""
        ...

    def prepare(self, planner: Planner | None, on_progress: LoadCallback) -> None:
        """Give ``planner`` what it needs from this pair before it drafts (auto, OPT-Tree: the pair's
        cost profile, measured here the first time). Runs in the generation worker."""
        ...

    def stream(
        self,
        planner: Planner | None,
        messages: Sequence[Message],
        settings: ChatSettings,
        cancel: threading.Event,
        stats: GenerationStats,
    ) -> Iterator[StepEvent]: ...

    def forget(self) -> None:
        """Empty the KV caches, so nothing cached can change the next answer (``edgespec serve``)."""
        ...

    def close(self) -> None: ...


@dataclass
class LoadedPair:
    engine: ChatEngine
    name: str  # shown in the status bar and saved with each answer
    defaults: StrategyChoice  # the pair's recommended strategy (models.toml, then CLI flags)


class Backend(Protocol):
    strategies: tuple[str, ...]  # selectable strategy names, "none" (plain decoding) first

    def pairs(self) -> list[str]:
        """Registry pairs whose models are installed (or can be assembled offline)."""
        ...

    def load(self, pair: str | None, on_progress: LoadCallback) -> LoadedPair:
        """Load ``pair`` (None: what the command line asked for, else the default pair). Runs in a thread."""
        ...

    def make_planner(self, choice: StrategyChoice) -> Planner | None: ...


# -- the real thing ---------------------------------------------------------------------------------
class PairEngine:
    """A ``ModelPair`` as a ``ChatEngine``."""

    def __init__(self, pair):
        self.pair = pair
        self.n_ctx = pair.target.n_ctx
        self.has_draft = pair.draft is not None
        self._with_costs: set[int] = set()

    def piece(self, token: int) -> str:
        return self.pair.target.model.piece(token).decode("utf-8", errors="replace")

    def context_used(self) -> int:
        return self.pair.context_used()

    def prepare(self, planner, on_progress: LoadCallback) -> None:
        from edgespec.measure.costs import attach

        if planner is not None and id(planner) not in self._with_costs:
            # auto, OPT-Tree: this pair's cost profile (measured once per pair and machine, cached)
            attach(planner, self.pair, progress=on_progress)
            self._with_costs.add(id(planner))

    def stream(self, planner, messages, settings, cancel, stats) -> Iterator[StepEvent]:
        from edgespec.decoding.chat import stream_reply

        return stream_reply(self.pair, planner, messages, settings, cancel=cancel, stats=stats)

    def forget(self) -> None:
        """Empty the KV caches (the server starts every answer from scratch)."""
        self.pair.forget()

    def close(self) -> None:
        self.pair.close()


class LlamaBackend:
    """Pairs from the registry and the model store, loaded with the command line's engine settings,
    through the same facade as the CLI (``edgespec.models.pairs``, ``edgespec.strategy``)."""

    strategies = CHOICES

    def __init__(self, args):
        self.args = args  # the parsed `edgespec chat` arguments (see edgespec.options)
        self.pair: PairDefaults | None = None  # the loaded pair's defaults (models.toml)

    def pairs(self) -> list[str]:
        from edgespec.models.pairs import available_pairs

        return available_pairs()

    def resolve(self, pair: str | None, on_progress: LoadCallback):
        """The files and the first strategy choice for ``pair`` (None: what the command line asked for)."""
        from edgespec import options
        from edgespec.models.pairs import resolve_pair

        args = self.args
        if pair is None and args.target:  # local files; without --draft: plain decoding only
            resolved = resolve_pair(None, args.target, args.draft, bool(args.draft), on_progress)
        else:
            resolved = resolve_pair(pair or args.pair, on_progress=on_progress)
        choice = options.strategy_choice(args)
        if resolved.draft_path is None and needs_draft(choice.name):
            choice = StrategyChoice("none")
        return resolved, choice

    def load(self, pair: str | None, on_progress: LoadCallback) -> LoadedPair:
        """Load ``pair`` (None: what the command line asked for, else the default pair). Runs in a thread."""
        from edgespec import options
        from edgespec.models.pairs import open_pair

        resolved, choice = self.resolve(pair, on_progress)
        on_progress(f"loading {resolved.name} into memory", 0, 0)
        engine = PairEngine(open_pair(resolved, options.engine_settings(self.args)))
        self.pair = resolved.defaults
        return LoadedPair(engine, resolved.name, choice)

    def make_planner(self, choice: StrategyChoice) -> Planner | None:
        """The planner for ``choice`` on the loaded pair (cost profiles come in ``prepare``)."""
        return make_planner(choice, self.pair or PairDefaults(""))


# -- worker-side helpers ----------------------------------------------------------------------------
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
