"""GSD — graph-structured speculative decoding (Gong et al. 2024, §5).

Drafting is TSD's (§4: top-k children, probability and sibling pruning, level by level), with one
addition. A node is **τ-redundant** when the τ-gram ending at it (the last τ tokens of its path)
already ends at an earlier node f of the draft (§5.2). A redundant node c becomes a leaf that is
never sent to the draft, and gets a merge edge to f: the hypotheses through c continue with f's
subtree, drafted once and shared (§5.3). The draft is then a DAG — the ``TokenGraph``.

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
from .params import param
from .tree import ChildRule, Drafter, DraftTree, PlanContext, Planner, PlanStats, TreeBuilder
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

    def sink_paths(self) -> list[tuple[int, ...]]:
        """Token sequences of every root→sink path of the graph (the hypotheses it holds)."""
        paths, stack = [], [(0, (self.tree.tokens[0],))]
        while stack:
            node, tokens = stack.pop()
            succ = self.successors(node)
            if not succ:
                paths.append(tokens)
            for nxt in succ:
                stack.append((nxt, (*tokens, self.tree.tokens[nxt])))
        return paths


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
        """Draft the token graph level by level; returns it and the number of draft decodes."""
        graph = TokenGraph(TreeBuilder(root_token))
        tree, tau = graph.tree, self.tau
        budget = min(self.budget, ctx.max_nodes - 1)
        tail = [(int(root_token),)[-tau:]]  # the last ≤ τ tokens of each node's path
        ends: dict[tuple[int, ...], list[int]] = {}  # τ-gram → the graph nodes it ends at, oldest first
        if tau == 1:
            ends[tail[0]] = [0]
        verified = 0  # size of the unmerged tree, root excluded
        copies, stale = [1], False  # copies[g]: g's copies once unmerged (stale after a merge)
        frontier, decodes = [0], 0
        for _ in range(self.max_depth):
            frontier = best_by_path_prob(tree, frontier, budget - verified)
            if not frontier:
                break
            dists = drafter.expand(tree, frontier)
            graph.expanded.extend(frontier)
            decodes += 1
            grown = []
            for cand in ranked_children(tree, frontier, dists, self.k, self.theta_prob, self.theta_sib):
                if verified >= budget:
                    break
                if stale:
                    copies, _ = graph.unmerged_counts()
                    stale = False
                parent = cand.parent
                gram = (*tail[parent], cand.token)[-tau:]
                seen = ends.get(gram, []) if len(gram) == tau else []
                # The first occurrence whose merge edge would not close a cycle (one on c's own path would).
                f = next((g for g in seen if not graph.reaches(g, parent)), None)
                merge = f is not None
                if merge:
                    copies, sub = graph.unmerged_counts()
                    cost = copies[parent] * sub[f]  # c's every copy gets a replica of f's subtree
                    merge = verified + cost <= budget  # otherwise: a plain (redundant) leaf
                if not merge:
                    cost = copies[parent]
                    if verified + cost > budget:
                        continue  # a cheaper candidate (a parent with fewer copies) may still fit
                child = graph.add(parent, cand.token, cand.q)
                tree.set_children_rule(parent, ChildRule.TOP)  # deterministic top-k: one-hot rule
                tail.append(gram)
                copies.append(copies[parent])
                verified += cost
                if merge:
                    graph.alias[child] = f  # the merge edge; c is a leaf that is never drafted
                    stale = True
                elif f is None:  # new, or only repeated on its own path: an ordinary node
                    if len(gram) == tau:
                        ends.setdefault(gram, []).append(child)
                    if cand.grows:
                        grown.append(child)
                # else: redundant, but its merge did not fit the budget — a plain leaf
            frontier = grown
        return graph, decodes
