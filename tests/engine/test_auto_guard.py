"""`auto`'s guard (planner/auto/guard.py): within an answer, speculation that delivers fewer tokens per
second than plain decoding stops, even where the cost model says it pays — on the decoder's own step
over a synthetic engine whose clock follows the *true* cost curves (tests/support/synthetic_engine.py), while
auto decides with a *wrong* profile it is not allowed to correct. And where speculation pays, the guard
keeps out of the way; and a passage that turns copyable is caught again.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from edgespec.decoding.sampling import SamplingParams
from edgespec.planner.auto import COPY, PLAIN, AutoPlanner
from edgespec.planner.auto.calibration import Calibration
from edgespec.planner.auto.copies import CopySteps
from edgespec.planner.auto.guard import Evidence, Guard, Guards
from edgespec.planner.auto.tuning import TUNING
from edgespec.planner.costmodel import CostModel
from tests.support.fakes import sparse
from tests.support.synthetic_engine import SyntheticEngine

CALM_STEPS, FIRST_BACKOFF, LOSS_BUDGET = TUNING.calm_steps, TUNING.first_backoff, TUNING.loss_budget
MIN_STEPS, RETRY_SHARE = TUNING.min_steps, TUNING.retry_share

V, C1 = 32, 0.05  # vocabulary; seconds of a plain decode
SAMPLED = SamplingParams(temperature=1.0, seed=1)
# Steep (a CPU): verifying 16 tokens costs 5.5 plain decodes, a draft level of m nodes 0.15 (1 + 0.3 (m − 1)).
STEEP = CostModel.from_functions(
    lambda n: C1 * (1 + 0.3 * (n - 1)),
    lambda m: 0.15 * C1 * (1 + 0.3 * (m - 1)),
    lambda n: 0.15 * C1 * (1 + 0.3 * (n - 1)),
)
# Flat (a GPU): up to 16 tokens verify for the price of one, drafting is nearly free.
FLAT = CostModel.from_functions(
    lambda n: C1 if n <= 16 else C1 * (1 + 0.05 * (n - 16)), lambda m: 0.05 * C1, lambda n: 0.05 * C1
)


def markov(seed: int = 0, sharpness: float = 3.0) -> np.ndarray:
    """(V, V) a target's p(· | previous token)."""
    logits = np.random.default_rng(seed).normal(size=(V, V)) * sharpness
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


P = markov()
PERFECT_DRAFT = [sparse(P[a], top_k=8) for a in range(V)]  # the target's own top 8: drafts are accepted
PROMPT = [int(t) for t in np.random.default_rng(7).integers(1, V, 300)]  # random text: copies from it fail


def speed(planner, truth: CostModel, steps: int = 400, p=P, prompt=PROMPT, params=SAMPLED) -> float:
    """Tokens per second of an answer on a machine with the ``truth`` curves, over plain decoding's."""
    tokens, seconds = SyntheticEngine(p, PERFECT_DRAFT, truth).answer(planner, prompt, steps, params)
    plain, plain_seconds = SyntheticEngine(p, PERFECT_DRAFT, truth).answer(None, prompt, steps, params)
    return (len(tokens) / seconds) / (len(plain) / plain_seconds)


@pytest.fixture
def wrong_and_stubborn(monkeypatch):
    """auto's cost model may not correct itself: its measured cost factors and the copies' r_c stay."""
    monkeypatch.setattr(Calibration, "learn_costs", lambda self, event, first=False: None)
    monkeypatch.setattr(CopySteps, "observe", lambda self, event, copied: None)


def unguarded(monkeypatch) -> None:
    monkeypatch.setattr(Guard, "allows", lambda self, *args: True)
    monkeypatch.setattr(Guards, "needs_plain", lambda self: False)


# -- the rule -------------------------------------------------------------------------------------------
def test_excess_is_tokens_beyond_what_plain_decoding_delivers_in_the_same_time():
    evidence = Evidence()
    for tokens, seconds in [(3, 2.0), (1, 2.0), (2, 2.0)]:
        evidence.add(tokens, seconds)
    total, mean, se = evidence.excess(c=1.0)  # x = t − s / c: +1, −1, 0, weighted 0.81, 0.9, 1
    assert total == pytest.approx(0.81 - 0.9)
    assert mean == pytest.approx(total / (0.81 + 0.9 + 1))
    assert se > 0 and not evidence.loses(1.0)  # a loss well inside the noise
    heavy = Evidence()
    heavy.add(1, 4.0)  # one copy tree that failed: 1 token in 4 plain decodes' time
    assert heavy.excess(1.0)[0] == pytest.approx(-3.0) and -3.0 < -LOSS_BUDGET and heavy.loses(1.0)


