"""The pair's fit (``profile/fit.py``): measured through the engine on the fake pair, checked against the
fake models' own logits, cached per pair, attached to ``auto`` — and what it changes in auto's choice."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.planner.auto import PLAIN, SPECULATE, AutoPlanner
from edgespec.planner.auto.tuning import TUNING
from edgespec.planner.costmodel import CostModel, DraftFit
from edgespec.planner.inputs import PlanContext
from edgespec.profile import costs, fit
from edgespec.profile.attach import attach
from tests.support.fake_llama import ChatFakePair
from tests.support.fakes import SyntheticDrafter, sparse
from tests.support.profiles import Given


@pytest.fixture(scope="module")
def pair() -> ChatFakePair:
    return ChatFakePair(n_seq=17, draft_noise=1.5)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits.astype(np.float64) - logits.max())
    return e / e.sum()


def test_the_fit_is_the_draft_against_the_targets_own_greedy_answer(pair):
    """Recomputed from the fake models' logits: the target's argmax chain, the draft's softmax there."""
    measured = fit.measure_fit(pair, requests=("first request", "second"))
    target_model, draft_model = pair.target.model, pair.draft.model
    top1, agree, n, answers = [], [], 0, []
    for request in ("first request", "second"):
        answers.append(len(agree))
        seen, _ = prompt_tokens(pair, [Message("user", request)], ChatSettings(max_tokens=fit.FIT_TOKENS))
        for _ in range(fit.FIT_TOKENS):
            token = int(np.argmax(target_model.logits(tuple(seen))))
            if token == 0:  # the fake vocabulary's end of generation
                break
            q = _softmax(draft_model.logits(tuple(seen)))
            top1.append(q.max())
            agree.append(float(np.argmax(q) == token))
            seen.append(token)
            n += 1
    assert measured.tokens == n > fit.FIT_TOKENS  # both requests answered
    assert measured.profile[0] == pytest.approx(np.mean(top1), rel=1e-6)
    assert measured.ratio == pytest.approx(sum(agree) / sum(top1), rel=1e-6)
    assert 0 < sum(agree) < n  # the noisy draft is sometimes right, sometimes not: a real ratio
    assert np.all(np.diff(measured.profile) <= 0) and measured.profile.sum() <= 1 + 1e-9
    # runs: how often the draft was right n times in a row, within one answer
    rights = [agree[a:b] for a, b in zip(answers, answers[1:] + [len(agree)])]
    for length in range(1, len(measured.runs) + 1):
        windows = [all(right[i : i + length]) for right in rights for i in range(len(right) - length + 1)]
        assert measured.runs[length - 1] == pytest.approx(sum(windows) / len(windows))
    assert measured.runs[0] == pytest.approx(sum(agree) / n) and measured.runs[1] > 0


def test_the_fit_is_cached_per_pair_and_attached_to_auto(pair, tmp_path, monkeypatch):
    calls = []
    real = fit.measure_fit
    monkeypatch.setattr(fit, "measure_fit", lambda *a, **k: calls.append(1) or real(*a, **k))
    # caching is the point here: a profile whose repeats disagree (7 threads on a 2-core runner under
    # load) would be used once and not saved (tested apart), which is not what this test asks
    monkeypatch.setattr(costs, "BUSY_SPREAD", float("inf"))
    planner = AutoPlanner()
    attach(planner, pair, home=tmp_path)
    assert calls == [1] and len(list((tmp_path / "profiles").glob("fit-*.json"))) == 1
    measured = fit.load_fit(pair, tmp_path)
    assert measured is not None and planner.calibration.profile.tolist() == measured.profile.tolist()
    top1, right = measured.profile[0], measured.ratio * measured.profile[0]  # the fit's top-1, right
    assert planner.acceptance.chance(top1) == pytest.approx(min(right, 0.99))  # where the curve starts
    again = AutoPlanner()
    attach(again, pair, home=tmp_path)  # both cached now: nothing measured
    assert calls == [1] and again.acceptance.chance(top1) == pytest.approx(min(right, 0.99))
    # Another thread count is another cost profile, but the same fit (it depends on the model files).
    before = pair.settings
    pair.settings = dataclasses.replace(before, threads=7)
    try:
        third = AutoPlanner()
        attach(third, pair, home=tmp_path)  # measures a profile for 7 threads, not the fit
        assert calls == [1] and len(list((tmp_path / "profiles").glob("costs-*.json"))) == 2
    finally:
        pair.settings = before


# Over a slow link (issue 38's RPC table, 20 ms each way): a target call costs ~0.24 s whatever the batch,
# plus ~64 ms per extra token of compute; a draft level ~80 ms.
SLOW_LINK = CostModel.from_functions(lambda n: 0.242 + 0.064 * (n - 1), lambda n: 0.079 + 0.004 * (n - 1))


