"""The one way a planner gets this pair's profile: ``attach`` calls ``Planner.prepare`` with a
``PairProfile``, which gives the pair's cost curves (``costs.py``) and the draft's fit (``fit.py``) on
first ask — loaded from the cache, or measured (and cached) the first time. A planner that asks for
nothing costs nothing."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from ..planner.costmodel import CostModel, DraftFit
from ..planner.tree import Planner
from ..progress import Progress, progress_bar
from .costs import CostProfile, load_or_measure
from .fit import load_fit, measure_and_save_fit

MEASURING = "measuring this pair (once; cached)"
P = TypeVar("P", bound="Planner | None")


class PairProfile:
    """A loaded pair's run-time profile (``edgespec.planner.tree.Profile``), each part loaded or measured
    on first ask and kept for the next planner. Without a draft there is nothing to measure: both are
    None. Measuring reports to ``progress``, or with ``show_progress`` to a bar on stderr (``label``),
    opened on the first measurement and closed by ``close`` (or the ``with`` block's end).

    ``refresh``: measure the cost curves again even when cached; ``quick``: on the quick sizes (what a
    planner needs), else on every size (``edgespec bench --profile``)."""

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
    ):
        self.pair, self.home, self.refresh, self.quick = pair, home, refresh, quick
        self._given, self._show, self._label = progress, show_progress, label
        self._progress: Progress | None = None
        self._stack = ExitStack()
        self._asked: set[str] = set()  # the parts loaded or measured so far: "costs", "fit"
        self._profile: CostProfile | None = None
        self._fit: DraftFit | None = None

    # -- what planners ask for (``Profile``) -----------------------------------------------------------
    def costs(self) -> CostModel | None:
        profile = self.cost_profile()
        if profile is None:
            return None
        ahead = self.pair.target.remote  # on RPC servers: the draft looks ahead while the target verifies
        return replace(profile.model(self.pair.max_nodes - 1), look_ahead=ahead)

    def fit(self) -> DraftFit | None:
        if "fit" not in self._asked and self.pair.draft is not None:
            self._fit = load_fit(self.pair, self.home) or measure_and_save_fit(
                self.pair, self._report, self.home
            )
        self._asked.add("fit")
        return self._fit

    # -- what the bench shows ------------------------------------------------------------------------
    def cost_profile(self) -> CostProfile | None:
        """The measured table the curves come from (None without a draft), loaded or measured now."""
        if "costs" not in self._asked and self.pair.draft is not None:
            self._profile = load_or_measure(
                self.pair, refresh=self.refresh, quick=self.quick, progress=self._report, home=self.home
            )
        self._asked.add("costs")
        return self._profile

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
