"""GSD — graph-structured speculative decoding (Gong et al. 2024, §5).

Drafting is TSD's (§4: top-k children, probability and sibling pruning, level by level), with one
addition. A node is **τ-redundant** when the τ-gram ending at it (the last τ tokens of its path)
already ends at an earlier node f of the draft (§5.2). A redundant node c becomes a leaf that is
never sent to the draft, and gets a merge edge to f: the hypotheses through c continue with f's
subtree, drafted once and shared (§5.3). The draft is then a DAG — the ``TokenGraph``. The rule is
``tau_merge_target`` (over the index of τ-grams, ``TauGrams``); what each node costs once unmerged is
``UnmergedBudget``; ``GSDPlanner.build_graph`` is the level loop that uses both.

For verification the graph is unmerged back into a tree (§5.4): under every merged node c the
successors of f are replicated (``merged=True``; their draft probabilities copied from the
originals; never decoded by the draft). ``budget`` counts these verified (unmerged) tokens.

Why merging stays lossless here: every child is a deterministic function of the draft's outputs
(top-k, pruning, merging), so the one-hot rule (``ChildRule.TOP``) verifies any such proposals
exactly, greedy or sampling. The replicated tokens merely come from f's distribution rather than
c's own; that changes what is proposed, never what is emitted. (The residual rule could not be used
for them: it needs children drawn from the node's own q.) Hence GSD uses TOP rules under sampling too.

One case the paper leaves open: when the first occurrence lies on c's own path (a τ-gram repeated
within one hypothesis, e.g. a loop), a merge edge would close a cycle. c then merges into the first
occurrence that does not, or, if every one does, stays an ordinary node. So two graph nodes share a
τ-gram only when one lies on the other's path.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from . import params
from .base import Planner
from .inputs import Drafter, PlanContext
from .params import param
from .tree import ChildRule, DraftTree, PlanStats, TreeBuilder
from .tsd import best_by_path_prob, ranked_children


@dataclass
class TokenGraph:
    """The GSD draft: every drafted token (in ``tree``, under the node whose distribution proposed
    it) plus merge edges. Graph nodes are the tree's nodes except merged ones; a merged node c is the
    same graph node as ``alias[c]``, so an edge into c is an edge into the first occurrence."""

    tree: TreeBuilder
    alias: dict[int, int] = field(default_factory=dict)  # τ-redundant node → first occurrence of its τ-gram
    kids: list[list[int]] = field(default_factory=lambda: [[]])  # tree children, in the order chosen
    expanded: list[int] = field(default_factory=list)  # nodes the draft evaluated, in order

    def add(self, parent: int, token: int, q: float) -> int:
        node = self.tree.add(parent, token, q)
        self.kids.append([])
        self.kids[parent].append(node)
        return node

    def resolve(self, node: int) -> int:
        return self.alias.get(node, node)

    def successors(self, node: int) -> list[int]:
        return [self.resolve(c) for c in self.kids[node]]

    @property
    def nodes(self) -> list[int]:
        return [i for i in range(self.tree.size) if i not in self.alias]

    def reaches(self, src: int, dst: int) -> bool:
        """Is ``dst`` reachable from ``src`` (itself included) along graph edges?"""
        seen, stack = {src}, [src]
        while stack:
            node = stack.pop()
            if node == dst:
                return True
            for nxt in self.successors(node):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False

    def topological_order(self) -> list[int]:
        """Graph nodes reachable from the root, every node before its successors (DFS postorder, reversed)."""
        post, seen = [], {0}
        stack = [(0, iter(self.successors(0)))]
        while stack:
            node, it = stack[-1]
            for nxt in it:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, iter(self.successors(nxt))))
                    break
            else:
                stack.pop()
                post.append(node)
        return post[::-1]

    def unmerged_counts(self) -> tuple[list[int], list[int]]:
        """(copies, sub) per node of the unmerged tree.

        copies[g]: how many times graph node g appears once unmerged = the number of root→g paths;
        sub[g]: the size of the unmerged subtree below (and including) one copy of g.
        """
        order = self.topological_order()
        copies, sub = [0] * self.tree.size, [0] * self.tree.size
        copies[0] = 1
        for node in order:  # paths into a node: the sum over its predecessors
            for nxt in self.successors(node):
                copies[nxt] += copies[node]
        for node in reversed(order):  # a copy of g carries a copy of every successor's subtree
            sub[node] = 1 + sum(sub[nxt] for nxt in self.successors(node))
        for c, f in self.alias.items():
            copies[c], sub[c] = copies[self.tree.parents[c]], sub[f]
        return copies, sub


def unmerge(graph: TokenGraph) -> TreeBuilder:
    """The verification tree: the drafted tokens keep their indices (the draft model's bookkeeping
    refers to them), then every merged node c receives a replica of its first occurrence's subtree."""
    src = graph.tree
    out = TreeBuilder(src.tokens[0])
    for node in range(1, src.size):
        out.add(src.parents[node], src.tokens[node], src.draft_prob[node])
    out.child_rule[:] = src.child_rule
    out.dists.update(src.dists)
    # Replicate breadth-first: (graph node whose children to copy, the tree node that receives them).
    queue = deque((f, c) for c, f in sorted(graph.alias.items()))
    while queue:
        origin, dest = queue.popleft()
        if graph.kids[origin]:
            out.set_children_rule(dest, ChildRule.TOP)
            out.dists[dest] = src.dists[origin]  # the distribution these children were taken from
        for kid in graph.kids[origin]:
            copy = out.add(dest, src.tokens[kid], src.draft_prob[kid], merged=True)
            queue.append((graph.resolve(kid), copy))
    return out