def _first_step(planner: AutoPlanner, q: float) -> str:
    drafter = SyntheticDrafter(lambda path: sparse([q, 0.06, 0.03, 0.02], ids=[5 + len(path), 1, 2, 3]))
    ctx = PlanContext(sampling=False, rng=np.random.default_rng(0), max_nodes=65, fresh=True)
    planner.plan(7, drafter, ctx)
    return planner.mode


def test_a_measured_fit_lets_auto_draft_from_the_first_step_over_a_slow_link():
    """With a typical draft's prior (top-1 0.6) the forecast says plain, and a fresh answer has no credit
    for a probe: a draft that is really right 80 % of the time would never be tried. Its fit says so."""
    assert _first_step(AutoPlanner(costs=SLOW_LINK), q=0.8) == PLAIN
    good = AutoPlanner()
    good.prepare(Given(SLOW_LINK, DraftFit(np.array([0.8, 0.08, 0.03, 0.02]), ratio=1.0, tokens=64)))
    assert _first_step(good, q=0.8) == SPECULATE
    poor = AutoPlanner()  # a confident draft the target seldom agrees with: still plain
    poor.prepare(Given(SLOW_LINK, DraftFit(np.array([0.8, 0.08, 0.03, 0.02]), ratio=0.5, tokens=64)))
    assert _first_step(poor, q=0.8) == PLAIN


def test_learnt_cost_factors_never_make_plain_decoding_final():
    """ "Speculation cannot pay on this machine" is read off the profile. Factors learnt from a few slow
    steps may make the forecast say plain, but when they come back auto drafts again (on learnt
    factors that verdict was final: with nothing drafted, nothing could unlearn it)."""
    planner = AutoPlanner()
    planner.prepare(Given(SLOW_LINK, DraftFit(np.array([0.8, 0.08, 0.03, 0.02]), ratio=1.0, tokens=64)))
    assert _first_step(planner, q=0.8) == SPECULATE
    cal = planner.calibration
    cal.batch_factor = cal.draft_factor = 8.0
    cal._apply_factors()
    assert _first_step(planner, q=0.8) == PLAIN and not planner.policy.never_drafts
    cal.batch_factor = cal.draft_factor = 1.0
    cal._apply_factors()
    assert _first_step(planner, q=0.8) == SPECULATE


def test_over_rpc_drafting_starts_at_what_the_look_ahead_leaves_and_steps_correct_it():
    """A target on RPC servers (``look_ahead``): the draft works during each verify, so drafting starts
    at 1 − P(hit) of its profiled cost — P(hit): how often the fit saw the draft right 5 times in a
    row (runs[4]), or α⁵ (α = r · p₁) for a fit without runs — in either order of costs and fit; on
    this machine it starts at 1. Once a step has measured drafting, a fit arriving later does not
    reset it. (``prepare`` gives the costs first: the other order through the calibration's setters.)"""
    runs = (0.8, 0.7, 0.62, 0.55, 0.5, 0.45, 0.4, 0.35)  # right guesses come in runs: 0.5 ≫ 0.8⁵ = 0.33
    fit = DraftFit(np.array([0.8, 0.08, 0.03, 0.02]), ratio=1.0, tokens=64, runs=runs)
    here = AutoPlanner()
    here.prepare(Given(SLOW_LINK, fit))
    assert here.calibration.draft_factor == 1.0
    for fit_first, runs_known in ((False, True), (True, True), (False, False)):
        remote, this_fit = AutoPlanner(), fit if runs_known else dataclasses.replace(fit, runs=())
        link = dataclasses.replace(SLOW_LINK, look_ahead=True)
        if fit_first:
            remote.calibration.set_fit(this_fit)
            remote.calibration.set_costs(link)
        else:
            remote.prepare(Given(link, this_fit))
        assert remote.calibration.draft_factor == pytest.approx(1 - (0.5 if runs_known else 0.8**5))
        assert remote.calibration.effective.look_ahead  # the learned curves keep the flag
    cal = remote.calibration
    cal.draft_predicted, cal.plain_verify = 0.3, float(SLOW_LINK.t(1))
    step = SimpleNamespace(verified_nodes=5, timings=SimpleNamespace(verify=0.5, draft=0.09, plan=0.0))
    cal.learn_costs(step)
    learned = cal.draft_factor
    assert learned < 1 - 0.8**5  # 0.09 s of 0.3 s profiled: most of it hidden
    cal.set_fit(fit)
    assert cal.draft_factor == learned


def test_a_model_without_a_chat_template_is_fitted_on_the_plain_requests():
    from edgespec.errors import EngineError

    base = ChatFakePair(n_seq=17, draft_noise=1.5)

    def no_template(messages):
        raise EngineError("fake has no chat template; use `edgespec generate --raw` for plain text.")

    base.target.model.apply_chat_template = no_template
    measured = fit.measure_fit(base, requests=("plain text",))
    assert measured.tokens > 0 and 0 < measured.profile[0] <= 1


