"""``auto``'s copy steps: when the conversation's continuations alone are verified, and how such steps
have done.

A copy tree takes no draft time, so its rate is (1 + r_c · Σ p̂) / c_t(n + 1) for its best size n
(``best_size``); it is verified alone when that beats plain decoding and the draft's forecast. Per
copy the acceptance estimates are the copier's learned rates (``ngram.Copier``), but a mid-length
match whose first copy fails takes its whole tree with it; r_c, the copy steps' own accepted ÷
predicted, corrects for that: prior 1 worth ``copy_prior`` predicted tokens, every step fading the
evidence towards the prior, copy steps adding theirs — and so do the copy trees that were sized but
not verified (``Unverified``): each is followed along what the target then writes, and the longest
path of it the target wrote is what verification would have accepted (greedy; under the one-hot rule
its distribution when sampling). Learning from copy steps alone, a few failures stopped all copying
and r_c crept back by fading only, while the target went on writing what the copies proposed
(measured on the ``summarise`` set: ten right first copies in a row, none verified).

Most steps of free prose have some match and no copy worth verifying: a bound decides those without
sizing the tree — every copy, verified at the cheapest batch of two or more tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..costmodel import CostModel, best_size
from ..ngram import CopyTrie
from .tuning import TUNING


@dataclass
class Unverified:
    """A copy tree that was sized but not verified, followed along the tokens the target writes.

    Its Σ p̂ is split by depth, and a depth's share counts once the target has written the token that
    tests it (the token after the depth above was matched): a run of right copies raises r_c as the
    target writes them, not only once the walk leaves the tree."""

    kids: dict[int, dict[int, int]]  # trie node → token → child, the tree's nodes only
    depth_phat: list[float]  # Σ p̂ of the tree's nodes at depth 1, 2, …
    node: int = 0  # the trie node the written tokens have reached; −1: they left the tree
    tested: int = 0  # depths whose p̂ has been counted

    @classmethod
    def of(cls, trie: CopyTrie, keep: np.ndarray) -> Unverified:
        """The copy tree of trie nodes ``keep`` (parents first)."""
        kids: dict[int, dict[int, int]] = {}
        depth = {0: 0}
        depth_phat: list[float] = []
        phat = trie.phat
        for node in keep.tolist():
            parent = trie.parents[node]
            kids.setdefault(parent, {})[trie.tokens[node]] = node
            depth[node] = depth[parent] + 1
            if depth[node] > len(depth_phat):
                depth_phat.append(0.0)
            depth_phat[depth[node] - 1] += float(phat[node])
        return cls(kids, depth_phat)

    def follow(self, written: Sequence[int]) -> tuple[int, float, bool]:
        """Walk on along ``written``: (copies accepted, p̂ counted, settled)."""
        accepted, before = 0, self.tested
        for token in written:
            if self.node not in self.kids:
                break
            self.tested += 1
            self.node = self.kids[self.node].get(token, -1)
            if self.node < 0:
                break
            accepted += 1
        settled = self.node not in self.kids  # left the tree, or ran through it: every depth counts
        if settled:
            self.tested = len(self.depth_phat)
        return accepted, sum(self.depth_phat[before : self.tested]), settled


@dataclass
class CopySteps:
    # decayed Σ accepted copies: of copy steps and of unverified copy trees
    accepted: float = TUNING.copy_prior
    predicted: float = TUNING.copy_prior  # decayed Σ p̂ of their trees
    unverified: list[Unverified] = field(default_factory=list, repr=False)  # not settled yet
    _costs: CostModel | None = field(default=None, repr=False)
    _cheapest_batch: float = field(default=0.0, repr=False)  # min c_t(n ≥ 2) + overhead (the bound)

    @property
    def ratio(self) -> float:
        """r_c: accepted ÷ predicted of the copy steps and the unverified copy trees (prior 1)."""
        return min(self.accepted / self.predicted, TUNING.copy_ratio_max)

    def set_costs(self, costs: CostModel, budget: int) -> None:
        """The curves auto decides with (its learned factors applied); trees of at most ``budget``."""
        self._costs = costs
        # the cheapest verify of 2 … budget + 1 tokens (the curve is not monotone), with overhead
        self._cheapest_batch = float(costs.t(np.arange(2, budget + 2)).min()) + costs.overhead

    def alone(self, trie: CopyTrie, cap: int, rival: float) -> int:
        """How many copies to verify alone (the top by p̂): the best size when its rate beats ``rival``
        (tokens per second), else 0 — and then the tree the copies' estimates would verify at face
        value (r_c ≥ 1) is followed along what the target writes, unless even that could not pay."""
        if self._costs is None or trie.size == 1:
            return 0
        r_copy = self.ratio
        r_face = max(r_copy, 1.0)
        if (1.0 + r_face * float(trie.phat[1:].sum())) / self._cheapest_batch <= rival:
            return 0  # the bound: even every copy at the cheapest batch does not beat the rival
        pool = np.sort(trie.phat[1:])[::-1]
        face = best_size(0.0, 0, pool, 0.0, r_face, self._costs, cap)
        if face.m == 0:
            return 0  # no copy beats plain decoding at face value, nor then at r_c ≤ r_face
        copies = face if r_copy == r_face else best_size(0.0, 0, pool, 0.0, r_copy, self._costs, cap)
        if copies.rate > rival:
            return copies.m
        self.unverified.append(Unverified.of(trie, trie.best(face.m)))  # learn from what the target writes
        return 0

    def restart(self) -> None:
        """A new request: what it writes does not continue the last one's trees."""
        self.unverified = []

    def observe(self, event, copied: bool) -> None:
        """Every step: r_c's fading, a copy step's outcome, and the unverified trees followed along
        the tokens the step wrote."""
        self.accepted = TUNING.copy_fade * self.accepted + (1 - TUNING.copy_fade) * TUNING.copy_prior
        self.predicted = TUNING.copy_fade * self.predicted + (1 - TUNING.copy_fade) * TUNING.copy_prior
        if copied:
            self.accepted += event.accepted
            self.predicted += event.expected_accept
        if self.unverified:
            written, still_open = event.token_ids, []
            for tree in self.unverified:
                accepted, predicted, settled = tree.follow(written)
                self.accepted += accepted
                self.predicted += predicted
                if not settled:
                    still_open.append(tree)
            self.unverified = still_open