@dataclass
class TauGrams:
    """The τ-grams of the graph (§5.2): the one ending at every node (its last ≤ τ path tokens) and,
    per full τ-gram, the ordinary nodes it ends at, oldest first — where a later node may merge."""

    tau: int
    tail: list[tuple[int, ...]]  # tail[node]: the last ≤ τ tokens of the node's path
    ends: dict[tuple[int, ...], list[int]] = field(default_factory=dict)  # τ-gram → nodes, oldest first

    @classmethod
    def start(cls, root_token: int, tau: int) -> TauGrams:
        grams = cls(tau, [])
        grams.add(0, (int(root_token),)[-tau:], ordinary=True)
        return grams

    def ending_with(self, parent: int, token: int) -> tuple[int, ...]:
        """The τ-gram a new child ``token`` of ``parent`` would end."""
        return (*self.tail[parent], token)[-self.tau :]

    def occurrences(self, gram: tuple[int, ...]) -> list[int]:
        return self.ends.get(gram, []) if len(gram) == self.tau else []  # shorter: too near the root

    def add(self, node: int, gram: tuple[int, ...], ordinary: bool) -> None:
        self.tail.append(gram)
        if ordinary and len(gram) == self.tau:  # merged nodes and redundant leaves are no merge targets
            self.ends.setdefault(gram, []).append(node)


def tau_merge_target(graph: TokenGraph, grams: TauGrams, parent: int, gram: tuple[int, ...]) -> int | None:
    """§5.2: the node f a new child of ``parent`` ending τ-gram ``gram`` is τ-redundant with — the first
    earlier node that τ-gram ends at — or None. An f on the child's own path is skipped: if ``parent``
    is reachable from f, the merge edge child → f would close a cycle."""
    return next((f for f in grams.occurrences(gram) if not graph.reaches(f, parent)), None)


@dataclass
class UnmergedBudget:
    """The budget counts verified tokens, i.e. the graph unmerged into a tree (§5.4). A graph node g
    appears copies[g] times there (once per root→g path), so a new child of p costs copies[p] tokens;
    merging it into f costs copies[p] · sub[f] (f's subtree replicated under each copy)."""

    graph: TokenGraph
    limit: int  # verified draft tokens, root excluded
    used: int = 0
    copies: list[int] = field(default_factory=lambda: [1])  # copies[g] once unmerged; the root: 1
    stale: bool = False  # a merge changed the counts since ``copies`` was computed

    def left(self) -> int:
        return self.limit - self.used

    def fits(self, cost: int) -> bool:
        return self.used + cost <= self.limit

    def node_cost(self, parent: int) -> int:
        if self.stale:
            self.copies, _ = self.graph.unmerged_counts()
            self.stale = False
        return self.copies[parent]

    def merge_cost(self, parent: int, f: int) -> int:
        self.copies, sub = self.graph.unmerged_counts()
        self.stale = False
        return self.copies[parent] * sub[f]

    def charge(self, parent: int, cost: int, merged: bool) -> None:
        """A child of ``parent`` was added: it has as many copies as its parent."""
        self.copies.append(self.copies[parent])
        self.used += cost
        self.stale = self.stale or merged


