"""ParallelSpec — a parallel drafter proposes a whole tree in one draft pass (Xiao et al. 2024, §4.2).

The draft reads the context, the pending root, then [MASK]_1 … [MASK]_K, and returns K + 1
distributions from that one forward pass (``Drafter.parallel_dists``):

    q_1     = q(· | x_≤n)                       the root's row: the next token
    q_{k+1} = q(· | x_≤n, [MASK]_1 … [MASK]_k)   mask k's row: the token k + 1 places on

q_{d+1} is the draft's guess at depth d + 1 *whatever comes between*, so every node at depth d takes
its children from the same q_{d+1}: the tree lives in the product of the per-depth distributions,
at most K + 1 deep, and is built with no further draft decode.

Greedy target — which nodes (OPT-Tree's selection). Taking the draft's probabilities as estimates of
the target's, a node v with path tokens y_1 … y_d is accepted with p̂(v) = Π_{i ≤ d} q_i(y_i), and a
tree T yields E(A) = Σ_{v ∈ T} p̂(v) accepted tokens. The best tree of n nodes is the n nodes of the
product tree with the largest p̂ (OPT-Tree, Theorem 3.1): p̂ never grows from a node to its child, nor
from a child to its next-ranked sibling, so those n form a subtree whose children are, at each node,
a prefix of its depth's ranking. They are found best first with a heap of slots, one per node: u's
slot offers its next-ranked child, of p̂(u) · q_{d+1}(next). Popping it adds that child, then u's
slot offers the following one and the child's slot its own first child. Every node not yet taken
lies below a slot whose offer is at least its p̂, so each pop takes the best node left: the result
is exactly the top n (ties: the earlier slot). Children are the draft's top tokens (ChildRule.TOP),
verified by the one-hot rule.

Sampling target. Each node's children are drawn from q_{d+1} without replacement — the Gumbel-top-k
order of ``dyspec.draw_order``, on the node's own stream (``node_rng``: the step seed and the token
path) — and verified by the residual rule (ChildRule.SAMPLED) against ``tree.dists[u] = q_{d+1}``.
That rule is exact for any draft distribution, path-dependent or not, as long as it is the one the
children were drawn from. Which slot next is DySpec's rule (Algorithm 1): a slot's value v is the
chance that its draw is reached; drawing y (R[y]: y's share of what is left of q) gives the child's
first slot v · R[y] (the chance y is accepted, were the target the draft) and the node's next slot
v · (1 − R[y]). Values never grow, so popping by value takes the n slots of largest value. How many
children a node gets depends only on the draft's own draws, never on the target's: the residual rule
stays exact (the losslessness harness checks it).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from .base import Planner
from .dyspec import Residual, draw_order
from .inputs import Drafter, DraftSetup, PlanContext, step_seed
from .params import param
from .tree import ChildRule, DraftTree, PlanStats, SparseDist, TreeBuilder

ADAPTER_HELP = (
    "the parallel drafter's GGUF LoRA adapter (default: the pair's trained one, if it has one; "
    "'none': the plain draft with untrained masks)"
)


@dataclass
class ParallelSpecPlanner(Planner):
    k: int = param(
        4, "K: [MASK] tokens per draft pass (at most the adapter's K); the tree is ≤ K + 1 deep", minimum=1
    )
    budget: int = param(16, "n: draft tokens in the tree, root excluded", minimum=1)
    adapter: str = param("", ADAPTER_HELP)
    name = "parallelspec"

    def describe(self) -> str:
        trained = "untrained" if self.adapter in ("", "none") else "trained"
        return f"K={self.k} budget={self.budget} {trained}"

    def draft_setup(self) -> DraftSetup:
        return DraftSetup(masks=self.k, adapter="" if self.adapter == "none" else self.adapter)

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        tree = TreeBuilder(root_token)
        n = min(self.budget, ctx.max_nodes - 1)
        if n <= 0:
            return tree.freeze()
        # A tree of n nodes is at most n deep: it needs q_1 … q_n, so at most n − 1 masks. (This also
        # keeps the masks within the room the decoder leaves for the n + 1 tree tokens.)
        k = min(self.k, n - 1)
        dists = drafter.parallel_dists(tree, k)  # q_1 … q_{k+1}: the one draft decode
        grow(tree, dists, n, step_seed(ctx) if ctx.sampling else None)
        expected = float(sum(tree.path_prob[1:]))
        return tree.freeze(PlanStats(draft_decodes=1, drafted_nodes=k + 1, expected_accept=expected))


def grow(tree: TreeBuilder, dists: Sequence[SparseDist], n: int, seed: int | None) -> None:
    """Add up to n nodes below the root: depth d's children from ``dists[d]`` (see the module
    docstring). ``seed``: None for the draft's top tokens (greedy), else the step seed of the draws."""
    rule = ChildRule.TOP if seed is None else ChildRule.SAMPLED
    draws: dict[int, Residual] = {}  # node → what is left of its depth's q
    heap: list[tuple[float, int, int, float]] = []  # (−key, push order, node, v)
    order = itertools.count()  # ties: the earlier slot

    def offer(node: int, v: float) -> None:
        """Open ``node``'s slot: its next child. Key: that child's p̂ (greedy), or v (sampling)."""
        r = draws.get(node)
        if r is None:
            dist = dists[tree.depth[node]]
            r = draws[node] = Residual(dist, draw_order(dist, seed, tree.path_tokens(node)))
        if r.exhausted or v <= 0.0:
            return
        key = v if seed is not None else tree.path_prob[node] * float(r.dist.probs[r.order[r.drawn]])
        heapq.heappush(heap, (-key, next(order), node, v))

    offer(0, 1.0)
    while heap and tree.size - 1 < n:
        _, _, node, v = heapq.heappop(heap)
        r = draws[node]
        pos, r_y = r.draw()  # y: the best remaining token (greedy) or the next draw (sampling)
        child = tree.add(node, int(r.dist.ids[pos]), float(r.dist.probs[pos]))
        tree.set_children_rule(node, rule)
        tree.dists[node] = r.dist  # the q the children were taken from: the verifier's q
        offer(node, v * (1.0 - r_y))  # the next draw at node: reached if y is rejected
        if tree.depth[child] < len(dists):  # depth K + 1 has no distribution below it
            offer(child, v * r_y)  # the first draw below y: reached if y is accepted
