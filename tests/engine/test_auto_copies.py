"""`auto` and the conversation's copies: verified alone where the draft cannot pay, their own calibration
learnt (and from copy trees it did not verify), grafted onto draft trees; on the fake engine, equal to
plain decoding. (Split from test_auto.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.events import EmittedToken, Provenance, StepEvent, StepTimings
from edgespec.planner.auto import COPY, PLAIN, SPECULATE, AutoPlanner
from edgespec.planner.auto.copies import Unverified
from edgespec.planner.costmodel import CostModel
from edgespec.planner.inputs import PlanContext
from edgespec.planner.ngram import CopyTrie, prior_rate
from tests.engine.test_auto import C1, confident, memory_bound
from tests.support.fake_llama import FakePair

# -- copies from the conversation -----------------------------------------------------------------------
# This project's AVX-512 CPU (2 threads): c_t(8) ≈ 3.2 c_t(1), c_t(16) ≈ 4 c_t(1); the draft costs half a
# target decode per token, so a typical draft's tree does not pay — but free copies can.
AVX512 = CostModel.from_functions(
    lambda n: C1 * float(np.interp(n, [1, 2, 4, 8, 16, 64], [1, 1.4, 2.1, 3.2, 4.0, 14])), lambda n: 0.029 * n
)
CODE = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]


def copy_ctx(history, fresh=True) -> PlanContext:
    return PlanContext(
        sampling=False, rng=np.random.default_rng(0), max_nodes=65, history=history, fresh=fresh
    )


def test_auto_copies_where_the_draft_cannot_pay():
    planner = AutoPlanner(costs=AVX512)
    drafter = confident(q=0.5)
    assert planner.policy.decide(1, 48) != SPECULATE  # the draft's forecast loses to plain decoding
    history = [1, 2, *CODE, 3, 4, 5, *CODE[:6]]  # the answer is rewriting CODE: copying pays
    tree = planner.plan(CODE[6], drafter, copy_ctx(history))
    assert planner.steps[COPY] == 1 and drafter.decodes == 0
    assert tree.size > 4 and tree.copied[1:].all()
    assert tree.path_tokens(int(np.argmax(tree.depth)))[:5] == CODE[6:11]
    tree = planner.plan(99, drafter, copy_ctx(history + [CODE[6]], fresh=False))  # nothing to copy after 99
    assert tree.size == 1 and planner.steps[PLAIN] == 1


def test_auto_learns_the_copy_steps_calibration_and_forgets_it():
    """Copy trees whose first copies fail make later copy trees of the same promise lose to plain
    decoding (r_c = accepted ÷ predicted of the copy steps); every step fades that evidence towards
    the prior, so copying is tried again."""
    planner = AutoPlanner(costs=AVX512)
    drafter = confident(q=0.5)
    history = [1, 2, *CODE, 3, 4, 5, *CODE[:6]]

    def copy_step():
        tree = planner.plan(CODE[6], drafter, copy_ctx(history))
        return tree, planner.mode == COPY

    tree, copied = copy_step()
    assert copied
    failed = StepEvent(
        tokens=(), text="", drafted=tree.size - 1, accepted=0, timings=StepTimings(), tree=tree,
        accepted_path=(0,), verified_nodes=tree.size, expected_accept=tree.stats.expected_accept,
    )
    for _ in range(3):
        planner.observe(failed)
    assert planner.copies.ratio < 0.5
    _, copied = copy_step()
    assert not copied  # the same copies no longer beat plain decoding
    plain = StepEvent(tokens=(), text="", drafted=0, accepted=0, timings=StepTimings())
    for _ in range(150):
        planner.observe(plain)
    assert planner.copies.ratio > 0.95
    _, copied = copy_step()
    assert copied


def test_an_unverified_copy_tree_counts_what_verification_would_have():
    """Followed token by token, a copy tree adds up to its longest written path (what the one-hot rule
    accepts) against its whole Σ p̂; each depth's p̂ counts once the token that tests it is written."""
    trie = CopyTrie([4])
    trie.add_chain([5, 6, 7], 3)
    trie.add_chain([5, 8], 2)
    trie.add_chain([9], 1)
    trie.estimate(prior_rate(np.arange(24)))
    keep = trie.best(trie.size)
    depth_phat = [trie.phat[[1, 5]].sum(), trie.phat[[2, 4]].sum(), trie.phat[3]]  # 5 9 | 6 8 | 7
    whole = Unverified.of(trie, keep)
    assert whole.depth_phat == pytest.approx(depth_phat)
    assert whole.follow([5, 6, 42]) == (2, pytest.approx(sum(depth_phat)), True)
    steps = Unverified.of(trie, keep)
    assert steps.follow([5]) == (1, pytest.approx(depth_phat[0]), False)
    assert steps.follow([6]) == (1, pytest.approx(depth_phat[1]), False)
    assert steps.follow([7, 1]) == (1, pytest.approx(depth_phat[2]), True)  # ran through: 3 accepted
    assert Unverified.of(trie, keep).follow([42]) == (0, pytest.approx(sum(depth_phat)), True)