def test_a_losing_kind_waits_for_its_loss_to_be_a_small_share_and_longer_after_each_failed_retry():
    guard = Guard()
    for step in range(3):
        guard.record(1, 1.1, c=1.0, step=step)  # −0.1 tokens a step: inside the noise
    assert guard.allows(3)
    guard = Guard()
    guard.record(1, 4.0, c=1.0, step=0)  # a copy tree that failed: 3 tokens lost, off for 3 / 2 % = 150
    assert guard.waiting(1) == math.ceil(3 / RETRY_SHARE) and guard.backoff == 2 * FIRST_BACKOFF
    retry = guard.off_until
    guard.record(1, 1.5, c=1.0, step=retry)  # the retry loses half a token a step …
    guard.record(1, 1.5, c=1.0, step=retry + 1)
    assert guard.allows(retry + 2)
    guard.record(1, 1.5, c=1.0, step=retry + 2)  # … a steady loss after MIN_STEPS: off again
    assert not guard.allows(retry + 3) and guard.backoff == 4 * FIRST_BACKOFF
    calm = Guard(backoff=8 * FIRST_BACKOFF, off_until=5)
    for step in range(5, 5 + CALM_STEPS):
        calm.record(3, 1.0, c=1.0, step=step)  # winning steps: forgiven
    assert calm.backoff == FIRST_BACKOFF and calm.off_until == 0


def test_copies_that_would_win_end_the_wait():
    guard = Guard()
    guard.record(1, 4.0, c=1.0, step=0)  # a failed copy tree: off
    assert not guard.allows(1)
    for step in range(1, 1 + MIN_STEPS):
        guard.imagine(9, c=1.0, step=step)  # copy trees followed, not verified: 8 copies right each
    assert guard.allows(MIN_STEPS + 1)


def test_one_huge_copy_tree_that_lost_does_not_price_every_imagined_one():
    guard = Guard()
    for step in range(4):
        guard.record(5, 1.0, c=0.25, step=step)  # 6-copy trees: 5 tokens in 4 plain steps' time
    guard.record(12, 5.0, c=0.25, step=4)  # a 48-copy tree broke after 11 copies: 8 tokens lost, off
    assert not guard.allows(5) and guard.measured == 1.0  # the median step, not an average of 1.8 s
    for step in range(5, 5 + MIN_STEPS):
        guard.imagine(6, c=0.25, step=step)  # 6-copy trees followed: all right, 6 tokens in 4 steps' time
    assert guard.allows(5 + MIN_STEPS)


def _drafts_lost_a_token(depth: int) -> Guards:
    """Guards whose draft trees (of height ``depth``) just lost: one tree, 1 token in 3.5 plain steps'
    time (c = 1 s), off until 2.5 tokens are ``RETRY_SHARE`` of the wait."""
    guards = Guards(plain_seconds=1.0, draft_depth=depth)
    guards.observe("draft", [5], 3.5)
    assert guards.drafts.waiting(guards.step) >= 2.5 / RETRY_SHARE
    return guards


@pytest.mark.parametrize(
    "guesses, depth, resumes",
    [
        ([True, True, True, False] * 3, 4, True),  # chains of 3 right guesses + 1: 4 tokens in 3.5 s
        ([False] * 12, 4, False),  # every guess wrong: 1 token in 3.5 s
        ([True] * 12, 1, False),  # right, but the trees drafted 1 deep: 2 tokens in 3.5 s
        ([None] * 12, 4, False),  # no guesses (a local target): nothing to go on
    ],
)
def test_free_guesses_that_would_win_end_the_drafts_wait(guesses, depth, resumes):
    """Over RPC the draft guesses each plain step's token while the target decodes it; a run of right
    guesses from a step is the chain it would have drafted there. Chains that beat plain decoding end
    the drafts' wait within a few of them; chains that would not (wrong guesses, or right ones no deeper
    than the trees the drafts verified) leave the wait as it was."""
    guards = _drafts_lost_a_token(depth)
    wait = guards.drafts.waiting(guards.step)
    for right in guesses:
        guards.observe("plain", [5], 1.0, guess_right=right)
    assert (guards.drafts.waiting(guards.step) == 0) is resumes
    if not resumes:
        assert guards.drafts.waiting(guards.step) == wait - len(guesses)