@dataclass
class GSDPlanner(Planner):
    k: int = param(4, params.K, minimum=1)
    tau: int = param(
        2, "τ: a node whose last τ path tokens already end at an earlier node is merged into it", minimum=1
    )
    theta_prob: float = param(0.2, params.THETA_PROB, minimum=0, maximum=1)
    theta_sib: float = param(0.3, params.THETA_SIB, minimum=0, maximum=1)
    max_depth: int = param(10, params.MAX_DEPTH, minimum=1)
    budget: int = param(32, "most verified (unmerged) draft tokens per step, root excluded", minimum=1)
    name = "gsd"

    def describe(self) -> str:
        return (
            f"k={self.k} τ={self.tau} θ_prob={self.theta_prob:g} θ_sib={self.theta_sib:g} "
            f"depth≤{self.max_depth} budget={self.budget}"
        )

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        graph, decodes = self.build_graph(root_token, drafter, ctx)
        tree = unmerge(graph)
        stats = PlanStats(
            draft_decodes=decodes,
            drafted_nodes=len(graph.expanded),
            merges=len(graph.alias),
            expected_accept=float(sum(tree.path_prob[1:])),
        )
        return tree.freeze(stats)

    def build_graph(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> tuple[TokenGraph, int]:
        """Draft the token graph level by level (§5); returns it and the number of draft decodes.

        Per level: expand the frontier (one draft decode), rank its children as TSD does (top-k,
        θ_prob / θ_sib pruning), merge the τ-redundant ones, and count each against the budget.
        """
        graph = TokenGraph(TreeBuilder(root_token))
        tree = graph.tree
        grams = TauGrams.start(root_token, self.tau)
        budget = UnmergedBudget(graph, min(self.budget, ctx.max_nodes - 1))
        frontier, decodes = [0], 0
        for _ in range(self.max_depth):
            # 1. Expand a level: the frontier nodes most likely by path probability that can still fit.
            frontier = best_by_path_prob(tree, frontier, budget.left())
            if not frontier:
                break
            dists = drafter.expand(tree, frontier)
            graph.expanded.extend(frontier)
            decodes += 1
            grown = []
            # 2. Rank the children, best first (TSD §4).
            for cand in ranked_children(tree, frontier, dists, self.k, self.theta_prob, self.theta_sib):
                if budget.left() <= 0:
                    break
                parent = cand.parent
                gram = grams.ending_with(parent, cand.token)
                # 3. τ-merge (§5.2–5.3): a τ-redundant child merges into f when f's replicas fit.
                f = tau_merge_target(graph, grams, parent, gram)
                into = None  # f, when the merge is made
                if f is not None:
                    cost = budget.merge_cost(parent, f)
                    if budget.fits(cost):  # otherwise: a plain (redundant) leaf
                        into = f
                # 4. Count the budget: an unmerged child costs one token per copy of its parent.
                if into is None:
                    cost = budget.node_cost(parent)
                    if not budget.fits(cost):
                        continue  # a cheaper candidate (a parent with fewer copies) may still fit
                child = graph.add(parent, cand.token, cand.q)
                tree.set_children_rule(parent, ChildRule.TOP)  # deterministic top-k: one-hot rule
                budget.charge(parent, cost, merged=into is not None)
                grams.add(child, gram, ordinary=f is None)  # new, or only repeated on its own path
                if into is not None:
                    graph.alias[child] = into  # the merge edge; the child is a leaf that is never drafted
                elif f is None and cand.grows:
                    grown.append(child)
                # else: redundant, but its merge did not fit the budget — a plain leaf
            frontier = grown
        return graph, decodes
