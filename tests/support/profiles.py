"""A pair's run-time profile as given numbers (``edgespec.planner.inputs.Profile``): what a planner's
``prepare`` asks for, without a pair to measure — ``planner.prepare(Given(costs, fit))``. ``asked``
lists what it asked for, in order ("costs", "fit")."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.planner.costmodel import CostModel, DraftFit


@dataclass(frozen=True)
class Given:
    curves: CostModel | None = None  # what ``costs()`` gives (None: a pair without a draft)
    draft_fit: DraftFit | None = None  # what ``fit()`` gives
    asked: list[str] = field(default_factory=list, compare=False)

    def costs(self) -> CostModel | None:
        self.asked.append("costs")
        return self.curves

    def fit(self) -> DraftFit | None:
        self.asked.append("fit")
        return self.draft_fit
