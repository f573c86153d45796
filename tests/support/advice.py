"""Cost curves and a draft's fit small enough to compute predictions by hand (tests of advise)."""

from __future__ import annotations

import numpy as np

from edgespec.planner.costmodel import CostModel, DraftFit

RUNS = (0.8, 0.6, 0.4, 0.3, 0.2, 0.1, 0.05, 0.0)


def costs(target=lambda n: 0.1 + 0.01 * n, draft=lambda n: 0.02, catchup=lambda n: 0.03) -> CostModel:
    return CostModel.from_functions(target, draft, catchup, overhead=0.0)


def fit(top1: float = 0.8, ratio: float = 1.0, runs=RUNS) -> DraftFit:
    return DraftFit(np.array([top1, 0.1, 0.05, 0.02, 0.01, 0.01, 0.005, 0.005]), ratio, 64, runs)
