"""Planners used only by tests: shapes no paper prescribes, to stress tree batches and KV bookkeeping."""

from __future__ import annotations

import numpy as np

from edgespec.planner.tree import ChildRule, PlanContext, PlanStats, TreeBuilder


class RandomTreePlanner:
    """Bushy random trees: 1–3 children per node from the draft's top candidates, level by level."""

    name = "random-tree"
    lossy = False

    def __init__(self, budget: int, seed: int = 0):
        self.budget = budget
        self.rng = np.random.default_rng(seed)

    def describe(self) -> str:
        return f"budget={self.budget}"

    def plan(self, root_token, drafter, ctx: PlanContext):
        tree = TreeBuilder(root_token)
        frontier, decodes = [0], 0
        limit = min(self.budget, ctx.max_nodes - 1)
        while frontier and tree.size - 1 < limit:
            dists = drafter.expand(tree, frontier)
            decodes += 1
            nxt = []
            for node, dist in zip(frontier, dists):
                tree.set_children_rule(node, ChildRule.TOP)
                for j in range(int(self.rng.integers(1, 4))):
                    if tree.size - 1 >= limit:
                        break
                    child = tree.add(node, int(dist.ids[j]), float(dist.probs[j]))
                    if self.rng.random() < 0.7:
                        nxt.append(child)
            frontier = nxt
        return tree.freeze(PlanStats(draft_decodes=decodes))
