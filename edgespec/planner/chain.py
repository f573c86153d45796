"""Chain drafting (SSD, Leviathan et al. / Chen et al.): the draft proposes γ tokens in a row.

One draft decode per token (a level of width 1). Greedy: the draft's top token (one-hot rule), the
whole chain drafted by ``Drafter.greedy_chain`` (the engine's runs in one compiled call, no Python
between the decodes). Sampling: one token drawn from q (residual rule), level by level. Optional
early exit: stop drafting when the draft's own probability of its chosen token falls below ``p_min``
(llama.cpp's ``--draft-p-min``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .params import param
from .tree import (
    ChildRule,
    Drafter,
    DraftTree,
    PlanContext,
    Planner,
    PlanStats,
    TreeBuilder,
    sample_without_replacement,
)


@dataclass
class ChainPlanner(Planner):
    gamma: int = param(4, "γ: draft tokens per step", minimum=1)
    p_min: float = param(
        0.0,
        "stop drafting when the draft's probability of its token is below it (0: off)",
        minimum=0,
        maximum=1,
    )
    name = "chain"

    def describe(self) -> str:
        return f"γ={self.gamma}" + (f" p_min={self.p_min:g}" if self.p_min > 0 else "")

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        tree = TreeBuilder(root_token)
        gamma = min(self.gamma, ctx.max_nodes - 1)
        if ctx.sampling:
            decodes = self._sampled_chain(tree, drafter, gamma, ctx.rng)
        else:
            decodes = drafter.greedy_chain(tree, gamma, self.p_min)
        expected = sum(tree.path_prob[1:])
        return tree.freeze(PlanStats(draft_decodes=decodes, drafted_nodes=decodes, expected_accept=expected))

    def _sampled_chain(self, tree: TreeBuilder, drafter: Drafter, gamma: int, rng) -> int:
        """Each token drawn from the draft's q at its level; returns the decodes."""
        node, decodes = 0, 0
        while tree.size - 1 < gamma:
            (dist,) = drafter.expand(tree, [node])
            decodes += 1
            (pick,) = sample_without_replacement(dist, 1, rng)
            tree.set_children_rule(node, ChildRule.SAMPLED)
            q_pick = float(dist.probs[pick])
            node = tree.add(node, int(dist.ids[pick]), q_pick)
            if q_pick < self.p_min:
                break
        return decodes