def test_a_step_that_was_not_plain_breaks_the_chain_of_guesses():
    guards = _drafts_lost_a_token(4)
    for _ in range(3):
        for right in (True, True, True):
            guards.observe("plain", [5], 1.0, guess_right=right)
        guards.observe("copy", [5, 6], 1.0, guess_right=False)  # the chain's end is unknown: no evidence
    assert guards.drafts.shadow.steps == 0 and guards.drafts.waiting(guards.step) > 0


def test_auto_reads_the_free_guess_of_each_plain_step(monkeypatch):
    """The wiring: auto tells its guard whether each plain step's guess (``StepEvent.guess``) named the
    token the target wrote; drafts waiting after a loss resume once those guesses would have won."""
    link = CostModel.from_functions(lambda n: C1 * (1 + 0.08 * (n - 1)), lambda m: 0.3 * C1)
    planner = AutoPlanner(costs=dataclasses.replace(link, look_ahead=True))
    told = []
    observe = Guards.observe
    monkeypatch.setattr(Guards, "observe", lambda self, *a: told.append(a[-1]) or observe(self, *a))
    planner.guards = _drafts_lost_a_token(4)
    planner.policy.guards = planner.guards
    planner.guards.plain_seconds = C1
    planner.guards.drafts.measured = 2 * C1
    for step in range(12):
        written = 7 + step
        guess = sparse(np.eye(V)[written if step % 4 != 3 else 0], top_k=2)  # right thrice, then wrong
        planner.observe(dataclasses.replace(_plain_step(written), guess=guess))
    assert told[1:] == [step % 4 != 3 for step in range(12)]
    assert planner.guards.drafts.waiting(planner.guards.step) == 0
    cut = dataclasses.replace(_plain_step(7), tokens=(), guess=guess)  # an end of turn cut the token
    planner.observe(cut)
    assert told[-1] is None


def _plain_step(token: int):
    from edgespec.decoding.events import EmittedToken, Provenance, StepEvent, StepTimings

    written = (EmittedToken(token, Provenance.TARGET, 1.0),)
    return StepEvent(tokens=written, text="", drafted=0, accepted=0, timings=StepTimings(verify=C1))


# -- auto on a machine its cost model gets wrong --------------------------------------------------------
def test_auto_stays_near_plain_speed_when_the_cost_model_flatters_drafting(wrong_and_stubborn, monkeypatch):
    """The profile says a GPU (flat verify, free drafting); the machine is steep. The draft is perfect,
    so r says drafting pays too: only the guard sees that the trees lose."""
    guarded = speed(AutoPlanner(costs=FLAT), STEEP, steps=600)
    unguarded(monkeypatch)
    blind = speed(AutoPlanner(costs=FLAT), STEEP, steps=600)
    print(f"\nflattered: {guarded:.3f}× plain with the guard, {blind:.3f}× without")
    assert blind < 0.6
    assert guarded > 0.95


def test_auto_stays_near_plain_speed_when_every_copy_fails(wrong_and_stubborn, monkeypatch):
    """The copies' estimates say every copy is 99 % sure (and r_c may not correct them); sampled text
    never repeats the prompt, so every copy fails, each costing a verify of 16 tokens (5.5 decodes)."""

    def optimistic() -> AutoPlanner:
        planner = AutoPlanner(costs=STEEP)
        planner.copier.accepted[:] = 0.99e6  # r(a) = 0.99 for every agreement, worth a million copies
        planner.copier.predicted[:] = 1e6
        return planner

    guarded = speed(optimistic(), STEEP, steps=600)
    unguarded(monkeypatch)
    blind = speed(optimistic(), STEEP, steps=600)
    print(f"\nfailed copies: {guarded:.3f}× plain with the guard, {blind:.3f}× without")
    assert blind < 0.7
    assert guarded > 0.95


def test_the_guard_keeps_out_of_the_way_where_speculation_pays(monkeypatch):
    guarded = speed(AutoPlanner(costs=FLAT), FLAT)
    unguarded(monkeypatch)
    blind = speed(AutoPlanner(costs=FLAT), FLAT)
    print(f"\nright model: {guarded:.3f}× plain with the guard, {blind:.3f}× without")
    assert guarded > 1.8 and guarded > 0.95 * blind


class FirstVerifyOfEachSize(CostModel):
    """A target on RPC servers: a batch size's first verify pays two plain decodes more (the servers'
    one-off work for a new graph; traced over RPC: a process's first 2-token verify 0.63 s, later ones
    0.32 s)."""

    def t(self, n):
        seen = self.__dict__.setdefault("seen", set())
        if not isinstance(n, (int, np.integer)) or n < 2 or n in seen:
            return super().t(n)
        seen.add(int(n))
        return super().t(n) + 2 * C1


