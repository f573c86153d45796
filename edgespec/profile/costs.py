"""Cost profile of a loaded pair: seconds per decode as a function of batch size, on this machine.

What ``auto`` needs to decide whether (and how much) to speculate: ``target``, the target verifying a
tree of n tokens (root included, every row output; n = 1 is plain decoding); ``draft``, one draft level
of n nodes (one batched decode and the top-k of its rows: ``Draft.expand``); ``catchup``, the draft
decoding n committed tokens in a row (what it pays after plain steps).

Measured through the engine's public API only (``Target.start_verify`` of chain trees, ``Draft.expand`` of
one level, ``decode_committed``), rolled back with ``sync``. A subset of sizes is measured with
repeats, sizes interleaved (forwards, then backwards) so that drift spreads evenly; the median of
the repeats is kept and the rest of 1…64 is interpolated. Every size up to 33 (a 32-node tree and its
root) is measured: the curves are not smooth. On a CPU, llama.cpp's repacked Q4_K weights multiply
4 rows at a time and each leftover row streams the weights again, the draft's Q5_0/Q8_0 take
llamafile's tiles: on the 2-core EPYC verifying 16 tokens cost 7.1 decodes, 15 tokens 10.0 and 17
8.4. The planners that size trees by the curves (``best_size``) pick such sizes if the profile shows them.
Cached as JSON in ``<data home>/profiles/`` keyed by the model files (sha256 from the store's record,
else size and mtime), the offload, threads, repacking, tiled matmul, flash attention, the build (version
and compiled features), the CPU (name and flags) and, for a target over RPC, its servers and split;
``attach`` gives it to planners."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from time import perf_counter

import numpy as np

from ..planner.costmodel import CostModel
from ..planner.tree import TreeBuilder, chain_tree
from ..progress import Progress
from .store import cpu_model, file_key, llama_version, profile_path, write_json

PROFILE_VERSION = 3  # 3: over RPC every target size warmed first; 2: every size up to 33, dips kept
SIZES = (*range(1, 34), 40, 48, 56, 64)  # target verify and draft level sizes
CATCHUP_SIZES = (1, 2, 4, 8, 16, 32, 64)
QUICK_SIZES = (*range(1, 34), 48, 64)
QUICK_CATCHUP_SIZES = (1, 2, 4, 8, 16, 64)
# The draft's repeats of a size (always local, unlike an RPC target's) agree within a few % on a quiet
# machine (1.00-1.06 at the median size); far more means other work shared the cores: 2 threads beside
# another llama.cpp process made every decode ~25x slower and the curves noise (1.48 at the median).
BUSY_SPREAD = 1.25
CONTEXT_TOKENS = 160  # committed tokens the measurements run on (a typical prompt plus some answer)
CONTEXT_CHUNK = 32  # of them decoded at a time before measuring (a stop waits for one chunk at most)
QUICK_REPEATS = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CostProfile:
    """Median seconds by batch size; ``model()`` turns it into the curves ``auto`` uses."""

    target: dict[int, float]  # verify of n tokens → seconds
    draft: dict[int, float]  # one draft level of n nodes → seconds
    catchup: dict[int, float]  # the draft decoding n committed tokens in a row → seconds
    key: dict = field(default_factory=dict)  # what it was measured for (see ``profile_key``)
    repeats: int = 0
    created: str = ""
    spread: dict = field(default_factory=dict)  # curve → {n: (min, max)} of the repeats

    def model(self, n_max: int = 64) -> CostModel:
        """Curves for n = 1…n_max, as measured: a dip is kept (more tokens can cost less, see above)."""
        return CostModel(
            target=_interpolate(self.target, n_max),
            draft=_interpolate(self.draft, n_max),
            catchup=_interpolate(self.catchup, n_max),
        )

    @property
    def busy(self) -> float | None:
        """The draft's median max/min over its repeats, when above ``BUSY_SPREAD`` (the machine was
        busy: the curves are not this pair's); None when they agree."""
        spread = sorted(hi / lo for lo, hi in self.spread.get("draft", {}).values() if lo > 0)
        ratio = spread[len(spread) // 2] if spread else 1.0
        return ratio if ratio > BUSY_SPREAD else None

    def rows(self) -> list[dict]:
        """One row per measured size: seconds, and each curve relative to one token (its c(n)/c(1))."""
        sizes = sorted(set(self.target) | set(self.draft) | set(self.catchup))
        t1, d1, k1 = self.target.get(1), self.draft.get(1), self.catchup.get(1)
        out = []
        for n in sizes:
            t, d, k = self.target.get(n), self.draft.get(n), self.catchup.get(n)
            rel = {
                f"{c}_rel": v / one if v and one else None
                for c, v, one in (("target", t, t1), ("draft", d, d1), ("catchup", k, k1))
            }
            out.append({"n": n, "target": t, "draft": d, "catchup": k, **rel})
        return out

    def as_dict(self) -> dict:
        return {
            "version": PROFILE_VERSION,
            "created": self.created,
            "repeats": self.repeats,
            "key": self.key,
            "target": {str(n): s for n, s in sorted(self.target.items())},
            "draft": {str(n): s for n, s in sorted(self.draft.items())},
            "catchup": {str(n): s for n, s in sorted(self.catchup.items())},
            "spread": {
                curve: {str(n): list(v) for n, v in sorted(values.items())}
                for curve, values in self.spread.items()
            },
        }

    @classmethod
    def from_dict(cls, data: dict) -> CostProfile:
        if data.get("version") != PROFILE_VERSION:
            raise ValueError(f"cost profile version {data.get('version')!r}, expected {PROFILE_VERSION}")

        def curve(name: str) -> dict[int, float]:
            return {int(n): float(s) for n, s in data[name].items()}

        return cls(
            target=curve("target"),
            draft=curve("draft"),
            catchup=curve("catchup"),
            key=dict(data.get("key", {})),
            repeats=int(data.get("repeats", 0)),
            created=str(data.get("created", "")),
            spread={
                c: {int(n): tuple(v) for n, v in values.items()}
                for c, values in data.get("spread", {}).items()
            },
        )


def _interpolate(points: dict[int, float], n_max: int) -> np.ndarray:
    """Seconds for n = 1…n_max: linear between measured sizes, linear extrapolation past the last."""
    sizes = np.asarray(sorted(points), dtype=np.float64)
    values = np.asarray([points[int(n)] for n in sizes], dtype=np.float64)
    n = np.arange(1, n_max + 1, dtype=np.float64)
    out = np.interp(n, sizes, values)
    if sizes.shape[0] >= 2 and n_max > sizes[-1]:
        slope = max((values[-1] - values[-2]) / (sizes[-1] - sizes[-2]), 0.0)
        past = n > sizes[-1]
        out[past] = values[-1] + slope * (n[past] - sizes[-1])
    return out


# -- the cache ---------------------------------------------------------------------------------
def profile_key(pair) -> dict:
    """What the costs depend on: model files, offload, threads, repacking, tiled matmul, flash attention,
    the build (its version and the CPU features compiled in), the CPU (virtual machines often name only
    the vendor: its flags tell an AVX2 EPYC from an AVX-512 one), and the RPC servers holding the target
    (only when there are some)."""
    from ..engine import system_info, tiled_matmul
    from ..engine.probe import cpu_identity

    settings = pair.settings
    threads = settings.threads or os.cpu_count() or 1
    key = {
        "target": file_key(pair.target),
        "draft": file_key(pair.draft) if pair.draft is not None else None,
        "target_gpu_layers": settings.target_gpu_layers,
        "draft_gpu_layers": settings.draft_gpu_layers,
        "threads": threads,
        "repack": settings.repack,
        "tiled_matmul": tiled_matmul(),
        "flash_attn": settings.context(settings.target_on_cpu).flash_attn,
        "llama_cpp_python": llama_version(),
        "build": system_info(),
        "cpu": cpu_model(),
        "cpu_identity": hashlib.sha256(cpu_identity().encode()).hexdigest()[:16],
    }
    if settings.rpc:  # the target over RPC: its servers (and the split) are the machine
        key["rpc"] = {"servers": list(settings.rpc), "tensor_split": list(settings.tensor_split)}
    return key


def load_cached(pair, home: Path | None = None) -> CostProfile | None:
    path = profile_path(profile_key(pair), home)
    try:
        profile = CostProfile.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        return None
    return None if profile.busy else profile  # measured beside other work (by an older edgespec)


def save(profile: CostProfile, home: Path | None = None) -> Path:
    return write_json(profile_path(profile.key, home), profile.as_dict())


def load_or_measure(
    pair,
    refresh: bool = False,
    quick: bool = False,
    progress: Progress | None = None,
    home: Path | None = None,
) -> CostProfile:
    """The cached profile of this pair on this machine, measured (and cached) when missing or asked."""
    if not refresh:
        cached = load_cached(pair, home)
        if cached is not None:
            return cached
    if quick:
        profile = measure(pair, QUICK_SIZES, QUICK_CATCHUP_SIZES, repeats=QUICK_REPEATS, progress=progress)
    else:
        profile = measure(pair, progress=progress)
    return keep(profile, home)


def keep(profile: CostProfile, home: Path | None = None) -> CostProfile:
    """Save a complete ``profile``, unless its repeats say the machine was busy (then it is used for now,
    and measured again next time)."""
    if profile.busy:
        log.warning(
            "the cost profile's repeats disagree (x%.1f): other work was running. It is used for now "
            "but not saved; stop the other work for the next start to measure it again.",
            profile.busy,
        )
    else:
        save(profile, home)
    return profile


# -- measuring ------------------------------------------------------------------------------------------
def context_tokens(n_vocab: int, length: int = CONTEXT_TOKENS) -> list[int]:
    """Fixed, arbitrary token ids (costs do not depend on which tokens they are)."""
    return [(1009 + 7919 * i) % max(n_vocab - 1, 1) + 1 for i in range(length)]


def time_target(pair, base: list[int], n: int) -> float:
    target = pair.target
    target.sync(base[:-1])
    filler = context_tokens(target.model.n_vocab, n + 7)[7:]
    tree = chain_tree([base[-1], *filler[: n - 1]])
    start = perf_counter()
    target.start_verify(tree).result()
    return perf_counter() - start


def _time_draft_level(pair, base: list[int], n: int) -> float:
    draft = pair.draft
    draft.sync(base)
    draft.begin_step(1.0)
    tree = TreeBuilder(base[-1])
    draft.expand(tree, [0])  # the root (and nothing else pending): not timed
    children = [tree.add(0, t, 1.0) for t in context_tokens(draft.model.n_vocab, n + 3)[3:]]
    start = perf_counter()
    draft.expand(tree, children)
    elapsed = perf_counter() - start
    draft.begin_step(1.0)
    draft.sync(base)  # drop the level's cells again
    return elapsed


def _time_catchup(pair, base: list[int], n: int) -> float:
    draft = pair.draft
    keep = base[: len(base) - n]
    draft.sync(keep + [base[len(base) - n]])  # holds base[:-n]
    start = perf_counter()
    draft.decode_committed(base[len(base) - n :], want_last=True)
    return perf_counter() - start


def measure(
    pair,
    sizes: Sequence[int] = SIZES,
    catchup_sizes: Sequence[int] = CATCHUP_SIZES,
    repeats: int = 3,
    progress: Progress | None = None,
) -> CostProfile:
    """Measure the three curves at once (needs a draft). Leaves both caches holding the measurement
    context."""
    measurement = CostMeasurement(pair, sizes, catchup_sizes, repeats)
    measurement.run(progress=progress)
    return measurement.result()


def _never() -> bool:
    return False


class CostMeasurement:
    """The measurement in pieces, each one timed sample pair (well under a second on the bundled pair):
    ``run`` goes on from where the last one stopped, until ``stop()`` says so between pieces or every
    piece is done. Partial results stay here, in memory; ``result`` is the profile once complete.

    Every sample of size n is taken right after a sample of size 1 of the same curve, and the curve
    is c(1) × median of the ratios c(n)/c(1): a machine that slows down or speeds up while measuring
    (other processes) shifts both samples of a pair alike, so the shape survives background load.
    """

    def __init__(
        self,
        pair,
        sizes: Sequence[int] = SIZES,
        catchup_sizes: Sequence[int] = CATCHUP_SIZES,
        repeats: int = 3,
    ):
        if pair.draft is None:
            raise ValueError("a cost profile needs the draft model too")
        self.pair, self.repeats = pair, repeats
        limit = min(pair.max_nodes - 1, pair.target.ctx.settings.n_batch)
        sizes = [n for n in sizes if n <= limit]
        catchup_sizes = [n for n in catchup_sizes if n < CONTEXT_TOKENS]
        self.base = context_tokens(min(pair.target.model.n_vocab, pair.draft.model.n_vocab))
        plan = (
            [("target", n) for n in sizes]
            + [("draft", n) for n in sizes]
            + [("catchup", n) for n in catchup_sizes]
        )
        # Pass 0 decodes each size once before any is timed: the first decode of a batch size pays
        # one-offs (repacked weights, buffers). Over RPC that is every target size: each new shape makes
        # llama.cpp ask every server the allocation size of the graph's new tensors, a round trip each
        # (measured: +0.5 s at 20 ms one way, +1.4 s at 50 ms; median of two repeats, one of them paying
        # it, was up to 2.4x the cost of 9–64 tokens). Then the plan forwards, backwards, … (drift
        # spreads evenly over the sizes).
        remote = pair.target.remote
        warmup = [(curve, n) for curve, n in plan if n <= 8 or (remote and curve == "target")]
        self.pieces = [(0, curve, n) for curve, n in warmup] + [
            (rep, curve, n) for rep in range(1, repeats + 1) for curve, n in (plan if rep % 2 else plan[::-1])
        ]
        self.done = 0  # pieces measured so far
        self.ones: dict[str, list[float]] = {curve: [] for curve in TIMERS}
        self.ratios: dict[str, dict[int, list[float]]] = {curve: {} for curve in TIMERS}
        self.samples: dict[str, dict[int, list[float]]] = {curve: {} for curve in TIMERS}

    @property
    def total(self) -> int:
        return len(self.pieces)

    @property
    def complete(self) -> bool:
        return self.done == self.total

    def run(self, stop: Callable[[], bool] = _never, progress: Progress | None = None) -> bool:
        """Measure pieces until every one is done (True) or ``stop()`` (False), checked before each
        piece and each chunk of the measurement context. Either way both caches are left holding that
        context (or a prefix of it): committed tokens only, nothing speculative."""
        if not self._hold_context(stop):
            return False
        while not self.complete:
            if stop():
                break
            rep, curve, n = self.pieces[self.done]
            timer = TIMERS[curve]
            one = timer(self.pair, self.base, 1)
            seconds = one if n == 1 else timer(self.pair, self.base, n)
            if rep:  # pass 0 warms up and is dropped
                self.ones[curve].append(one)
                self.ratios[curve].setdefault(n, []).append(seconds / one)
                self.samples[curve].setdefault(n, []).append(seconds)
            self.done += 1
            if progress is not None:
                progress(f"{curve} n={n}", self.done, self.total)
        self.pair.target.sync(self.base[:-1])
        self.pair.draft.sync(self.base)
        return self.complete

    def _hold_context(self, stop: Callable[[], bool]) -> bool:
        """Both caches hold the measurement context, decoded ``CONTEXT_CHUNK`` tokens at a time (the
        whole context at once takes about a second on 2 cores); False when stopped on the way."""
        for end in range(CONTEXT_CHUNK, len(self.base) + CONTEXT_CHUNK, CONTEXT_CHUNK):
            if stop():
                return False
            self.pair.target.sync(self.base[: min(end, len(self.base) - 1)])
            self.pair.draft.sync(self.base[:end])
        return True

    def result(self) -> CostProfile:
        """The profile (every piece measured)."""
        if not self.complete:
            raise ValueError(f"the cost profile is measured {self.done}/{self.total}: not complete")

        def curve_of(curve: str) -> dict[int, float]:
            one = median(self.ones[curve])
            return {n: one * median(r) for n, r in sorted(self.ratios[curve].items())}

        return CostProfile(
            target=curve_of("target"),
            draft=curve_of("draft"),
            catchup=curve_of("catchup"),
            key=profile_key(self.pair),
            repeats=self.repeats,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            spread={c: {n: (min(v), max(v)) for n, v in sorted(s.items())} for c, s in self.samples.items()},
        )


TIMERS = {"target": time_target, "draft": _time_draft_level, "catchup": _time_catchup}
