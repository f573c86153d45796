"""OPT-Tree — an adaptive draft tree that maximises the expected acceptance length (Wang et al. 2024).

With the draft's probabilities as acceptance estimates, a node is accepted with probability
p̂ = Π q along its path, and a tree T is expected to yield E(A) = Σ_{v ∈ T} p̂(v) accepted tokens
(root excluded here, as everywhere in ``PlanStats``). Among all trees of n nodes, the best is simply
the n nodes with the largest p̂ (Theorem 3.1): a child never has a larger p̂ than its parent, so the
top n are closed under "parent of" — a subtree containing the root.

Algorithm 1, level by level (one batched draft decode per level):

1. expand the last layer; among all its children keep the n with the largest p̂ as the next layer;
2. E_new = the sum of the n largest p̂ in the whole tree so far (non-decreasing, Theorem 3.2);
3. stop when E_new − E_old < δ — a deeper level costs one more draft step, worth it only if it
   adds more than δ expected tokens, with μ ≤ δ ≤ 1 where μ = draft step time / target step time;
   here both are measured (the pair's cost profile, ``prepare``): μ = c_d(m) / c_t(n + 1), a draft
   level of the m nodes about to be expanded over verifying the tree's n + 1 tokens. One draft token
   over one target token, c_d(1) / c_t(1), would undercount a level of m nodes wherever that costs
   more than one decode (on a CPU, about m decodes) and grow trees too deep;
4. finally keep the n nodes with the largest p̂ overall — with the pair's cost curves, the m ≤ n
   best, m chosen for the step's expected rate (1 + E_sub(T, m)) / (drafting + c_t(m + 1)): the paper
   picks n for the hardware, and the verify curve is not smooth (on a CPU, 16 tokens can cost a
   fifth less than 15 or 17; see ``edgespec.profile.costs``), so the size is chosen per step.

A free saving over the paper: a layer node outside the current overall top n can never enter the
final top n, nor can its descendants (p̂ only shrinks downwards, and the n-th best only grows), so
only layer nodes inside the current top n are sent to the draft. The result is the paper's, exactly.

A departure, with the cost curves (``layers="paying"``, the default; ``"all"`` is the paper's): of
those layer nodes only the m best whose p̂ can pay for their draft level are expanded. The paper
expands the whole layer because a GPU drafts n rows for the price of one; on a CPU a row costs about a
decode, and three in four of the rows drafted were alternatives that never made the final tree.

Children are the draft's most likely tokens (deterministic): the one-hot rule verifies them, greedy
or sampling. Ties in p̂ go to the older node, which keeps the kept set a subtree even when q = 1.

Steps 1–4 are ``AlgorithmOne``, a policy of the best-first growth ``auto`` and ``hybrid`` share
(``growth.grow``: one batched draft decode per level through ``expand``); besides the draft's rows it
needs only the numbers ``OptTreePlanner.levels`` fixes per tree size.

Note for the engine: the tree keeps only the kept nodes, renumbered (parents first), so its indices
differ from those the draft saw during ``expand`` (nodes the draft evaluated may be dropped). Match
accepted nodes to decoded ones by token path, not by index.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from . import params
from .base import Planner
from .costmodel import CostModel, best_size
from .growth import Growth, grow
from .inputs import Drafter, PlanContext, Profile
from .params import param
from .tree import DraftTree, PlanStats, SparseDist, TreeBuilder
from .tsd import best_by_path_prob


def top_nodes(path_prob: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n non-root nodes with the largest p̂ (ties: the older node), sorted by index."""
    idx = np.arange(1, path_prob.shape[0])
    best = np.lexsort((idx, -path_prob[1:]))[:n]  # primary key: -p̂; then the index
    return np.sort(idx[best])


@dataclass(frozen=True)
class OptTreeLevels:
    """What Algorithm 1 needs besides the draft (``OptTreePlanner.levels``)."""

    n: int  # draft tokens the tree may keep
    capacity: int  # nodes besides the root the draft may evaluate (its sequences)
    max_depth: int  # levels: draft decodes
    threshold: tuple[float, ...]  # δ for a next level of m nodes, m = 0 … n
    level_cost: tuple[float, ...] | None  # c_d(m) / c_t(n + 1), m = 0 … n; None: expand every layer node
    costs: CostModel | None = None  # step 4 by the cost curves; None: keep the n best


