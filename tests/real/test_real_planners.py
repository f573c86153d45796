"""Every tree/graph strategy on the real bundled pair.

Temperature 0: the output equals plain greedy decoding on the engine's prompt set, up to a
divergence at a near-tie within the measured batch noise (see realmodels.py). Temperature > 0: each
strategy runs with the lossless rule that matches how its children were chosen; DySpec, whose draws
come from per-node streams, over a sweep of seeds (its distribution is tested in test_lossless.py).
The copying strategies (``ngram``, ``hybrid``) also run on a code edit, where copying must pay.
"""

from __future__ import annotations

import pytest

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.events import Provenance
from edgespec.decoding.sampling import SamplingParams
from edgespec.measure.prompts import PROMPT_SETS
from edgespec.planner.strategies import build as make_planner
from edgespec.planner.tree import ChildRule
from tests.support.realmodels import assert_sampled_in_nucleus, chat_prompt, first_divergence, steps_with_rows

pytestmark = pytest.mark.model

TOKENS = 32  # compared against the first 32 tokens of plain decoding
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


def test_dyspec_sampling_over_a_seed_sweep(pair):
    """Eight seeds: every emitted token lies inside the target's nucleus at its verify row, the
    children are sampled (residual rule), and the seeds give different answers."""
    answers = set()
    accepted = 0
    for seed in range(8):
        params = SamplingParams(temperature=0.8, top_p=0.9, seed=seed)
        request = Request(
            prompt=chat_prompt(pair, "Name three uses of a paperclip."), max_tokens=24, sampling=params
        )
        events, rows = steps_with_rows(pair, make_planner("dyspec", {"budget": 12}), request)
        assert_sampled_in_nucleus(events, rows, params, f"seed {seed}")
        answers.add(tuple(t.id for e in events for t in e.tokens))
        accepted += sum(e.accepted for e in events)
    assert len(answers) > 1 and accepted > 0
