"""The worked example of docs/architecture.md, "A strategy that needs something new of the draft": a
chain that stops at a line break needs the text of each drafted token, ``Drafter.piece``. Declared in
the planners' ``Drafter`` (planner/inputs.py), implemented by the engine's ``Draft`` (engine/draft.py)
and by the fakes mypy names; this strategy lives here, not in the strategy table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams
from edgespec.planner.base import Planner
from edgespec.planner.inputs import Drafter, PlanContext
from edgespec.planner.params import param
from edgespec.planner.tree import ChildRule, DraftTree, PlanStats, TreeBuilder
from tests.support.fake_llama import FakeModel, FakePair
from tests.support.fakes import SyntheticDrafter, sparse

PROMPT = [5, 17, 3, 29, 8, 40, 12]


@dataclass
class LineChainPlanner(Planner):
    """Greedy chain of up to γ draft tokens that ends with the first token whose text holds ``stop``
    (a line break by default): what follows a line break is harder to guess."""

    gamma: int = param(8, "γ: most draft tokens per step", minimum=1)
    stop: bytes = b"\n"
    name = "line-chain"

    def describe(self) -> str:
        return f"γ={self.gamma}"

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        tree, node = TreeBuilder(root_token), 0
        while tree.size - 1 < min(self.gamma, ctx.max_nodes - 1):
            (dist,) = drafter.expand(tree, [node])
            if dist.ids.size == 0:
                break
            tree.set_children_rule(node, ChildRule.TOP)
            node = tree.add(node, int(dist.ids[0]), float(dist.probs[0]))
            if self.stop in drafter.piece(int(dist.ids[0])):  # the new capability
                break
        return tree.freeze(PlanStats(draft_decodes=tree.size - 1, drafted_nodes=tree.size - 1))


STOP = FakeModel().piece(11)  # the fake vocabulary's two-byte "é" (tokens 11, 22, 33, 44)


def test_the_chain_ends_at_the_first_stop_token_on_the_engines_own_draft():
    pair = FakePair(draft_noise=0.0)  # the engine's Draft over a fake context: its piece is the engine's
    events = list(generate(pair, LineChainPlanner(stop=STOP), Request(PROMPT, max_tokens=60)))
    trees = [e.tree for e in events if e.tree is not None and e.tree.size > 1]
    stops = 0
    for tree in trees:
        texts = [pair.draft.model.piece(t) for t in tree.token_ids[1:]]
        assert all(STOP not in text for text in texts[:-1])  # no stop token before the last
        stops += STOP in texts[-1]
    assert stops > 0 and any(tree.size == 9 for tree in trees)  # both ways a chain ends happened


def test_it_is_lossless_as_every_strategy():
    plain = [t.id for e in generate(FakePair(), None, Request(PROMPT, max_tokens=60)) for t in e.tokens]
    for noise in (0.0, 1.0):
        pair = FakePair(draft_noise=noise)
        events = generate(pair, LineChainPlanner(stop=STOP), Request(PROMPT, max_tokens=60))
        assert [t.id for e in events for t in e.tokens] == plain


def test_a_planner_unit_test_reads_the_capability_from_the_synthetic_drafter():
    """The planners' own fake: token t reads "<t>"; after a path of n tokens the draft's top is n % 3."""
    drafter = SyntheticDrafter(lambda path: sparse([0.9, 0.1], ids=[len(path) % 3, 7]))
    tree = LineChainPlanner(stop=b"<0>").plan(1, drafter, PlanContext(False, np.random.default_rng(0)))
    assert tree.token_ids == (1, 1, 2, 0)  # stops after "<0>", the first stop text


def test_it_samples_too():
    """Its children follow the one-hot rule (the draft's top token), which is lossless under sampling
    too: the sampled answer is a valid draw, and no stop token is passed mid-chain."""
    pair = FakePair(draft_noise=0.5)
    request = Request(PROMPT, max_tokens=40, sampling=SamplingParams(temperature=0.8, seed=3))
    events = list(generate(pair, LineChainPlanner(stop=STOP), request))
    assert sum(len(e.tokens) for e in events) == 40
