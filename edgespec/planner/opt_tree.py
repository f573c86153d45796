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
   here both are measured (the pair's cost profile, ``use_costs``): μ = c_d(m) / c_t(n + 1), a draft
   level of the m nodes about to be expanded over verifying the tree's n + 1 tokens. One draft token
   over one target token, c_d(1) / c_t(1), would undercount a level of m nodes wherever that costs
   more than one decode (on a CPU, about m decodes) and grow trees too deep;
4. finally keep the n nodes with the largest p̂ overall — with the pair's cost curves, the m ≤ n
   best, m chosen for the step's expected rate (1 + E_sub(T, m)) / (drafting + c_t(m + 1)): the paper
   picks n for the hardware, and the verify curve is not smooth (on a CPU, 16 tokens can cost a
   fifth less than 15 or 17; see ``edgespec.measure.costs``), so the size is chosen per step.

A free saving over the paper: a layer node outside the current overall top n can never enter the
final top n, nor can its descendants (p̂ only shrinks downwards, and the n-th best only grows), so
only layer nodes inside the current top n are sent to the draft. The result is the paper's, exactly.

Children are the draft's most likely tokens (deterministic): the one-hot rule verifies them, greedy
or sampling. Ties in p̂ go to the older node, which keeps the kept set a subtree even when q = 1.

Note for the engine: the returned tree keeps only the kept nodes, renumbered (parents first), so its
indices differ from those the draft saw during ``expand`` (nodes the draft evaluated may be dropped).
Match accepted nodes to decoded ones by token path, not by index.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from . import params
from .costmodel import CostModel, best_size
from .params import param
from .tree import ChildRule, Drafter, DraftTree, PlanContext, Planner, PlanStats, TreeBuilder
from .tsd import best_by_path_prob


def top_nodes(path_prob: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n non-root nodes with the largest p̂ (ties: the older node), sorted by index."""
    idx = np.arange(1, path_prob.shape[0])
    best = np.lexsort((idx, -path_prob[1:]))[:n]  # primary key: -p̂; then the index
    return np.sort(idx[best])


def subtree(tree: TreeBuilder, keep: np.ndarray) -> TreeBuilder:
    """The tree restricted to the root and ``keep`` (closed under parents), renumbered in index order."""
    new_index = {0: 0}
    out = TreeBuilder(tree.tokens[0])
    for node in keep:
        node = int(node)
        new_index[node] = out.add(new_index[tree.parents[node]], tree.tokens[node], tree.draft_prob[node])
    has_child = set(out.parents[1:])
    for old, new in new_index.items():
        if new in has_child:
            out.set_children_rule(new, ChildRule(tree.child_rule[old]))
            out.dists[new] = tree.dists[old]
    return out


@dataclass
class OptTreePlanner(Planner):
    # n: the paper uses 25–60 nodes in all
    budget: int = param(
        24, "n: draft tokens in the tree, root excluded (with a cost profile: at most n)", minimum=1
    )
    mu: float | None = param(None, params.MU, kind="float", minimum=0)  # None → measured (use_costs)
    delta: float | None = param(
        None, "δ: stop deepening when E(A) grows by less (default: μ, break-even)", kind="float"
    )
    max_depth: int = param(10, params.MAX_DEPTH, minimum=1)
    costs: CostModel | None = field(default=None, compare=False, repr=False)  # the pair's cost profile
    name = "opt-tree"
    wants_costs = True

    DEFAULT_MU = 0.15  # without a profile: a 0.5B draft against a ~7B target on a GPU

    def use_costs(self, costs: CostModel) -> None:
        """Take μ from the pair's cost profile: its draft level and target verify curves."""
        self.costs = costs

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
        return f"n={self.budget} δ={self.threshold(self.budget, self.budget):.3g} depth≤{self.max_depth}"

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        tree = TreeBuilder(root_token)
        n = min(self.budget, ctx.max_nodes - 1)
        capacity = ctx.max_nodes - 1  # nodes besides the root the draft may evaluate (its sequences)
        layer, e_old, decodes, evaluated = [0], 0.0, 0, 0
        drafting = 0.0  # seconds of draft levels, from the cost curves
        for _ in range(self.max_depth if n > 0 else 0):
            dists = drafter.expand(tree, layer)
            decodes += 1
            drafting += self.costs.d(len(layer)) if self.costs is not None else 0.0
            evaluated += len(layer) - (1 if layer == [0] else 0)
            children = self._next_layer(tree, layer, dists, n)
            e_new = float(np.sort(np.asarray(tree.path_prob[1:]))[::-1][:n].sum())  # E_sub(T, n)
            gain, e_old = e_new - e_old, e_new
            # The next level: the new children inside the current overall top n (the rest can never
            # enter the final top n), as many as the draft's sequences allow.
            kept = set(top_nodes(np.asarray(tree.path_prob), n).tolist())
            layer = best_by_path_prob(tree, [u for u in children if u in kept], capacity - evaluated)
            if not layer or gain < self.threshold(len(layer), n):  # the last gain vs the next level's cost
                break
        out = subtree(tree, top_nodes(np.asarray(tree.path_prob), self._final_size(tree, n, drafting)))
        stats = PlanStats(
            draft_decodes=decodes,
            drafted_nodes=evaluated + (1 if decodes else 0),
            expected_accept=float(sum(out.path_prob[1:])),
        )
        return out.freeze(stats)

    def _final_size(self, tree: TreeBuilder, n: int, drafting: float) -> int:
        """n; with the cost curves, the m ≤ n whose top-m tree has the best expected rate."""
        if self.costs is None:
            return n
        best_phat = np.sort(np.asarray(tree.path_prob[1:]))[::-1]
        return best_size(0.0, 0, best_phat, drafting, 1.0, self.costs, n).m

    @staticmethod
    def _next_layer(tree: TreeBuilder, layer: list[int], dists, n: int) -> list[int]:
        """Add the n children of ``layer`` with the largest p̂ = p̂(parent) · q; returns them.

        A child at or below the n-th largest p̂ of the nodes before it is not added: n older nodes beat
        it (ties go to the older node) and the n-th largest only grows, so it could never be kept; in
        p̂ order, neither could the children after it. The kept set, and so the returned tree, is the
        same; only fewer nodes are built."""
        sizes = [d.probs.shape[0] for d in dists]
        parent_at = np.repeat(np.arange(len(layer)), sizes)  # (C,) index into layer
        pos = np.concatenate([np.arange(s) for s in sizes])  # (C,) rank within its parent
        q = np.concatenate([d.probs for d in dists])  # (C,)
        phat = np.asarray([tree.path_prob[u] for u in layer])[parent_at] * q
        live = np.flatnonzero(q > 0.0)
        best = live[np.lexsort((pos[live], parent_at[live], -phat[live]))][:n]
        top_n = sorted(tree.path_prob[1:])[-n:]  # the n largest p̂ so far: a min-heap (ascending)
        added = []
        for c in best:  # p̂ order; within one parent that is rank order
            if len(top_n) == n and phat[c] <= top_n[0]:
                break
            if len(top_n) < n:
                heapq.heappush(top_n, float(phat[c]))
            else:
                heapq.heapreplace(top_n, float(phat[c]))
            parent = layer[int(parent_at[c])]
            d = dists[int(parent_at[c])]
            added.append(tree.add(parent, int(d.ids[pos[c]]), float(q[c])))
            tree.set_children_rule(parent, ChildRule.TOP)
        return added
