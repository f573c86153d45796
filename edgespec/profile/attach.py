"""The one way a planner gets this pair's profile: ``attach`` calls ``Planner.prepare`` with a
``PairProfile``, which gives the pair's cost curves (``costs.py``) and the draft's fit (``fit.py``) on
first ask — loaded from the cache, or measured (and cached) the first time. A planner that asks for
nothing costs nothing.

The chat and the server never wait for it: their ``PairProfile(..., measure=False)`` gives what is
cached (None before: auto decodes plainly or copies), and ``measure_idle`` measures between answers,
a piece at a time, until both parts are complete and cached."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from ..planner.base import Planner
from ..planner.costmodel import CostModel, DraftFit
from ..progress import Progress, progress_bar
from .costs import (
    QUICK_CATCHUP_SIZES,
    QUICK_REPEATS,
    QUICK_SIZES,
    CostMeasurement,
    CostProfile,
    keep,
    load_cached,
    load_or_measure,
)
from .fit import FitMeasurement, load_fit, measure_and_save_fit, save_fit

MEASURING = "measuring this pair (once; cached)"
P = TypeVar("P", bound="Planner | None")


class PairProfile:
    """A loaded pair's run-time profile (``edgespec.planner.inputs.Profile``), each part loaded or measured
    on first ask and kept for the next planner. Without a draft there is nothing to measure: both are
    None. Measuring reports to ``progress``, or with ``show_progress`` to a bar on stderr (``label``),
    opened on the first measurement and closed by ``close`` (or the ``with`` block's end).

    ``refresh``: measure the cost curves again even when cached; ``quick``: on the quick sizes (what a
    planner needs), else on every size (``edgespec bench --profile``); ``measure`` False: never measure
    when asked (what is not cached is None) — ``measure_idle`` does it, in pieces."""

    def __init__(
        self,
        pair,
        progress: Progress | None = None,
        show_progress: bool = False,
        home: Path | None = None,
        *,
        refresh: bool = False,
        quick: bool = True,
        label: str = MEASURING,
        measure: bool = True,
    ):
        self.pair, self.home, self.refresh, self.quick, self.measure = pair, home, refresh, quick, measure
        self._given, self._show, self._label = progress, show_progress, label
        self._progress: Progress | None = None
        self._stack = ExitStack()
        self._asked: set[str] = set()  # the parts loaded or measured so far: "costs", "fit"
        self._profile: CostProfile | None = None
        self._fit: DraftFit | None = None
        self._left: tuple[CostMeasurement, FitMeasurement] | None = None  # ``measure_idle``'s pieces

    # -- what planners ask for (``Profile``) -----------------------------------------------------------
    def costs(self) -> CostModel | None:
        profile = self.cost_profile()
        if profile is None:
            return None
        ahead = self.pair.target.remote  # on RPC servers: the draft looks ahead while the target verifies
        return replace(profile.model(self.pair.max_nodes - 1), look_ahead=ahead)

    def fit(self) -> DraftFit | None:
        if "fit" not in self._asked and self.pair.draft is not None:
            self._fit = load_fit(self.pair, self.home)
            if self._fit is None and self.measure:
                self._fit = measure_and_save_fit(self.pair, self._report, self.home)
        if self._fit is not None or self.measure:  # else not cached yet: asked again next time
            self._asked.add("fit")
        return self._fit

    # -- what the bench shows ------------------------------------------------------------------------
    def cost_profile(self) -> CostProfile | None:
        """The measured table the curves come from (None without a draft), loaded or measured now."""
        if "costs" not in self._asked and self.pair.draft is not None:
            if self.measure:
                self._profile = load_or_measure(
                    self.pair, refresh=self.refresh, quick=self.quick, progress=self._report, home=self.home
                )
            else:
                self._profile = load_cached(self.pair, self.home)
        if self._profile is not None or self.measure:  # else not cached yet: asked again next time
            self._asked.add("costs")
        return self._profile

    # -- measuring between answers -------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        """Both parts are here (or there is no draft: nothing to measure)."""
        if self.pair.draft is None:
            return True
        self.cost_profile(), self.fit()  # loaded from the cache if there (another process measured)
        return {"costs", "fit"} <= self._asked

    def measure_idle(self, stop: Callable[[], bool], progress: Progress | None = None) -> bool:
        """Measure what is missing (the quick cost curves, then the fit) piece by piece until complete
        (True) or ``stop()`` (False), asked between pieces (each well under a second on the bundled
        pair). What is measured stays here for the next call; a part is cached once complete. Leaves
        both caches holding the measurement's tokens: the caller empties them (``ModelPair.forget``)."""
        if self.complete:
            return True
        if self._left is None:
            costs = CostMeasurement(self.pair, QUICK_SIZES, QUICK_CATCHUP_SIZES, QUICK_REPEATS)
            self._left = costs, FitMeasurement(self.pair)
        costs, fit = self._left
        measures_costs = costs.done > 0 or "costs" not in self._asked  # not when it was cached
        total = costs.total * measures_costs + fit.total
        before = total - fit.total  # the cost pieces, ahead of the fit's
        if progress is not None:  # where it goes on from, before the first piece (the chat shows it)
            progress("measuring", costs.done if "costs" not in self._asked else before + fit.done, total)
        if "costs" not in self._asked:
            report = None if progress is None else lambda what, done, _: progress(what, done, total)
            if not costs.run(stop, report):
                return False
            self._profile = keep(costs.result(), self.home)
            self._asked.add("costs")
        if "fit" not in self._asked:
            report = None if progress is None else lambda what, done, _: progress(what, before + done, total)
            if not fit.run(stop, report):
                return False
            self._fit = fit.result()  # None: the target answered nothing; auto keeps its prior
            if self._fit is not None:
                save_fit(self.pair, self._fit, self.home)
            self._asked.add("fit")
        return True

    @property
    def asked(self) -> CostProfile | None:
        """The cost profile if a planner (or ``cost_profile``) asked for it, else None: nothing measured."""
        return self._profile

    # -- measuring's display --------------------------------------------------------------------------
    def _report(self, what: str, done: int, total: int) -> None:
        """Where measuring reports: the caller's display (saying which work this is), or a bar of its own
        opened on the first report."""
        if self._progress is None:
            if self._given is not None:
                given = self._given
                self._progress = lambda what, done, total: given(
                    f"measuring this pair (once): {what}", done, total
                )
            elif self._show:
                self._progress = self._stack.enter_context(progress_bar(self._label))
            else:
                self._progress = _silent
        self._progress(what, done, total)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> PairProfile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _silent(what: str, done: int, total: int) -> None:
    pass


def attach(
    planner: P,
    pair,
    progress: Progress | None = None,
    show_progress: bool = False,
    home: Path | None = None,
) -> P:
    """Let ``planner`` ask this pair's profile for what it needs (``Planner.prepare``) and return it:
    ``pair`` a loaded pair (a ``PairProfile`` over it for this call: ``progress``, ``show_progress``,
    ``home`` are its), or a ``PairProfile`` that several planners share. None (plain decoding) asks for
    nothing."""
    if planner is None:
        return planner
    if isinstance(pair, PairProfile):
        planner.prepare(pair)
        return planner
    with PairProfile(pair, progress, show_progress, home) as profile:
        planner.prepare(profile)
    return planner
