"""ParallelSpec on the real bundled pair with untrained masks (no adapter): the mechanism, not the gain.

Greedy: the output equals plain decoding up to a near-tie within the measured batch noise (see
realmodels.py), with exactly one draft pass per step, trees at most K + 1 deep and no [MASK] id ever
drafted. Sampling: the children are draws (residual rule) and every token lies in the target's nucleus.
"""

from __future__ import annotations

import pytest

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams
from edgespec.planner.inputs import DraftSetup
from edgespec.planner.parallel import ParallelSpecPlanner
from tests.support.realmodels import assert_sampled_in_nucleus, chat_prompt, first_divergence, steps_with_rows

pytestmark = pytest.mark.model

TOKENS = 32


@pytest.fixture
def parallel_pair(pair):
    spec = pair.set_up_draft(DraftSetup(masks=4))  # untrained: the default masks, no adapter
    yield pair, spec
    pair.set_up_draft(DraftSetup())  # the session's pair goes back to a plain draft


def test_greedy_equals_plain_decoding_in_one_draft_pass_per_step(parallel_pair, plain_runs, batch_noise):
    pair, spec = parallel_pair
    flips = steps = accepted = 0
    for text, (plain_tokens, plain_margins) in plain_runs.items():
        request = Request(prompt=chat_prompt(pair, text), max_tokens=TOKENS)
        events = [
            e for e in generate(pair, ParallelSpecPlanner(k=spec.k, budget=12), request) if e.verified_nodes
        ]
        tokens = [t.id for e in events for t in e.tokens]
        assert events[0].draft_decodes == 0  # the first token comes with the prompt's decode
        # One draft pass a step; a step with one token left verifies the root alone (no tree holds
        # more nodes than the answer has tokens left), so it drafts nothing.
        assert all(e.draft_decodes == 1 and e.depth <= spec.k + 1 for e in events[1:] if e.verified_nodes > 1)
        assert all(e.draft_decodes == 0 for e in events[1:] if e.verified_nodes == 1)
        assert [e.verified_nodes for e in events[1:-1]].count(1) == 0
        assert not {int(t) for e in events for t in e.tree.tokens[1:]} & set(spec.mask_ids)
        steps += len(events)
        accepted += sum(e.accepted for e in events)
        if first_divergence(tokens, plain_tokens, plain_margins, batch_noise, text) is None:
            assert tokens == plain_tokens[: len(tokens)]
        else:
            flips += 1
    print(f"\nparallelspec (untrained): MAL {1 + accepted / steps:.2f} over {steps} steps; {flips} flips")
    assert accepted > 0  # depth 1 is the draft's ordinary next-token row


def test_sampling_draws_children_and_stays_in_the_nucleus(parallel_pair):
    pair, spec = parallel_pair
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=2)
    request = Request(
        prompt=chat_prompt(pair, "Name three uses of a paperclip."), max_tokens=24, sampling=params
    )
    events, rows = steps_with_rows(pair, ParallelSpecPlanner(k=spec.k), request)
    assert sum(len(e.tokens) for e in events) == 24
    assert_sampled_in_nucleus(events, rows, params)
