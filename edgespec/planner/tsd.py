"""TSD — tree-structured speculative decoding with pruning (Gong et al. 2024, "Graph-structured
Speculative Decoding", §4).

Each drafting step expands a whole level in one batched draft decode; every expanded node gets up
to k children, the draft's top-k (deterministic, so the one-hot rule verifies them losslessly,
greedy or sampling). Two pruning rules (§4.2) decide which children grow further:

* probability pruning: a child c with q(c | s_c) < θ_prob becomes a leaf;
* sibling pruning: with m_q = max_i q(c_i) over the siblings, c_i becomes a leaf if q(c_i) < θ_sib · m_q.

Drafting stops at ``max_depth`` levels, or early (appendix A's "draft-exiting") when no node of the
new level may grow. ``budget`` caps the verified tree (root excluded): when a level offers more
children than fit, those with the largest path probability p̂ are kept, and only the best
``budget - size`` growing nodes are sent to the draft (each must add at least one child to be worth
evaluating). Defaults are the paper's (appendix A): k = 4, θ_prob = 0.2, θ_sib = 0.3, 10 steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import params
from .base import Planner
from .inputs import Drafter, PlanContext
from .params import param
from .tree import ChildRule, DraftTree, PlanStats, SparseDist, TreeBuilder


@dataclass(frozen=True)
class Candidate:
    """A possible child: position ``pos`` of ``parent``'s draft distribution."""

    parent: int
    pos: int
    token: int
    q: float  # q(token | path to parent): the draft's (full-softmax) probability
    path_prob: float  # p̂ = p̂(parent) · q
    grows: bool  # passed probability and sibling pruning (may be expanded next level)


def keeps_growing(q: float, q_max: float, theta_prob: float, theta_sib: float) -> bool:
    """TSD pruning (§4.2): a child stays expandable iff q ≥ θ_prob and q ≥ θ_sib · m_q."""
    return q >= theta_prob and q >= theta_sib * q_max


def ranked_children(
    tree: TreeBuilder,
    parents: Sequence[int],
    dists: Sequence[SparseDist],
    k: int,
    theta_prob: float,
    theta_sib: float,
) -> list[Candidate]:
    """The top-k children of every parent, best path probability first.

    Ties keep parent order, then the draft's rank, so each parent's children stay in rank order —
    the order they are added, verified and (for the one-hot rule) tried.
    """
    rows = []
    for parent, dist in zip(parents, dists):
        live = int(np.count_nonzero(dist.probs[:k] > 0.0))
        q_max = float(dist.probs[0]) if live else 0.0  # m_q: the probabilities are sorted, descending
        for pos in range(live):
            q = float(dist.probs[pos])
            rows.append(
                Candidate(
                    parent=int(parent),
                    pos=pos,
                    token=int(dist.ids[pos]),
                    q=q,
                    path_prob=tree.path_prob[parent] * q,
                    grows=keeps_growing(q, q_max, theta_prob, theta_sib),
                )
            )
    order = sorted(range(len(rows)), key=lambda i: -rows[i].path_prob)  # stable: ties keep (parent, rank)
    return [rows[i] for i in order]


def best_by_path_prob(tree: TreeBuilder, nodes: Sequence[int], limit: int) -> list[int]:
    """At most ``limit`` of ``nodes``, the largest p̂ first (stable on ties)."""
    if len(nodes) <= limit:
        return list(nodes)
    order = sorted(range(len(nodes)), key=lambda i: -tree.path_prob[nodes[i]])[:limit]
    return [nodes[i] for i in sorted(order)]  # keep index order: parents before children in the batch


@dataclass
class TSDPlanner(Planner):
    k: int = param(4, params.K, minimum=1)
    theta_prob: float = param(0.2, params.THETA_PROB, minimum=0, maximum=1)
    theta_sib: float = param(0.3, params.THETA_SIB, minimum=0, maximum=1)
    max_depth: int = param(10, params.MAX_DEPTH, minimum=1)
    budget: int = param(32, params.BUDGET, minimum=1)
    name = "tsd"

    def describe(self) -> str:
        return (
            f"k={self.k} θ_prob={self.theta_prob:g} θ_sib={self.theta_sib:g} depth≤{self.max_depth} "
            f"budget={self.budget}"
        )

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        tree = TreeBuilder(root_token)
        budget = min(self.budget, ctx.max_nodes - 1)
        frontier, decodes, drafted = [0], 0, 0
        for _ in range(self.max_depth):
            room = budget - (tree.size - 1)
            frontier = best_by_path_prob(tree, frontier, room)  # each must add ≥ 1 child to be worth it
            if not frontier:
                break  # draft exit: nothing may grow, or the budget is spent
            dists = drafter.expand(tree, frontier)
            decodes, drafted = decodes + 1, drafted + len(frontier)
            grown = []
            candidates = ranked_children(tree, frontier, dists, self.k, self.theta_prob, self.theta_sib)
            for cand in candidates[:room]:
                child = tree.add(cand.parent, cand.token, cand.q)
                tree.set_children_rule(cand.parent, ChildRule.TOP)  # deterministic top-k: one-hot rule
                if cand.grows:
                    grown.append(child)
            frontier = grown
        expected = float(sum(tree.path_prob[1:]))
        return tree.freeze(PlanStats(draft_decodes=decodes, drafted_nodes=drafted, expected_accept=expected))