def _one_token(token: int) -> StepEvent:
    """A plain step that wrote ``token``."""
    written = (EmittedToken(token, Provenance.TARGET, 1.0),)
    return StepEvent(tokens=written, text="", drafted=0, accepted=0, timings=StepTimings())


@pytest.mark.parametrize("target_copies", [True, False])
def test_auto_learns_from_copy_trees_it_did_not_verify(target_copies):
    """After failed copy steps r_c is low and auto decodes plainly; while the target then writes what
    the copies proposed, the unverified copy trees (followed along what it wrote) raise r_c again and
    copying resumes within a few steps — fading alone would take dozens. Where the target writes
    something else, it stays plain."""
    planner = AutoPlanner(costs=AVX512)
    drafter = confident(q=0.5)
    history = [1, 2, *CODE, 3, 4, 5, *CODE[:6]]
    tree = planner.plan(CODE[6], drafter, copy_ctx(history))
    failed = StepEvent(
        tokens=(), text="", drafted=tree.size - 1, accepted=0, timings=StepTimings(), tree=tree,
        accepted_path=(0,), verified_nodes=tree.size, expected_accept=tree.stats.expected_accept,
    )
    for _ in range(3):
        planner.observe(failed)
    low = planner.copies.ratio
    resumed_at, root, answer, after_one = None, CODE[6], list(history), []
    for step in range(8):
        planner.plan(root, drafter, copy_ctx(answer, fresh=False))
        if planner.mode == COPY:
            resumed_at = step
            break
        written = CODE[7 + step] if target_copies else 60 + step  # 60…: never seen, nothing to copy
        planner.observe(_one_token(written))
        after_one.append(planner.copies.ratio)
        answer, root = answer + [root], written
    if target_copies:  # the first copy was right: r_c rises at once, and copying resumes
        assert after_one[0] > low and resumed_at is not None and resumed_at <= 3
    else:  # the copy tree proposed failed on its first token: r_c falls
        assert after_one[0] < low and resumed_at is None
    planner.plan(CODE[6], drafter, copy_ctx(history))  # a new request: the old trees are dropped
    assert len(planner.copies.unverified) <= 1


def test_auto_grafts_copies_onto_the_draft_tree():
    planner = AutoPlanner(costs=memory_bound())  # the draft pays here
    drafter = confident(q=0.9)
    history = [1, 50, 2, 3, 4, 5]  # a one-token match: a weak copy, no match for the draft alone
    tree = planner.plan(50, drafter, copy_ctx(history))
    assert planner.mode == SPECULATE and drafter.decodes > 0
    copied = [int(n) for n in np.flatnonzero(tree.copied)]
    chain = [int(tree.tokens[n]) for n in copied]
    assert chain and chain == [2, 3, 4, 5][: len(chain)]  # the copy chain, grafted below the root
    least_drafted = tree.path_prob[1:][~tree.copied[1:]].min()
    assert all(tree.path_prob[n] >= least_drafted for n in copied)  # as likely as the least drafted node
    assert tree.stats.expected_accept == pytest.approx(tree.path_prob[1:].sum())


def test_auto_copies_on_the_engine_and_equals_plain_decoding():
    from tests.engine.test_engine_fake import _echo_prompt, _plain

    pair = FakePair(n_seq=33)
    planner = AutoPlanner(costs=AVX512)
    echo = _echo_prompt()
    events = list(generate(pair, planner, Request(prompt=echo, max_tokens=60)))
    assert [t.id for e in events for t in e.tokens] == _plain(prompt=echo)
    assert planner.steps[COPY] > 0 and planner.steps[SPECULATE] == 0
    assert any(t.provenance is Provenance.COPIED for e in events for t in e.tokens)