def opt_tree_by_levels(drafter: Drafter, tree: TreeBuilder, levels: OptTreeLevels) -> list[int]:
    """Algorithm 1 through ``expand``, one draft decode per level (``growth.grow``), from a one-node
    tree: the levels grow a work tree, then step 4 leaves its kept nodes in ``tree``. Returns the levels'
    sizes (the root's level first)."""
    growth = Growth.from_root(tree.tokens[0])
    keep = grow(drafter, growth, AlgorithmOne(levels))
    growth.copy_into(keep, tree)
    return growth.levels


@dataclass
class AlgorithmOne:
    """OPT-Tree's Algorithm 1 as a growth policy: steps 1–3 level by level, step 4 at the end."""

    levels: OptTreeLevels
    e_old: float = 0.0  # E_sub(T, n) after the level before
    top_n: list[float] = field(default_factory=list)  # the n largest p̂ of the tree (a min-heap)

    def admit(self, growth: Growth, layer: list[int], dists: list[SparseDist]) -> None:
        """Step 1: of the layer's children, add those among the n largest p̂ of the tree so far.

        A child at or below the n-th largest p̂ of the nodes before it is not added: n older nodes beat
        it (ties go to the older node) and the n-th largest only grows, so it could never be kept; in
        p̂ order, neither could the children after it. The kept set, and so the returned tree, is the
        same; only fewer nodes are built."""
        tree, n = growth.tree, self.levels.n
        # (−p̂, parent's place in the layer, rank under the parent) of every child with q > 0: the
        # tuples order by p̂ descending, then parent, then rank (all distinct, so no ties left)
        candidates = [
            (-(tree.path_prob[u] * q), i, rank)
            for i, (u, d) in enumerate(zip(layer, dists))
            for rank, q in enumerate(d.probs.tolist())
            if q > 0.0
        ]
        top_n = sorted(tree.path_prob[1:])[-n:]  # the n largest p̂ so far: a min-heap (ascending)
        for neg_phat, i, rank in heapq.nsmallest(n, candidates):  # p̂ order; within a parent, rank order
            if len(top_n) == n and -neg_phat <= top_n[0]:
                break
            if len(top_n) < n:
                heapq.heappush(top_n, -neg_phat)
            else:
                heapq.heapreplace(top_n, -neg_phat)
            growth.add(layer[i], int(dists[i].ids[rank]), float(dists[i].probs[rank]))
        self.top_n = top_n

    def next_level(self, growth: Growth) -> list[int]:
        """Steps 2–3: the next layer, unless the last level added less than δ to E(A)."""
        levels = self.levels
        if not growth.levels:
            return [0]  # the first level: the root
        if len(growth.levels) >= levels.max_depth:
            return []
        e_new = sum(self.top_n)  # E_sub(T, n): the n largest p̂ so far
        gain, self.e_old = e_new - self.e_old, e_new
        # The next layer: the new children, all inside the current overall top n (each was added
        # only when its p̂ beat the n-th largest), as many as the draft's sequences allow.
        layer = best_by_path_prob(growth.tree, growth.added, levels.capacity - growth.evaluated)
        layer = worth_drafting(growth.tree, layer, levels.level_cost)
        if not layer or gain < levels.threshold[len(layer)]:  # the last gain vs the next level's cost
            return []
        return layer

    def keep(self, growth: Growth) -> list[int]:
        """Step 4: the n nodes with the largest p̂ — with the cost curves, only the m ≤ n best whose
        tree gives the step the best expected rate (1 + E_m) / (the levels' drafting + c_t(m + 1)),
        E_m = Σ p̂ of the first m (``best_size``)."""
        levels = self.levels
        ranked = growth.ranked()[: levels.n]
        m = len(ranked)
        if levels.costs is not None:
            spent = sum(levels.costs.d(size) for size in growth.levels)  # seconds of the levels run
            pool = np.array([growth.tree.path_prob[node] for node in ranked])
            m = best_size(0.0, 0, pool, spent, 1.0, levels.costs, levels.n).m
        return sorted(ranked[:m])


