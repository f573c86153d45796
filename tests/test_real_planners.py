"""Every tree/graph strategy on the real bundled pair.

Temperature 0: the output equals plain greedy decoding on the engine's prompt set, up to a
divergence at a near-tie within the measured batch noise (see realmodels.py). Temperature > 0: each
strategy runs with the lossless rule that matches how its children were chosen. The copying
strategies (``ngram``, ``hybrid``) also run on a code edit, where copying must pay.
"""

from __future__ import annotations

import pytest
from realmodels import chat_prompt, first_divergence

from edgespec.decoder import Request, generate
from edgespec.events import Provenance
from edgespec.planner.registry import make_planner
from edgespec.planner.tree import ChildRule
from edgespec.prompts import PROMPT_SETS
from edgespec.sampling import SamplingParams

pytestmark = pytest.mark.model

TOKENS = 48  # compared against the first 48 tokens of plain decoding
STRATEGIES = {
    "tsd": ChildRule.TOP,
    "gsd": ChildRule.TOP,
    "opt-tree": ChildRule.TOP,
    "dyspec": ChildRule.SAMPLED,
    "mcsd": ChildRule.SAMPLED,
    "ngram": ChildRule.TOP,  # copies are deterministic candidates: the one-hot rule
    "hybrid": ChildRule.TOP,
}
COPYING = ("ngram", "hybrid")
EDIT = PROMPT_SETS["edit"][0].last_user_text  # add type hints to a function: the answer repeats it
STORY = "Write a short story about a robot learning to paint."


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
    assert accepted > 0 or strategy == "ngram"  # free prose may offer nothing to copy


@pytest.mark.parametrize("strategy", COPYING)
def test_copying_a_code_edit_equals_plain_decoding_and_pays(pair, batch_noise, strategy):
    request = Request(prompt=chat_prompt(pair, EDIT), max_tokens=64)
    plain = [t for e in generate(pair, None, request) for t in e.tokens]
    events = [e for e in generate(pair, make_planner(strategy, {"budget": 16}), request) if e.verified_nodes]
    tokens = [t.id for e in events for t in e.tokens]
    plain_tokens, plain_margins = [t.id for t in plain], [t.margin for t in plain]
    if first_divergence(tokens, plain_tokens, plain_margins, batch_noise, f"{strategy}, edit") is None:
        assert tokens == plain_tokens
    copied = sum(t.provenance is Provenance.COPIED for e in events for t in e.tokens)
    mal = len(tokens) / len(events)
    print(f"\n{strategy} on an edit: MAL {mal:.2f}, {copied} copied tokens in {len(events)} steps")
    assert copied >= 16 and mal > 1.5


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_sampling_uses_the_rule_matching_how_children_were_chosen(pair, strategy):
    request = Request(
        prompt=chat_prompt(pair, EDIT if strategy in COPYING else STORY),
        max_tokens=32,
        sampling=SamplingParams(temperature=0.8, seed=1),
    )
    events = [e for e in generate(pair, make_planner(strategy, {"budget": 12}), request) if e.verified_nodes]
    assert sum(len(e.tokens) for e in events) == 32
    rules = {int(r) for e in events for r in e.tree.child_rule if r != ChildRule.NONE}
    assert rules == {int(STRATEGIES[strategy])}
    assert sum(e.accepted for e in events) > 0
