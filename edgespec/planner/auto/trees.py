"""``auto``'s tree builders: a draft tree grown level by level, or a one-pass ParallelSpec tree — each
sized for the best expected rate of its step under auto's curves (``calibration``).

**Level by level** (``level_tree``): the best-first growth OPT-Tree and ``hybrid`` share
(``growth.grow``), with auto's policy ``AutoGrowth``. Candidates are each expanded node's
``children_kept`` likeliest tokens; auto ranks them by their p̂, the product along the path of the
chance each token is right given its draft probability q (``acceptance``). After each level,
``costmodel.deepen`` forecasts whether one more level — its w best expandable candidates, their
children predicted from the step's distributions so far — beats stopping now: the rate

    (1 + E) / (drafting so far + d(w) + c_t(m + 1) + overhead),   E = Σ p̂

of the best final size m after it, against the best m now. So a jump in c_t (CUDA's 8 → 9 tokens)
is crossed only when the extra E pays for it. Finally every expanded node is kept, with the
candidates of largest p̂ that maximise the rate (``best_size``). Copies from the conversation at
least as likely as the least likely node are grafted on (a token both propose is one node).

**One pass** (``one_pass_tree``, ParallelSpec, K masks): one draft pass over the pending tokens and
the K masks gives K + 1 per-depth distributions; the tree is their best product paths
(``parallel.grow``), sized with that pass, c_k(pending + K), as the drafting time.

Children are the draft's most likely tokens (``ChildRule.TOP``): the one-hot rule verifies them
losslessly, greedy or sampling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..costmodel import CostModel, best_size, deepen, expandable_within
from ..growth import Growth, admit_top, grow
from ..inputs import Drafter, PlanContext, step_seed
from ..ngram import Copier, CopyTrie
from ..parallel import grow as grow_one_pass
from ..tree import DraftTree, PlanStats, SparseDist, TreeBuilder
from .acceptance import Acceptance
from .tuning import PROFILE_LEN, TUNING


@dataclass
class AutoGrowth:
    """auto's growth policy: deepen while the forecast says one more level pays."""

    costs: CostModel  # the curves, the learned factors applied
    acceptance: Acceptance  # the chance a guess is right, by its q (a probe's: at least q)
    prior: np.ndarray  # the draft's running top-j profile (a probe's: optimistic)
    cap: int  # most draft tokens
    max_depth: int
    spent: float  # seconds of drafting so far (from the draft's catch-up on)
    tops: np.ndarray = field(default_factory=lambda: np.zeros(PROFILE_LEN))  # Σ top-j of this step's rows
    known: Callable[[Sequence[int]], bool] = lambda path: False  # ``Prepaid.drafted``: decoded already
    phat: dict[int, float] = field(default_factory=lambda: {0: 1.0})  # work node → p̂ (through the curve)

    def admit(self, growth: Growth, nodes: list[int], dists: list[SparseDist]) -> None:
        for dist in dists:
            k = min(PROFILE_LEN, dist.probs.shape[0])
            self.tops[:k] += dist.probs[:k]
        admit_top(growth, nodes, dists, TUNING.children_kept)
        for node in nodes:  # p̂(child) = p̂(node) · chance(q), siblings in rank order
            kids = list(growth.kids.get(node, {}).values())
            chances = self.acceptance.chances([growth.tree.draft_prob[u] for u in kids])
            for kid, chance in zip(kids, chances.tolist()):
                self.phat[kid] = self.phat[node] * chance

    def _pool(self, growth: Growth) -> tuple[list[int], np.ndarray, float, int]:
        """The candidates by p̂ (ties: the older), their p̂, and the expanded nodes' Σ p̂ and count
        (the forced part)."""
        candidates = growth.candidates(self.phat)
        pool = np.array([self.phat[u] for u in candidates], dtype=np.float64)
        forced = [u for u in growth.expanded if u != 0]
        return candidates, pool, float(sum(self.phat[u] for u in forced)), len(forced)

    def next_level(self, growth: Growth) -> list[int]:
        if not growth.levels:
            return [0]  # the root first (with the draft's catch-up)
        candidates, pool, forced_e, forced_n = self._pool(growth)
        depth = growth.tree.depth
        expandable = np.array([depth[u] < self.max_depth for u in candidates], dtype=bool)
        if self._free(growth, candidates, pool, expandable, forced_e, forced_n):
            return [candidates[0]]  # no decode: the draft's look-ahead did it during the last verify
        # Children not drafted yet look like this step's distributions so far (the running profile
        # weighs in as step_prior nodes): a confident chain is expected to stay confident.
        profile = (TUNING.step_prior * self.prior + self.tops) / (TUNING.step_prior + sum(growth.levels))
        chances = self.acceptance.chances(profile)  # p̂ are chances already: the rates take r = 1
        w, _ = deepen(forced_e, forced_n, pool, expandable, self.spent, 1.0, self.costs, self.cap, chances)
        if w == 0:
            return []
        chosen = [candidates[i] for i in expandable_within(expandable, self.cap - forced_n)[:w]]
        # what the level costs: a decode of the nodes the look-ahead has not decoded (none: nothing)
        paid = sum(not self.known(growth.tree.path_tokens(u)) for u in chosen)
        self.spent += float(self.costs.d(paid)) if paid else 0.0
        return chosen

    def _free(self, growth: Growth, candidates, pool, expandable, forced_e: float, forced_n: int) -> bool:
        """The best candidate was decoded by the draft's look-ahead, and the final tree would verify it
        anyway (``best_size`` takes it): expanding it alone costs nothing, so the growth goes on."""
        if not candidates or not expandable[0] or forced_n >= self.cap:
            return False
        if not self.known(growth.tree.path_tokens(candidates[0])):
            return False
        return best_size(forced_e, forced_n, pool, self.spent, 1.0, self.costs, self.cap).m > forced_n

    def keep(self, growth: Growth) -> list[int]:
        """Every expanded node, and the candidates of largest p̂ for the best expected rate."""
        candidates, pool, forced_e, forced_n = self._pool(growth)
        final = best_size(forced_e, forced_n, pool, self.spent, 1.0, self.costs, self.cap)
        return sorted([u for u in growth.expanded if u != 0] + candidates[: final.m - forced_n])


