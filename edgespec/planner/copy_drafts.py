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
from .costmodel import CostModel, best_size
from .ngram import Copier, CopyTrie
from .opt_tree import top_nodes
from .params import param
from .tree import (
    ChildRule,
    Drafter,
    DraftTree,
    PlanContext,
    Planner,
    PlanStats,
    SparseDist,
    TreeBuilder,
)

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
    # the pair's cost curves (``use_costs``): size by expected rate
    costs: CostModel | None = field(default=None, compare=False, repr=False)
    name = "ngram"
    needs_draft = False  # no draft model at all: the pair may have none
    wants_costs = True
    copier: Copier = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.copier = Copier(n_max=self.ngram_max, matches=self.matches)

    def use_costs(self, costs: CostModel) -> None:
        self.costs = costs

    def describe(self) -> str:
        size = "sized by cost" if self.costs is not None else f"p̂≥{self.min_accept:g}"
        return f"n≤{self.ngram_max} matches={self.matches} budget={self.budget} {size}"

    def plan(self, root_token: int, drafter: Drafter | None, ctx: PlanContext) -> DraftTree:
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
class _Graph:
    """Candidate tokens keyed by token path (a prefix tree); node 0 is the root, parents first."""

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    q_draft: list[float] = field(default_factory=lambda: [0.0])  # the draft's q, 0: not its candidate
    q_copy: list[float] = field(default_factory=lambda: [0.0])  # the copier's q, 0: not copied
    trie: list[int] = field(default_factory=lambda: [0])  # the copy-trie node, −1: none
    kids: list[dict[int, int]] = field(default_factory=lambda: [{}])  # token → child
    dists: dict[int, SparseDist] = field(default_factory=dict)  # the draft's distribution, expanded nodes

    def child(self, parent: int, token: int) -> int:
        """The node for ``token`` after ``parent``, made if new."""
        node = self.kids[parent].get(token)
        if node is None:
            node = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(parent)
            self.q_draft.append(0.0)
            self.q_copy.append(0.0)
            self.trie.append(-1)
            self.kids.append({})
            self.kids[parent][token] = node
        return node

    def q(self) -> np.ndarray:
        """Combined q: the token is right if either source is (independent evidence)."""
        return 1.0 - (1.0 - np.asarray(self.q_draft)) * (1.0 - np.asarray(self.q_copy))

    def phat(self) -> np.ndarray:
        q = self.q()
        phat = np.ones(len(self.tokens))
        for node in range(1, len(self.tokens)):  # parents come first
            phat[node] = phat[self.parents[node]] * q[node]
        return phat

    def covered(self, node: int) -> float:
        """The copies' share of the next token after ``node``: Σ q_copy of its children."""
        return min(sum(self.q_copy[c] for c in self.kids[node].values()), 1.0)


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
    wants_costs = True
    top_mass: float = field(default=PRIOR_TOP_MASS, repr=False)  # A, learned from the draft's dists
    copier: Copier = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.copier = Copier(n_max=self.ngram_max, matches=self.matches)

    def use_costs(self, costs: CostModel) -> None:
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
        graph = _Graph([int(root_token)])
        copy_at = [0] * trie.size  # trie node → graph node
        for node in range(1, trie.size):  # the copies: free candidates from the start
            copy = copy_at[node] = graph.child(copy_at[trie.parents[node]], trie.tokens[node])
            graph.q_copy[copy], graph.trie[copy] = float(trie.q[node]), node
        cap = min(self.budget, ctx.max_nodes - 1)
        decodes, evaluated, spent = self._draft(graph, drafter, cap, ctx.max_nodes - 1)
        phat = graph.phat()
        size = cap
        if self.costs is not None:
            pool = np.sort(phat[1:])[::-1]
            size = best_size(0.0, 0, pool, spent, 1.0, self.costs, cap).m
        keep = top_nodes(phat, size)
        tree = self._tree(graph, trie, keep)
        stats = PlanStats(
            draft_decodes=decodes, drafted_nodes=evaluated, expected_accept=float(phat[keep].sum())
        )
        return self.copier.remember(tree.freeze(stats))

    def _draft(self, graph: _Graph, drafter: Drafter, cap: int, capacity: int) -> tuple[int, int, float]:
        """Draft levels while they pay (see the module docstring); returns decodes, nodes, seconds."""
        work = TreeBuilder(graph.tokens[0])  # what the draft has seen: expanded nodes and their paths
        at = {0: 0}  # graph node → work-tree node
        decodes = evaluated = 0
        spent = 0.0
        for _ in range(self.max_depth):
            phat = graph.phat()
            top = set(top_nodes(phat, cap).tolist()) | {0}
            ready = [u for u in top if u not in graph.dists and (u == 0 or graph.parents[u] in graph.dists)]
            gain = {u: phat[u] * self.top_mass * (1.0 - graph.covered(u)) for u in ready}
            frontier = sorted(ready, key=lambda u: (-gain[u], u))[: max(capacity - evaluated, 0)]
            if not frontier or sum(gain[u] for u in frontier) < self.threshold:
                break
            frontier.sort()  # parents before children: the work tree grows in graph order
            for u in frontier:
                if u not in at:
                    at[u] = work.add(at[graph.parents[u]], graph.tokens[u], 1.0)
            dists = drafter.expand(work, [at[u] for u in frontier])
            decodes, evaluated = decodes + 1, evaluated + len(frontier)
            if self.costs is not None:
                spent += float(self.costs.d(len(frontier)))
            for u, dist in zip(frontier, dists):
                graph.dists[u] = dist
                for rank in range(min(self.k, dist.ids.shape[0])):
                    if dist.probs[rank] > 0.0:
                        graph.q_draft[graph.child(u, int(dist.ids[rank]))] = float(dist.probs[rank])
                mass = float(dist.probs[: self.k].sum())
                self.top_mass = TOP_MASS_MEMORY * self.top_mass + (1 - TOP_MASS_MEMORY) * mass
        return decodes, evaluated, spent

    def _tree(self, graph: _Graph, trie: CopyTrie, keep: np.ndarray) -> TreeBuilder:
        """The verification tree of the kept graph nodes (index order: parents first)."""
        q = graph.q()
        tree = TreeBuilder(graph.tokens[0])
        at = {0: 0}
        for u in keep:
            u = int(u)
            parent = at[graph.parents[u]]
            at[u] = tree.add(parent, graph.tokens[u], float(q[u]), copied=graph.q_copy[u] > 0.0)
            tree.set_children_rule(parent, ChildRule.TOP)
            if graph.parents[u] in graph.dists:
                tree.dists[parent] = graph.dists[graph.parents[u]]
            if graph.trie[u] >= 0:
                self.copier.note(at[u], trie, graph.trie[u])
        return tree

    def observe(self, event) -> None:
        self.copier.observe(event.tree, event.accepted_path)
