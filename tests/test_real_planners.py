"""Every tree/graph strategy on the real bundled pair.

Temperature 0: the output equals plain greedy decoding on the engine's prompt set, up to a
divergence at a near-tie within the measured batch noise (see realmodels.py). Temperature > 0: each
strategy runs with the lossless rule that matches how its children were chosen.
"""

from __future__ import annotations

import pytest
from realmodels import chat_prompt, first_divergence

from edgespec.decoder import Request, generate
from edgespec.planner.registry import make_planner
from edgespec.planner.tree import ChildRule
from edgespec.sampling import SamplingParams

pytestmark = pytest.mark.model

TOKENS = 48  # compared against the first 48 tokens of plain decoding
STRATEGIES = {
    "tsd": ChildRule.TOP,
    "gsd": ChildRule.TOP,
    "opt-tree": ChildRule.TOP,
    "dyspec": ChildRule.SAMPLED,
    "mcsd": ChildRule.SAMPLED,
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_greedy_equals_plain_decoding(pair, plain_runs, batch_noise, strategy):
    flips = steps = accepted = 0
    for text, (plain_tokens, plain_margins) in plain_runs.items():
        request = Request(prompt=chat_prompt(pair, text), max_tokens=TOKENS)
        planner = make_planner(strategy, {"budget": 12})
        events = [e for e in generate(pair, planner, request) if e.verified_nodes]
        tokens = [t.id for e in events for t in e.tokens]
        steps += len(events)
        accepted += sum(e.accepted for e in events)
        label = f"{strategy}, {text!r}"
        if first_divergence(tokens, plain_tokens, plain_margins, batch_noise, label) is None:
            assert tokens == plain_tokens[: len(tokens)]
            assert len(tokens) == min(TOKENS, len(plain_tokens))
        else:
            flips += 1
    print(f"\n{strategy}: MAL {1 + accepted / steps:.2f} over {steps} steps; {flips} near-tie flips")
    assert accepted > 0


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_sampling_uses_the_rule_matching_how_children_were_chosen(pair, strategy):
    request = Request(
        prompt=chat_prompt(pair, "Write a short story about a robot learning to paint."),
        max_tokens=32,
        sampling=SamplingParams(temperature=0.8, seed=1),
    )
    events = [e for e in generate(pair, make_planner(strategy, {"budget": 12}), request) if e.verified_nodes]
    assert sum(len(e.tokens) for e in events) == 32
    rules = {int(r) for e in events for r in e.tree.child_rule if r != ChildRule.NONE}
    assert rules == {int(STRATEGIES[strategy])}
    assert sum(e.accepted for e in events) > 0
