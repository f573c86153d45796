"""The target's sampling rule for a request, and the draw from a distribution.

The reductions from logits to probabilities run in the engine, right after each decode: the target's
argmax, margin and sampling distribution p through ``ports.Verified`` (``engine.rows``), the draft's
top-K candidates as it decodes (``engine.rows.draft_dists``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 → greedy: every emitted token is the target's argmax
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw from a dense distribution."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), probs.shape[0] - 1))
