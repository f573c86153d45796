"""`edgespec bench` with the cost curves made non-decreasing, as profile version 1 made them: the
"before" of keeping the measured dips (docs/benchmarks.md, "Verify batch sizes").

    python scripts/bench_monotone_costs.py --prompts edit --strategies ngram,auto@3 \
        --max-tokens 128 --threads 2
"""

import sys

import numpy as np

from edgespec.cli import main
from edgespec.planner.costmodel import CostModel
from edgespec.profile import costs

measured_model = costs.CostProfile.model


def monotone_model(self, n_max: int = 64) -> CostModel:
    curves = measured_model(self, n_max)
    return CostModel(*(np.maximum.accumulate(c) for c in (curves.target, curves.draft, curves.catchup)))


costs.CostProfile.model = monotone_model
sys.exit(main(sys.argv[1:]))