class AllSizes:
    """A target that claims to have decoded every batch size before: auto cannot tell a first verify."""

    def __contains__(self, size) -> bool:
        return True

    def __len__(self) -> int:
        return 0

    def add(self, size) -> None:
        pass


def test_over_rpc_a_batch_sizes_first_verify_is_no_evidence_that_speculation_loses():
    """Taken as evidence, the first trees' one-off verifies stop auto's drafts and copies within a few
    steps, and the answer runs plainly; told which sizes are new (``Prepaid.sizes``), auto leaves
    them out of the guard's evidence and its cost factors, and beats plain decoding."""
    link = CostModel.from_functions(
        lambda n: C1 * (1 + 0.08 * (n - 1)), lambda m: 0.3 * C1 * (1 + 0.1 * (m - 1))
    )
    truth = lambda: FirstVerifyOfEachSize(link.target, link.draft, link.catchup, link.overhead)  # noqa: E731

    def ratio(told: bool) -> float:
        planner = AutoPlanner(costs=dataclasses.replace(link, look_ahead=True))
        engine = SyntheticEngine(P, PERFECT_DRAFT, truth())
        if not told:
            engine.target.sizes_decoded = AllSizes()
        tokens, seconds = engine.answer(planner, PROMPT, 200, SAMPLED)
        plain, plain_seconds = SyntheticEngine(P, PERFECT_DRAFT, truth()).answer(None, PROMPT, 200, SAMPLED)
        return (len(tokens) / seconds) / (len(plain) / plain_seconds)

    told, not_told = ratio(True), ratio(False)
    print(f"\nfirst verifies over RPC: {told:.3f}× plain told which sizes are new, {not_told:.3f}× not")
    assert told > 1.04 and not_told < 1.0


def test_a_passage_that_turns_copyable_is_copied_again(wrong_and_stubborn):
    """Prose (tokens 1–15, where copies of the random prompt fail) until the answer enters a passage the
    prompt holds (tokens 16–31, each followed by the next): copies were stopped in the prose, and resume
    within a few steps of the passage, found by the copy trees followed while they waited."""
    p = np.full((V, V), 1e-6)
    p[:16, 1:16] = 1.0  # prose: any prose token …
    p[:16, 16] = 0.3  # … and now and then into the passage
    for a in range(16, V):
        p[a, 16 + (a - 15) % 16] = 1.0  # the passage: 16, 17, …, 31, 16, …
    p /= p.sum(axis=1, keepdims=True)
    prompt = PROMPT[:200] + list(range(16, V)) * 3 + PROMPT[200:] + [1]
    planner = AutoPlanner(costs=STEEP)
    planner.copier.accepted[:] = 0.99e6  # every copy looks sure: the prose's copies fail
    planner.copier.predicted[:] = 1e6
    engine = SyntheticEngine(p, [sparse(row, top_k=8) for row in p], STEEP)
    modes, entered = [], None
    engine.reset(prompt[:-1], prompt[-1])
    rng, root = np.random.default_rng(3), prompt[-1]
    with engine.clock.running():
        for i in range(300):
            step = engine.step(planner, root, SAMPLED, rng, fresh=i == 0)
            modes.append(planner.mode)
            if entered is None and root >= 16:
                entered = i
            root = step.next_root
    assert entered is not None and entered > 5
    before = modes[:entered]
    assert COPY in before and before[-5:].count(COPY) <= 1  # copies tried in the prose, then stopped
    resumed = modes.index(COPY, entered)
    assert resumed - entered <= 12  # break-even is 5.5 copies (a 16-token verify): MIN_STEPS trees beat it
    assert modes[resumed:].count(COPY) > 0.8 * len(modes[resumed:])


def test_status_says_what_auto_is_doing_and_why(wrong_and_stubborn):
    planner = AutoPlanner(costs=FLAT)
    engine = SyntheticEngine(P, PERFECT_DRAFT, STEEP)
    engine.answer(planner, PROMPT, 3, SAMPLED)
    assert planner.mode == PLAIN and planner.activity == "plain"
    assert planner.describe().startswith("plain: drafts lost to plain decoding, retry in ")


def test_guard_constants_are_sane():
    assert TUNING.min_steps >= 2 and TUNING.retry_share <= 0.05
