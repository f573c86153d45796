"""Planners that copy from the conversation: ``ngram`` (copies alone) and ``hybrid`` (copies and the
draft model's tree in one token graph). The copies, their index and their p̂ are ``ngram.Copier``'s.

**ngram.** The copy trie's nodes of largest p̂, no draft model at all (``needs_draft = False``). Size:
every copy with p̂ ≥ ``min_accept`` up to ``budget``; with the pair's cost curves, the size that
maximises the expected rate (1 + Σ p̂) / c_t(n + 1) — copying takes no draft time.

**hybrid.** One graph of candidate tokens keyed by their token path, so a node reached both ways —
copied from the conversation and proposed by the draft — is one node (GSD's merging of equal
prefixes; here a prefix tree, no merge edges needed). Its estimated acceptance combines both
sources as independent evidence (the token is right if either source is right):

    q = 1 − (1 − q_draft)(1 − q_copy),   p̂ = Π q along the path.

Growth is OPT-Tree's (level by level, by p̂), with copies as free candidates from the start. Each
level, the draft expands (one batched decode) the unexpanded nodes among the current top ``budget``
by p̂ whose parents it has decoded, those worth it: a node u is expected to gain about
p̂(u) · A · (1 − Σ q_copy of u's children), A the draft's mean top-k mass (learned as it drafts) —
no gain where the copies already cover the next token. The level is drafted only when the gain
reaches δ = μ (one draft decode in target decodes, from the cost curves; OPT-Tree's break-even).
So a step whose root the copies cover costs no draft decode at all. Finally the top nodes by p̂ are
kept: ``budget`` of them, or with the cost curves the number that maximises the expected rate with
the draft time spent. Every child is a deterministic candidate: the one-hot rule (``ChildRule.TOP``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import params
from .base import Planner
from .costmodel import CostModel, best_size
from .growth import Growth, grow
from .inputs import Drafter, PlanContext, Profile
from .ngram import Copier, CopyTrie
from .params import param
from .tree import DraftTree, PlanStats, SparseDist, TreeBuilder

PRIOR_TOP_MASS = 0.7  # A before the draft has been seen: Σ of its top-k probabilities, typically
TOP_MASS_MEMORY = 0.9  # A: exponential average over expanded nodes, this much weight on the past
DEFAULT_MU = 0.15  # μ without a cost profile (OPT-Tree's default: a small draft on a GPU)


@dataclass
class NGramPlanner(Planner):
    budget: int = param(16, "most copied tokens verified per step, root excluded", minimum=1)
    ngram_max: int = param(8, params.NGRAM_MAX, minimum=1)
    matches: int = param(8, params.MATCHES, minimum=1)  # branches of the copy tree
    min_accept: float = param(
        0.1,
        "copies with estimated acceptance p̂ below it are left out (without a cost profile)",
        minimum=0,
        maximum=1,
    )
    # the pair's cost curves (``prepare``): size by expected rate
    costs: CostModel | None = field(default=None, compare=False, repr=False)
    name = "ngram"
    needs_draft = False  # no draft model at all: the pair may have none
    copier: Copier = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.copier = Copier(n_max=self.ngram_max, matches=self.matches)

    def prepare(self, profile: Profile) -> None:
        costs = profile.costs()  # the pair's cost curves (None: no draft to measure them with)
        if costs is not None:
            self.costs = costs

    def describe(self) -> str:
        size = "sized by cost" if self.costs is not None else f"p̂≥{self.min_accept:g}"
        return f"n≤{self.ngram_max} matches={self.matches} budget={self.budget} {size}"

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        trie = self.copier.propose(root_token, ctx)
        cap = min(self.budget, ctx.max_nodes - 1)
        if self.costs is None:
            keep = trie.best(cap, self.min_accept)
        else:
            keep = trie.best(copy_size(trie, self.costs, cap))
        return self.copier.copy_tree(trie, keep)

    def observe(self, event) -> None:
        self.copier.observe(event.tree, event.accepted_path)


def copy_size(trie: CopyTrie, costs: CostModel, cap: int, spent: float = 0.0) -> int:
    """How many copies (the top by p̂) maximise (1 + Σ p̂) / (spent + c_t(n + 1) + overhead)."""
    pool = np.sort(trie.phat[1:])[::-1]
    return best_size(0.0, 0, pool, spent, 1.0, costs, cap).m


@dataclass
class HybridPlanner(Planner):
    budget: int = param(24, "most draft + copied tokens verified per step, root excluded", minimum=1)
    k: int = param(4, params.K, minimum=1)
    max_depth: int = param(10, params.MAX_DEPTH, minimum=1)
    ngram_max: int = param(8, params.NGRAM_MAX, minimum=1)
    matches: int = param(8, params.MATCHES, minimum=1)
    # δ: the gain a draft level must reach; None → c_d(1)/c_t(1) from the costs
    mu: float | None = param(None, params.MU, kind="float", minimum=0)
    costs: CostModel | None = field(default=None, compare=False, repr=False)
    name = "hybrid"
    top_mass: float = field(default=PRIOR_TOP_MASS, repr=False)  # A, learned from the draft's dists
    copier: Copier = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.copier = Copier(n_max=self.ngram_max, matches=self.matches)

    def prepare(self, profile: Profile) -> None:
        costs = profile.costs()  # the pair's cost curves (None: no draft to measure them with)
        if costs is not None:
            self.costs = costs

    @property
    def threshold(self) -> float:
        if self.mu is not None:
            return self.mu
        return DEFAULT_MU if self.costs is None else float(self.costs.d(1) / self.costs.t(1))

    def describe(self) -> str:
        return f"budget={self.budget} k={self.k} n≤{self.ngram_max} δ={self.threshold:.2g}"

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        trie = self.copier.propose(root_token, ctx)
        growth = Growth.from_root(root_token)
        policy = _HybridGrowth(self, min(self.budget, ctx.max_nodes - 1), ctx.max_nodes - 1)
        policy.seed(growth, trie)
        keep = grow(drafter, growth, policy)
        tree = TreeBuilder(root_token)
        at = growth.copy_into(keep, tree)
        for node, copy in policy.trie_node.items():
            if node in at:
                self.copier.note(at[node], trie, copy)  # observe learns r(a) from the copies' outcomes
        stats = PlanStats(
            draft_decodes=len(growth.levels),
            drafted_nodes=sum(growth.levels),
            expected_accept=growth.expected(keep),
        )
        return self.copier.remember(tree.freeze(stats))

    def observe(self, event) -> None:
        self.copier.observe(event.tree, event.accepted_path)


@dataclass
class _HybridGrowth:
    """The hybrid's growth policy: copies as free candidates from the start, merged with the draft's
    (one node per token path); levels while their gain reaches δ; the best by p̂ kept."""

    planner: HybridPlanner
    cap: int  # most draft + copied tokens kept
    capacity: int  # nodes besides the root the draft may evaluate
    q_copy: dict[int, float] = field(default_factory=dict)  # the copier's q of copied nodes
    trie_node: dict[int, int] = field(default_factory=dict)  # copied node → its copy-trie node
    spent: float = 0.0  # seconds of drafting (the cost curves')

    def seed(self, growth: Growth, trie: CopyTrie) -> None:
        """The copies, before any drafting: free candidates."""
        at, trie_q = [0] * trie.size, trie.q  # trie node → work node; the copies' q
        for node in range(1, trie.size):  # parents first
            q = float(trie_q[node])
            at[node] = growth.add(at[trie.parents[node]], trie.tokens[node], q, copied=True)
            self.q_copy[at[node]], self.trie_node[at[node]] = q, node

    def covered(self, growth: Growth, node: int) -> float:
        """The copies' share of the next token after ``node``: Σ q_copy of its children."""
        kids = growth.kids.get(node, {}).values()
        return min(sum(self.q_copy.get(c, 0.0) for c in kids), 1.0)

    def next_level(self, growth: Growth) -> list[int]:
        """The unexpanded nodes among the top ``cap`` by p̂ whose parents the draft has decoded, those
        worth it: node u gains about p̂(u) · A · (1 − the copies' share after u), A the draft's mean
        top-k mass; the level is drafted when the frontier's gain reaches δ."""
        planner, phat = self.planner, growth.tree.path_prob
        if len(growth.levels) >= planner.max_depth:
            return []
        top = set(growth.ranked()[: self.cap]) | {0}
        done = growth.expanded
        ready = [u for u in top if u not in done and (u == 0 or growth.tree.parents[u] in done)]
        gain = {u: phat[u] * planner.top_mass * (1.0 - self.covered(growth, u)) for u in ready}
        frontier = sorted(ready, key=lambda u: (-gain[u], u))[: max(self.capacity - growth.evaluated, 0)]
        if not frontier or sum(gain[u] for u in frontier) < planner.threshold:
            return []
        if planner.costs is not None:
            self.spent += float(planner.costs.d(len(frontier)))
        return sorted(frontier)  # parents before children in the batch

    def admit(self, growth: Growth, nodes: list[int], dists: list[SparseDist]) -> None:
        """Each node's top-k; a token the copies proposed too is one node, its estimate combining both
        as independent evidence (right if either source is): q = 1 − (1 − q_draft)(1 − q_copy)."""
        planner = self.planner
        for u, dist in zip(nodes, dists):
            for token, q in zip(dist.ids[: planner.k].tolist(), dist.probs[: planner.k].tolist()):
                if q <= 0.0:
                    continue
                node = growth.child(u, token)
                if node is None:
                    growth.add(u, token, q)
                else:
                    growth.set_q(node, 1.0 - (1.0 - q) * (1.0 - self.q_copy.get(node, 0.0)))
            mass = float(dist.probs[: planner.k].sum())
            planner.top_mass = TOP_MASS_MEMORY * planner.top_mass + (1 - TOP_MASS_MEMORY) * mass

    def keep(self, growth: Growth) -> list[int]:
        """The top nodes by p̂: ``cap`` of them, or with the cost curves the number that maximises the
        expected rate (1 + Σ p̂) / (drafting + c_t(m + 1)) (``best_size``)."""
        size, ranked = self.cap, growth.ranked()
        if self.planner.costs is not None:
            pool = np.array([growth.tree.path_prob[u] for u in ranked])
            size = best_size(0.0, 0, pool, self.spent, 1.0, self.planner.costs, self.cap).m
        return sorted(ranked[:size])
