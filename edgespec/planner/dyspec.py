"""DySpec — greedy dynamic token trees (Xiong et al. 2024, Algorithms 1 and 2).

Every node u holds a residual R_u: its draft distribution with the tokens already drawn at u
removed and renormalised. The next draw at u is reached only if u was accepted and every earlier
draw at u rejected; with the draft probability as the acceptance estimate, that has value v.
Algorithm 1 keeps a heap of these "next draw" slots, keyed by v, and repeatedly (until the budget):

    pop (R, v, u); draw y ~ R; add y as a child of u
    v0 = v · R[y]          # the first draw below y: reached if y is accepted
    v1 = v · (1 − R[y])    # the next draw at u: reached if y is rejected
    R[y] ← 0; R ← norm(R); push (R, v1, u); push (D(·|y), v0, y)

Values only shrink along the heap's history, so the tree holds exactly the slots of largest value.

**Batching the draft decodes (fixed budget, ``threshold = 0``).** Algorithm 1 calls the draft once
per node (line 14). Here the slot of a new node y is pushed without its distribution; only when such
a slot reaches the top of the heap is the draft run — on every pending slot among the heap's best r
entries (r = budget left). A slot outside those r can never be popped (r pops of better slots come
first and spend the budget), so nothing that will be needed is left out, and the pop order — hence
the tree — is exactly Algorithm 1's. The price is that some of the r may end up never popped: they
are evaluated by the draft for nothing. In practice this takes a handful of decodes per step.

**Threshold variant (``threshold = t > 0``, Algorithm 2).** Layer by layer: one decode evaluates
every node of the layer whose value is ≥ t, then each draws while its next slot's value is ≥ t
(the paper's pseudo-code writes ``v < t``; the text — "extend all nodes with estimated acceptance
rate above the threshold" — means ≥). One decode per layer; ``budget`` still caps the size, the
layer's best slots first. With t equal to the value of Algorithm 1's last pop it builds the same tree.

Greedy target: y is the most likely remaining token (``ChildRule.TOP``). Sampling: y is drawn from
R — without replacement from q — and the verifier undoes exactly that with the residual rule
(``ChildRule.SAMPLED``, DySpec Alg. 3). The draws at a node use the Gumbel-top-k trick with noise
from the node's own stream (``node_rng``: step seed and token path, encoded unambiguously), so they
do not depend on the order in which nodes are expanded; both variants draw the same tokens at the
same node.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import params
from .base import Planner
from .inputs import Drafter, PlanContext, node_rng, step_seed
from .params import param
from .tree import ChildRule, DraftTree, PlanStats, SparseDist, TreeBuilder


def draw_order(dist: SparseDist, seed: int | None, path: Sequence[int]) -> np.ndarray:
    """The positions of ``dist`` in the order successive draws at this node take them.

    Greedy (``seed is None``): most likely first. Sampling: sorting log q + Gumbel noise descending
    gives a sequence distributed exactly as sequential draws without replacement from q (each next
    one ∝ the q that is left) — the Gumbel-top-k trick (Kool et al. 2019).
    """
    q = dist.sampling_q()
    live = np.flatnonzero(q > 0.0)
    if seed is None:
        return live  # the probabilities are sorted, descending
    rng = node_rng(seed, path)
    keys = np.log(q[live]) + rng.gumbel(size=live.shape[0])
    return live[np.argsort(-keys, kind="stable")]


class Residual:
    """R for one node: its draft distribution minus the tokens already drawn there."""

    def __init__(self, dist: SparseDist, order: np.ndarray):
        self.dist = dist
        self.order = order
        # left[i]: the draft mass still in R before the i-th draw, Σ_{j ≥ i} p[order[j]], summed from the
        # last draw back (q = p / Σp: the normaliser cancels in R[y] = q(y) / Σ q left = p(y) / left)
        self.left = np.cumsum(dist.probs[order][::-1])[::-1]
        self.drawn = 0

    @property
    def exhausted(self) -> bool:
        return self.drawn >= self.order.shape[0]

    def draw(self) -> tuple[int, float]:
        """The next token's position in the distribution, and R[y]: its share of the mass left."""
        pos = int(self.order[self.drawn])
        r_y = float(self.dist.probs[pos] / self.left[self.drawn])
        self.drawn += 1
        return pos, r_y


def _evaluate(tree: TreeBuilder, drafter: Drafter, nodes, seed, residual: dict[int, Residual]) -> None:
    dists = drafter.expand(tree, nodes)
    for node, dist in zip(nodes, dists):
        residual[node] = Residual(dist, draw_order(dist, seed, tree.path_tokens(node)))