def test_a_target_that_ends_every_request_at_once_leaves_auto_its_prior(tmp_path, monkeypatch):
    silent = ChatFakePair(n_seq=17)
    monkeypatch.setattr(silent.target.model, "is_eog", lambda token: True)
    assert fit.measure_fit(silent) is None
    planner = AutoPlanner()
    attach(planner, silent, home=tmp_path)  # measures the cost profile; no fit to give
    assert planner.costs is not None and planner.calibration.profile.tolist() == TUNING.prior_profile.tolist()
    assert not list((tmp_path / "profiles").glob("fit-*.json"))  # nothing cached: tried again next time


def test_over_rpc_plain_steps_keep_the_curve_current_from_the_drafts_free_guesses():
    """Over RPC a step that drafted nothing still has the draft's guess at its root (decoded while the
    target decoded): auto counts it as a one-token tree — the acceptance curve rises while the guesses
    are right and falls while they are wrong, without a probe — until the forecast says drafting pays."""
    from edgespec.decoding.events import EmittedToken, Provenance, StepEvent, StepTimings
    from edgespec.planner.tree import TreeBuilder

    def plain_steps(right: bool, n: int = 40) -> AutoPlanner:
        planner = AutoPlanner()
        fit = DraftFit(np.array([0.6, 0.1, 0.05, 0.03]), ratio=0.6, tokens=64)
        planner.prepare(Given(dataclasses.replace(SLOW_LINK, look_ahead=True), fit))
        assert _first_step(planner, q=0.6) == PLAIN
        for _ in range(n):
            token = 5 if right else 6
            event = StepEvent(
                tokens=(EmittedToken(token, Provenance.TARGET, 1.0),), text="", drafted=0, accepted=0,
                timings=StepTimings(verify=float(SLOW_LINK.t(1))), tree=TreeBuilder(7).freeze(),
                accepted_path=(0,), guess=sparse([0.6, 0.1, 0.05, 0.03], ids=[5, 1, 2, 3]),
            )  # fmt: skip
            planner.mode = PLAIN
            planner.observe(event)
        return planner

    right, wrong = plain_steps(True), plain_steps(False)
    assert right.acceptance.chance(0.6) > 0.78 and wrong.acceptance.chance(0.6) < 0.18  # it started at 0.36
    assert _first_step(right, q=0.6) == SPECULATE


def test_over_rpc_trees_are_sized_on_curves_that_charge_a_new_size_its_one_off():
    """Over RPC the first verify of a batch size pays one-off round trips: measured once, it is charged
    (÷ ``one_off_share``) to every size the target has not decoded yet in the curves trees are sized
    on, to none it has, and not at all in the curves that decide whether to draft; a local target is
    charged nothing."""
    from edgespec.planner.auto.calibration import Calibration

    def first_verify(look_ahead: bool) -> Calibration:
        cal = Calibration()
        cal.set_costs(dataclasses.replace(SLOW_LINK, look_ahead=look_ahead))
        timings = SimpleNamespace(verify=float(SLOW_LINK.t(3)) + 0.3, draft=0.0, plan=0.0)
        cal.learn_costs(SimpleNamespace(verified_nodes=3, timings=timings), first=True)
        return cal

    remote, local = first_verify(True), first_verify(False)
    warm = {1, 3}
    assert remote.one_off == pytest.approx(0.3) and remote.batch_factor == 1.0  # no evidence of batches
    sizing = remote.sizing(warm)
    assert float(sizing.t(3)) == pytest.approx(float(SLOW_LINK.t(3)))  # paid for
    assert float(sizing.t(4)) == pytest.approx(float(SLOW_LINK.t(4)) + 0.3 / TUNING.one_off_share)
    assert float(sizing.t(1)) == float(SLOW_LINK.t(1))
    assert float(remote.effective.t(4)) == pytest.approx(float(SLOW_LINK.t(4)))
    assert local.one_off == 0.0 and local.sizing(warm) is local.effective


def test_a_step_that_drafted_little_moves_the_drafting_factor_little():
    """The drafting factor is decayed Σ measured ÷ Σ profiled seconds: one 10 ms level that took 80 ms
    (it also waited for something) moves it by a quarter, not 3x; steps that draft more move it further."""
    planner = AutoPlanner(costs=SLOW_LINK)
    cal = planner.calibration
    cal.plain_verify = float(SLOW_LINK.t(1))

    def step(profiled: float, measured: float) -> float:
        cal.draft_predicted = profiled
        timings = SimpleNamespace(verify=float(SLOW_LINK.t(5)), draft=measured, plan=0.0)
        cal.learn_costs(SimpleNamespace(verified_nodes=5, timings=timings))
        return cal.draft_factor

    assert step(0.3, 0.3) == pytest.approx(1.0)
    assert step(0.01, 0.08) < 1.3  # a mean of ratios: 0.7 + 0.3 · 8 = 3.1
    for _ in range(20):
        step(0.3, 0.6)
    assert cal.draft_factor == pytest.approx(2.0, rel=0.01)