def level_tree(
    root_token: int, drafter: Drafter, policy: AutoGrowth, trie: CopyTrie, copier: Copier
) -> DraftTree:
    """The level-by-level tree, copies grafted on; ``policy.spent`` ends as its drafting seconds."""
    growth = Growth.from_root(root_token)
    keep = grow(drafter, growth, policy)
    tree = TreeBuilder(root_token)
    growth.copy_into(keep, tree)
    if tree.size > 1 and trie.size > 1:  # the hybrid: copies as likely as the least likely node
        graft = trie.best(policy.cap - (tree.size - 1), min(policy.phat[u] for u in keep))
        copier.grow(tree, trie, graft, {0: 0})
    stats = PlanStats(
        draft_decodes=len(growth.levels),
        drafted_nodes=sum(growth.levels),
        expected_accept=float(sum(tree.path_prob[1:])),
    )
    return copier.remember(tree.freeze(stats))


def one_pass_tree(
    root_token: int, drafter: Drafter, ctx: PlanContext, costs: CostModel, masks: int, cap: int, pending: int,
    ratio: float,
) -> tuple[DraftTree, float]:  # fmt: skip
    """ParallelSpec's tree and its drafting seconds: one draft pass of the pending tokens and K masks,
    then the size that maximises the rate with that pass as the drafting time (nodes in the order
    ``parallel.grow`` adds them: best p̂ first when greedy, so every prefix is a subtree)."""
    k = min(masks, cap - 1)
    tree = TreeBuilder(root_token)
    dists = drafter.parallel_dists(tree, k)
    seed = step_seed(ctx) if ctx.sampling else None
    trial = TreeBuilder(root_token)
    grow_one_pass(trial, dists, cap, seed)
    spent = float(costs.k(pending + k))
    size = best_size(0.0, 0, np.asarray(trial.path_prob[1:]), spent, ratio, costs, cap).m
    grow_one_pass(tree, dists, max(size, 1), seed)
    expected = float(sum(tree.path_prob[1:]))
    return tree.freeze(PlanStats(draft_decodes=1, drafted_nodes=k + 1, expected_accept=expected)), spent
