"""Planners used only by tests: shapes no paper prescribes, to stress tree batches and KV bookkeeping."""

from __future__ import annotations

import numpy as np

from edgespec.planner.base import Planner
from edgespec.planner.inputs import PlanContext
from edgespec.planner.tree import ChildRule, PlanStats, TreeBuilder


class RandomTreePlanner(Planner):
    """Bushy random trees: 1–3 children per node from the draft's top candidates, level by level."""

    name = "random-tree"

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


class SometimesSilentPlanner(Planner):
    """Drafts a chain on some steps and nothing at all on others (as `auto` does when plain decoding
    wins), so the draft must catch up on several pending tokens."""

    name = "sometimes-silent"

    def __init__(self, gamma: int = 3, period: int = 3):
        self.gamma, self.period, self.calls = gamma, period, 0

    def describe(self) -> str:
        return f"γ={self.gamma} every {self.period}"

    def plan(self, root_token, drafter, ctx: PlanContext):
        self.calls += 1
        tree = TreeBuilder(root_token)
        if self.calls % self.period:
            return tree.freeze()
        node = 0
        for _ in range(self.gamma):
            (dist,) = drafter.expand(tree, [node])
            tree.set_children_rule(node, ChildRule.TOP)
            node = tree.add(node, int(dist.ids[0]), float(dist.probs[0]))
        return tree.freeze(PlanStats(draft_decodes=self.gamma))
