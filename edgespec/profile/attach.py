"""The one way a planner gets this pair's profile: its cost curves (``costs.py``) and, if it asks, the
draft's fit (``fit.py``), loaded from the cache or measured the first time."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from ..progress import Progress, progress_bar
from .costs import load_cached, load_or_measure
from .fit import load_fit, measure_and_save_fit


def attach(
    planner, pair, progress: Progress | None = None, show_progress: bool = False, home: Path | None = None
) -> None:
    """Give a planner this pair's cost profile if it ``wants_costs`` and its fit if it ``wants_fit``,
    measuring what is missing (``show_progress``: a bar on stderr)."""
    if not planner.wants_costs or pair.draft is None:
        return
    cached, fit = load_cached(pair, home), load_fit(pair, home) if planner.wants_fit else None
    with ExitStack() as stack:
        if (cached is None or (planner.wants_fit and fit is None)) and show_progress and progress is None:
            progress = stack.enter_context(progress_bar("measuring this pair (once; cached)"))
        elif progress is not None:  # the caller's display: say which work this is
            shown = progress
            progress = lambda what, done, total: shown(f"measuring this pair (once): {what}", done, total)  # noqa: E731
        cached = cached or load_or_measure(pair, quick=True, progress=progress, home=home)
        ahead = pair.target.remote  # on RPC servers: the draft looks ahead meanwhile
        planner.use_costs(replace(cached.model(pair.max_nodes - 1), look_ahead=ahead))
        if planner.wants_fit and (fit := fit or measure_and_save_fit(pair, progress, home)):
            planner.use_fit(fit)
