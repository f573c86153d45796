"""``auto``'s copy steps: when the conversation's continuations alone are verified, and how such steps
have done.

A copy tree takes no draft time, so its rate is (1 + r_c · Σ p̂) / c_t(n + 1) for its best size n
(``best_size``); it is verified alone when that beats plain decoding and the draft's forecast. Per
copy the acceptance estimates are the copier's learned rates (``ngram.Copier``), but a mid-length
match whose first copy fails takes its whole tree with it; r_c, the copy steps' own accepted ÷
predicted, corrects for that: prior 1 worth ``PRIOR`` predicted tokens, every step fading the
evidence towards the prior (so copying is tried again), copy steps adding theirs.

Most steps of free prose have some match and no copy worth verifying: a bound decides those without
sizing the tree — every copy, verified at the cheapest batch of two or more tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .costmodel import CostModel, best_size
from .ngram import CopyTrie

PRIOR = 8.0  # r_c's prior (1) counts as this many predicted copied tokens
FADE = 0.97  # per step: the copy steps' evidence fades towards the prior
RATIO_MAX = 1.25  # r_c may correct the estimates upwards this far at most


@dataclass
class CopySteps:
    accepted: float = PRIOR  # decayed Σ accepted draft tokens of copy steps
    predicted: float = PRIOR  # decayed Σ p̂ of their trees
    _costs: CostModel | None = field(default=None, repr=False)
    _cheapest_batch: float = field(default=0.0, repr=False)  # min c_t(n ≥ 2) + overhead (the bound)

    @property
    def ratio(self) -> float:
        """r_c: the copy steps' accepted ÷ predicted (prior 1)."""
        return min(self.accepted / self.predicted, RATIO_MAX)

    def use_costs(self, costs: CostModel, budget: int) -> None:
        """The curves auto decides with (its learned factors applied); trees of at most ``budget``."""
        self._costs = costs
        # the cheapest verify of 2 … budget + 1 tokens (the curve is not monotone), with overhead
        self._cheapest_batch = float(costs.t(np.arange(2, budget + 2)).min()) + costs.overhead

    def alone(self, trie: CopyTrie, cap: int, rival: float) -> int:
        """How many copies to verify alone (the top by p̂): the best size when its rate beats ``rival``
        (tokens per second), else 0."""
        if self._costs is None or trie.size == 1:
            return 0
        r_copy = self.ratio
        if (1.0 + r_copy * float(trie.phat[1:].sum())) / self._cheapest_batch <= rival:
            return 0  # the bound: even every copy at the cheapest batch does not beat the rival
        pool = np.sort(trie.phat[1:])[::-1]
        copies = best_size(0.0, 0, pool, 0.0, r_copy, self._costs, cap)
        return copies.m if copies.rate > rival else 0

    def observe(self, event, copied: bool) -> None:
        """Every step: r_c's fading, and a copy step's outcome."""
        self.accepted = FADE * self.accepted + (1 - FADE) * PRIOR
        self.predicted = FADE * self.predicted + (1 - FADE) * PRIOR
        if copied:
            self.accepted += event.accepted
            self.predicted += event.expected_accept