def worth_drafting(tree: TreeBuilder, layer: list[int], level_cost: tuple[float, ...] | None) -> list[int]:
    """The m best nodes of the next layer whose expansion can pay for its level (all without costs).

    Expanding u adds children whose p̂ sum to at most p̂(u) (their q sum to ≤ 1), so the m largest
    p̂ of the layer bound what its level can add to E(A), and c_d(m) / c_t(n + 1) is what that level
    costs in target steps: m maximises Σ_{j ≤ m} p̂(u_j) − c_d(m) / c_t(n + 1) (the first m on
    ties). Where a draft row costs almost nothing (a GPU), that is the whole layer; on a CPU, where
    each row of a level costs about a decode, the unlikely alternatives of a confident path are
    left undrafted."""
    if level_cost is None or len(layer) <= 1:
        return layer
    by_phat = sorted(layer, key=lambda u: -tree.path_prob[u])  # stable: ties keep index order
    bound, best_m, best_net = 0.0, 1, float("-inf")  # bound: Σ of the m largest p̂
    for m, u in enumerate(by_phat, start=1):
        bound += tree.path_prob[u]
        if bound - level_cost[m] > best_net:
            best_m, best_net = m, bound - level_cost[m]
    return sorted(by_phat[:best_m])  # index order: parents before children in the batch


@dataclass
class OptTreePlanner(Planner):
    # n: the paper uses 25–60 nodes in all
    budget: int = param(
        24, "n: draft tokens in the tree, root excluded (with a cost profile: at most n)", minimum=1
    )
    mu: float | None = param(None, params.MU, kind="float", minimum=0)  # None → measured (prepare)
    delta: float | None = param(
        None, "δ: stop deepening when E(A) grows by less (default: μ, break-even)", kind="float"
    )
    max_depth: int = param(10, params.MAX_DEPTH, minimum=1)
    layers: str = param(
        "paying",
        "which nodes of a level the draft expands: paying (with a cost profile, those whose p̂ pays for "
        "the level's cost) or all (the paper's: every node inside the top n)",
        choices=("paying", "all"),
    )
    costs: CostModel | None = field(default=None, compare=False, repr=False)  # the pair's cost profile
    # levels() per (n, capacity): the same every step
    _levels: dict[tuple[int, int], OptTreeLevels] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    name = "opt-tree"

    DEFAULT_MU = 0.15  # without a profile: a 0.5B draft against a ~7B target on a GPU

    def prepare(self, profile: Profile) -> None:
        """μ from the pair's cost profile: its draft level and target verify curves (asked for even with
        μ given: with layers="paying" a level's cost, and the tree's size, come from them too)."""
        costs = profile.costs()
        if costs is not None:
            self.costs = costs
            self._levels.clear()

    def threshold(self, level: int, n: int) -> float:
        """δ, the gain in E(A) that pays for a draft level of ``level`` nodes in a tree of n draft
        tokens: δ = μ unless given; μ = c_d(level) / c_t(n + 1) when measured."""
        if self.delta is not None:
            return self.delta
        if self.mu is not None:
            return self.mu
        if self.costs is None:
            return self.DEFAULT_MU
        return float(self.costs.d(level) / self.costs.t(n + 1))

    def describe(self) -> str:
        # δ shown for a full level of n nodes (the largest OPT-Tree expands)
        return (
            f"n={self.budget} δ={self.threshold(self.budget, self.budget):.3g} depth≤{self.max_depth}"
            f" layers={self.layers}"
        )

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        tree = TreeBuilder(root_token)
        n = min(self.budget, ctx.max_nodes - 1)
        levels = opt_tree_by_levels(drafter, tree, self.levels(n, ctx.max_nodes - 1)) if n > 0 else []
        stats = PlanStats(
            draft_decodes=len(levels),
            drafted_nodes=sum(levels),
            expected_accept=float(sum(tree.path_prob[1:])),
        )
        return tree.freeze(stats)

    def levels(self, n: int, capacity: int) -> OptTreeLevels:
        """How Algorithm 1 grows a tree of n draft tokens where the draft may evaluate ``capacity`` nodes
        besides the root (its sequences): ``threshold(m, n)`` for each next level's size m and, with
        layers="paying", that level's cost (the same numbers: c_d(m) / c_t(n + 1) where measured)."""
        if (n, capacity) in self._levels:
            return self._levels[n, capacity]
        level_cost = None  # c_d(m) / c_t(n + 1) for m = 0 … n: a draft level of m nodes in target steps
        if self.costs is not None:
            level_cost = (0.0, *(self.costs.d(np.arange(1, n + 1)) / self.costs.t(n + 1)).tolist())
        if level_cost is not None and self.delta is None and self.mu is None:
            threshold = level_cost
        else:
            threshold = (self.threshold(n, n),) * (n + 1)  # one δ for every size
        levels = OptTreeLevels(
            n, capacity, self.max_depth, threshold, level_cost if self.layers == "paying" else None,
            self.costs,
        )
        self._levels[n, capacity] = levels
        return levels
