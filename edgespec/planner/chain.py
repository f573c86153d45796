"""Chain drafting (SSD, Leviathan et al. / Chen et al.): the draft proposes γ tokens in a row.

One draft decode per token (a level of width 1). Greedy: the draft's top token (one-hot rule).
Sampling: one token drawn from q (residual rule). Optional early exit: stop drafting when the draft's
own probability of its chosen token falls below ``p_min`` (llama.cpp's ``--draft-p-min``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Planner
from .inputs import Drafter, PlanContext, sample_without_replacement
from .params import param
from .tree import ChildRule, DraftTree, PlanStats, TreeBuilder


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
        rule = ChildRule.SAMPLED if ctx.sampling else ChildRule.TOP
        node, decodes = 0, 0
        while tree.size - 1 < gamma:
            (dist,) = drafter.expand(tree, [node])  # one draft decode: q(· | the chain so far)
            decodes += 1
            if dist.ids.size == 0:  # nothing the draft may propose
                break
            # greedy: the draft's top token; sampling: x ~ q (one draw without replacement)
            pick = sample_without_replacement(dist, 1, ctx.rng)[0] if ctx.sampling else 0
            tree.set_children_rule(node, rule)
            q_pick = float(dist.probs[pick])
            node = tree.add(node, int(dist.ids[pick]), q_pick)
            if q_pick < self.p_min:  # the draft is unsure: stop here (llama.cpp's --draft-p-min)
                break
        expected = sum(tree.path_prob[1:])
        return tree.freeze(PlanStats(draft_decodes=decodes, drafted_nodes=decodes, expected_accept=expected))