def dyspec_by_levels(
    drafter: Drafter,
    tree: TreeBuilder,
    budget: int,
    max_passes: int = 0,
    seed: int | None = None,
    rule: ChildRule = ChildRule.TOP,
) -> tuple[int, int]:
    """Algorithm 1 with the draft decodes batched (see the module docstring), through ``expand``;
    returns (draft decodes, nodes evaluated). ``max_passes``: most draft decodes (0: no limit); ``seed``:
    the step's seed for sampled draws (None: greedy, each draw the most likely remaining token)."""
    heap = [(-1.0, 0, 0)]  # (−v, push order, node): the next draw at node; the root's value is 1
    pushes, decodes, evaluated = 1, 0, 0
    residual: dict[int, Residual] = {}
    while heap and tree.size - 1 < budget:
        neg_v, _, node = heap[0]
        if node not in residual and max_passes and decodes >= max_passes:
            heapq.heappop(heap)  # no draft pass left this step: a node not drafted gets no children
            continue
        if node not in residual:  # line 14, deferred: draft every pending slot that may still pop
            room = budget - (tree.size - 1)
            batch = sorted({u for _, _, u in heapq.nsmallest(room, heap) if u not in residual})
            _evaluate(tree, drafter, batch, seed, residual)
            decodes, evaluated = decodes + 1, evaluated + len(batch)
            continue
        heapq.heappop(heap)
        v, r = -neg_v, residual[node]
        if r.exhausted:  # an empty distribution (every candidate banned): nothing to draw
            continue
        pos, r_y = r.draw()  # line 7: y ~ R
        child = tree.add(node, int(r.dist.ids[pos]), float(r.dist.probs[pos]))  # line 6
        tree.set_children_rule(node, rule)
        v0, v1 = v * r_y, v * (1.0 - r_y)  # lines 8–9
        if not r.exhausted and v1 > 0.0:  # lines 10–12: R[y] ← 0 (the draw order skips y)
            heapq.heappush(heap, (-v1, pushes, node))
            pushes += 1
        if v0 > 0.0:  # line 15: the child's distribution is drafted when its slot comes up
            heapq.heappush(heap, (-v0, pushes, child))
            pushes += 1
    return decodes, evaluated


@dataclass
class DySpecPlanner(Planner):
    budget: int = param(32, "m: " + params.BUDGET, minimum=1)
    threshold: float = param(
        0.0,
        "t: 0 → fixed budget (Alg. 1); > 0 → draw every slot of value ≥ t, layer by layer (Alg. 2)",
        minimum=0,
        maximum=1,
    )
    max_passes: int = param(0, "most draft passes per step (0: as many as the tree needs)", minimum=0)
    name = "dyspec"

    def describe(self) -> str:
        passes = f" passes≤{self.max_passes}" if self.max_passes else ""
        return f"budget={self.budget}" + (f" t={self.threshold:g}" if self.threshold > 0 else "") + passes

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        tree = TreeBuilder(root_token)
        seed = step_seed(ctx) if ctx.sampling else None
        rule = ChildRule.SAMPLED if ctx.sampling else ChildRule.TOP
        budget = min(self.budget, ctx.max_nodes - 1)
        if self.threshold > 0:
            decodes, evaluated = self._by_threshold(tree, drafter, budget, seed, rule)
        else:
            decodes, evaluated = dyspec_by_levels(drafter, tree, budget, self.max_passes, seed, rule)
        stats = PlanStats(
            draft_decodes=decodes, drafted_nodes=evaluated, expected_accept=sum(tree.path_prob[1:])
        )
        return tree.freeze(stats)

    def _by_threshold(self, tree: TreeBuilder, drafter: Drafter, budget: int, seed, rule) -> tuple[int, int]:
        """Algorithm 2: one draft decode per layer; every slot of value ≥ t is drawn."""
        t = self.threshold
        layer = [(0, 1.0)]  # (node, v: the value of its first draw)
        decodes, evaluated = 0, 0
        residual: dict[int, Residual] = {}
        while layer and tree.size - 1 < budget and not (self.max_passes and decodes >= self.max_passes):
            room = budget - (tree.size - 1)
            grow = sorted(layer, key=lambda nv: -nv[1])[:room]  # each must add ≥ 1 child to be worth it
            grow = sorted(nv for nv in grow if nv[1] >= t)
            if not grow:
                break
            _evaluate(tree, drafter, [u for u, _ in grow], seed, residual)
            decodes, evaluated = decodes + 1, evaluated + len(grow)
            heap = [(-v, i, u) for i, (u, v) in enumerate(grow)]
            heapq.heapify(heap)
            pushes, layer = len(heap), []
            while heap and tree.size - 1 < budget:  # the layer's slots, best first
                neg_v, _, node = heapq.heappop(heap)
                v, r = -neg_v, residual[node]
                if r.exhausted:  # an empty distribution
                    continue
                pos, r_y = r.draw()
                child = tree.add(node, int(r.dist.ids[pos]), float(r.dist.probs[pos]))
                tree.set_children_rule(node, rule)
                layer.append((child, v * r_y))
                v1 = v * (1.0 - r_y)
                if not r.exhausted and v1 >= t:
                    heapq.heappush(heap, (-v1, pushes, node))
                    pushes += 1
        return decodes, evaluated
