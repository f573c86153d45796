"""``edgespec models advise``'s prediction (planner/advice.py): small cases computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.planner.advice import (
    auto_speedup,
    chain_speedup,
    chain_tokens,
    fitted_curve,
    line_through,
    lowered,
    predict,
)
from tests.support.advice import RUNS, costs, fit


def test_a_chain_commits_the_bonus_token_and_each_run_of_right_guesses():
    assert chain_tokens(RUNS, 2) == pytest.approx(1 + 0.8 + 0.6)
    with pytest.raises(ValueError, match="runs up to 8"):
        chain_tokens(RUNS, 9)


def test_chain_speedup_by_hand():
    # chain of 2: catch-up 0.03 + one draft level 0.02 + verify of 3 tokens 0.13 = 0.18 s for 2.4
    # tokens; plain: 1 token in c_t(1) = 0.11 s
    assert chain_speedup(costs(), fit(), 2) == pytest.approx(2.4 / 0.18 * 0.11)


def test_lowered_acceptance_scales_each_run_by_the_factor_per_guess():
    low = lowered(fit(ratio=1.2, runs=(0.8, 0.6)), 0.5)
    assert low.runs == pytest.approx((0.4, 0.15)) and low.ratio == pytest.approx(0.6)


def test_auto_decodes_plainly_where_verifying_n_tokens_costs_n_decodes():
    assert auto_speedup(costs(target=lambda n: 0.1 * n), fit()) == 1.0


def test_auto_forecast_pays_on_a_flat_curve_and_stays_under_every_guess_right():
    flat = costs(target=lambda n: 0.1 + 0.001 * n, draft=lambda n: 0.005, catchup=lambda n: 0.005)
    speedup = auto_speedup(flat, fit(top1=0.9, runs=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)))
    best_chain = max((1 + n) / (0.005 + (n - 1) * 0.005 + 0.1 + 0.001 * (n + 1)) for n in range(1, 49))
    assert 1.3 < speedup < best_chain * 0.101
    assert auto_speedup(flat, lowered(fit(top1=0.9), 0.5)) < speedup


def test_prediction_picks_the_best_strategy():
    p = predict(costs(), fit())
    assert p.plain == pytest.approx(1 / 0.11)
    key, value = p.best
    assert value == max([*p.chains.values(), p.auto])
    assert key == "auto" or p.chains[int(key.split(":")[1])] == value


def test_one_tokens_cost_is_a_line_over_the_weights():
    a, b = line_through(1.0, 2.0, 4.0, 5.0)  # 1 s a weight, 1 s fixed
    assert (a, b) == pytest.approx((1.0, 1.0))
    assert line_through(4.0, 5.0, 1.0, 2.0) == pytest.approx((a, b))  # either order
    # a fixed cost below 0 (the larger model cheaper per weight than a line allows): proportional
    assert line_through(1.0, 1.0, 2.0, 3.0) == pytest.approx((0.0, 1.5))
    # a cost that falls with size: proportional through the larger model
    assert line_through(1.0, 3.0, 2.0, 2.0) == pytest.approx((0.0, 1.0))
    with pytest.raises(ValueError, match="different sizes"):
        line_through(1.0, 1.0, 1.0, 2.0)


def test_fitted_curve_keeps_the_shape():
    shape = np.array([0.1, 0.15, 0.4])
    assert fitted_curve(shape, 1.0) == pytest.approx([1.0, 1.5, 4.0])
