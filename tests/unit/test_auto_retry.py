"""What keeps `auto` from stopping for good on a few unlucky steps where drafting pays (issue 61): the
pair's fit weighs on the acceptance curve as the trials it saw, a long plain stretch's catch-up is
charged per step as its share, and a draft retry is not left until its catch-up is too dear."""

from __future__ import annotations

import pytest

from edgespec.planner.auto.acceptance import Acceptance
from edgespec.planner.auto.guard import Guard
from edgespec.planner.auto.policy import catch_up_share
from edgespec.planner.auto.tuning import TUNING
from edgespec.planner.costmodel import CostModel

MISSES = [(0.75, False)] * 4  # four one-token trees whose guess at q = 0.75 was wrong


def test_a_measured_fit_holds_the_curve_against_a_few_misses():
    weak, firm = Acceptance.from_rate(0.75, 0.65), Acceptance.from_rate(0.75, 0.65, seen=400)
    assert weak.chance(0.75) == pytest.approx(0.65) and firm.chance(0.75) == pytest.approx(0.65)
    weak.learn(MISSES)
    firm.learn(MISSES)
    assert firm.chance(0.75) > weak.chance(0.75) + 0.05
    assert firm.chance(0.75) < 0.65  # still moved: the fit is a prior, not a constant
    # a fit of few positions weighs no more than the default prior
    few = Acceptance.from_rate(0.75, 0.65, seen=1)
    few.learn(MISSES)
    assert few.chance(0.75) == pytest.approx(weak.chance(0.75))
    # and a firm one no more than ``fit_trials`` of its trials
    assert Acceptance.from_rate(0.75, 0.65, seen=10**6).prior_weight[1] == pytest.approx(
        TUNING.fit_trials * 0.65 * 0.35
    )


def test_a_long_plain_stretchs_catch_up_is_charged_as_its_share_per_step():
    slope, root = 0.002, 0.01  # c_k(n) = root + slope (n − 1)
    costs = CostModel.from_functions(lambda n: 0.06, lambda n: root, lambda n: root + slope * (n - 1))
    assert catch_up_share(costs, 1) == 0.0
    assert catch_up_share(costs, 5) == pytest.approx(4 * slope / TUNING.horizon)  # a short stretch
    long = [catch_up_share(costs, p) for p in (50, 500, 5000)]
    assert long == pytest.approx([slope] * 3)  # bounded: one pending token's cost, not the stretch's


def _waiting(step: int = 10, wait: int = 200) -> Guard:
    guard = Guard()
    guard.off_until = step + wait
    return guard


def test_a_draft_retry_comes_before_its_catch_up_is_too_dear():
    budget, first = TUNING.loss_budget, TUNING.first_backoff
    guard = _waiting()
    guard.bring_forward(60, (budget - 0.1, budget - 0.05))  # still affordable after one more step
    assert guard.off_until == 210
    guard.bring_forward(first - 1, (budget - 0.01, budget + 0.01))  # too short a wait yet
    assert guard.off_until == 210
    guard.bring_forward(60, None)  # no curves: nothing known
    assert guard.off_until == 210
    guard.bring_forward(60, (budget - 0.01, budget + 0.01))  # the last affordable step
    assert guard.off_until == 0 and guard.allows(41, 60)
    # after the wait, where ``allows`` refuses a retry whose catch-up was never measured: the same
    late = _waiting(wait=20)
    assert not late.allows(40, 60)
    late.bring_forward(60, (budget - 0.01, budget + 0.01))
    assert late.allows(40, 60)
    # a measured catch-up rules over the profile's
    measured = _waiting()
    measured.catch_up = budget / 30  # tokens' worth per pending token: dear at 31
    measured.bring_forward(60, (budget - 0.01, budget + 0.01))
    assert measured.off_until == 210
    measured.bring_forward(30, (0.0, 0.0))
    assert measured.off_until == 0
