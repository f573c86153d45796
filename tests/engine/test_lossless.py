"""Every registered strategy through the losslessness harness (``lossless.py``): the decoder's own step
on a synthetic pair, the target sampling with temperature, top-K and top-P, adaptive planners learning
through ``observe`` as they go; chi-square tests at a false-alarm rate of 1e-3 per strategy, fixed seeds.
The quick tier runs QUICK_STEPS steps per strategy (a QUICK_DELTA shift in any first-token frequency
fails with probability ≥ 0.9); the full run (``slow``) STEPS (a 0.005 shift, the same power).

The self-checks below plant the defects the harness exists for, and show it failing on each: the
with-replacement residual rule on siblings drawn without replacement, raw (un-renormalised) top-K
probabilities used as q, DySpec's old node seeding ``default_rng([seed, *path])``, ParallelSpec's top
tokens verified as draws, and a verifier that ignores the target's top-K / top-P.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding import verify
from edgespec.decoding.sampling import SamplingParams
from edgespec.engine import rows
from edgespec.planner import dyspec
from edgespec.planner.inputs import node_rng
from tests.support.lossless import (
    POWER,
    QUICK_DELTA,
    QUICK_STEPS,
    ROOT,
    SAMPLING,
    STEPS,
    STRATEGIES,
    costs_for,
    expected_rows,
    first_token_power,
    history_for,
    make_pair,
    planner_for,
    run,
)

PAIR = make_pair()
LOSSY_STEPS = QUICK_STEPS // 2  # a lossy strategy must show its loss with half the quick run
DEFECT_STEPS = QUICK_STEPS // 3  # the planted defects are caught with a third of it (a fortiori with all) …
SEEDING_STEPS = 2 * QUICK_STEPS  # … but DySpec's old seeding, a weak correlation, needs twice the quick run


def _check(name: str, steps: int) -> None:
    planner = planner_for(name, PAIR)
    steps = min(steps, LOSSY_STEPS) if planner.lossy else steps
    result = run(planner, PAIR, steps, seed=1, history=history_for(name), costs=costs_for(name))
    print(f"\n{name}: p(first) = {result.p_first:.3g}, p(later) = {result.p_later:.3g}")
    assert result.max_depth >= 3, f"{name}: give it parameters (lossless.PARAMS) that reach depth 3"
    if planner.lossy:
        assert not result.passed, f"{name} is flagged lossy but the harness sees no loss"
    else:
        assert result.passed, (
            f"{name} changes the output distribution: p = {result.p_first:.3g}, {result.p_later:.3g}"
        )


# The full run's slowest first (on 2 cores: auto 350 s, auto-parallel 240 s, hybrid and parallelspec
# 110 s; the rest 20–80 s), so that scripts/test.sh's two workers (pytest -n 2) finish together.
SLOWEST_FIRST = sorted(
    STRATEGIES, key=lambda name: ("auto" not in name, name not in ("hybrid", "parallelspec"))
)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOWEST_FIRST)
def test_strategy_is_lossless_or_flagged_lossy_at_full_power(name):
    _check(name, STEPS)


@pytest.mark.parametrize("name", STRATEGIES)
def test_strategy_is_lossless_or_flagged_lossy(name):
    _check(name, QUICK_STEPS)


def test_the_stated_power_holds():
    assert first_token_power(STEPS, 0.005) >= POWER
    assert first_token_power(QUICK_STEPS, QUICK_DELTA) >= POWER


def test_the_pair_exercises_every_sibling_count_and_the_sampling_transform():
    seen = set()
    for name in STRATEGIES:
        planner = planner_for(name, PAIR)
        seen |= run(planner, PAIR, 20, seed=2, history=history_for(name), costs=costs_for(name)).siblings
    assert {1, 2, 3, 4} <= seen
    assert all(d.probs.sum() < 0.99 for d in PAIR.draft)  # top-K truncation: q must be renormalised
    p = expected_rows(PAIR)
    assert p[ROOT].max() <= 0.0845  # the sample size relies on it
    cut = {int(t) for t in PAIR.draft[ROOT].ids if p[ROOT][t] == 0}
    assert cut, "the draft proposes tokens the target's top-K cuts after ROOT"
    assert all(np.count_nonzero(row) < len(row) for row in p)  # top-K / top-P cut every row


def test_adaptive_planners_are_checked_after_learning():
    """auto, ngram and hybrid plan every step afresh (nothing replayed), auto in every mode it takes
    on the harness's machine: its trees, its plain steps (the guard measuring plain decoding)."""
    for name in ("auto", "ngram", "hybrid"):
        planner = planner_for(name, PAIR)
        result = run(planner, PAIR, 200, seed=2, history=history_for(name), costs=costs_for(name))
        assert result.fresh_trees
    auto = planner_for("auto", PAIR)
    result = run(auto, PAIR, 200, seed=2, history=history_for("auto"), costs=costs_for("auto"))
    assert auto.steps["speculate"] > 100 and auto.steps["plain"] > 0 and result.plain_steps > 0
    assert auto.acceptance.step > 0 and auto.acceptance.b != 0.0  # observe has run: the curve is learnt


# -- planted defects ---------------------------------------------------------------------------------
def _residual_rule_with(defect: str):
    """``verify._residual_rule`` with one mistake planted."""

    def rule(tree, node, children, p, rng):
        dist = tree.dists[node]
        q = (dist.probs if defect == "raw top-K" else dist.sampling_q()).copy()
        for child in children:
            token = int(tree.tokens[child])
            slot = np.flatnonzero(dist.ids == token)[0]
            if rng.random() * q[slot] < p[token]:
                return child
            residual = p.copy()
            residual[dist.ids] = np.maximum(p[dist.ids] - q, 0.0)
            p[:] = residual / residual.sum()
            if defect != "with replacement":  # the right rule: x leaves q before the next sibling
                q[slot] = 0.0
                q /= q.sum()
        return None

    return rule


@pytest.mark.parametrize("defect", ["with replacement", "raw top-K"])
def test_harness_catches_a_wrong_residual_rule(monkeypatch, defect):
    planner = planner_for("mcsd", PAIR)  # k = 4 sampled siblings at the root
    monkeypatch.setattr(verify, "_residual_rule", _residual_rule_with(defect))
    result = run(planner, PAIR, DEFECT_STEPS, seed=3)
    print(f"\n{defect}: p(first) = {result.p_first:.3g}, p(later) = {result.p_later:.3g}")
    assert not result.passed


def test_harness_catches_the_old_dyspec_seeding(monkeypatch):
    old = lambda seed, path: np.random.default_rng([seed, *(int(t) for t in path)])  # noqa: E731
    monkeypatch.setattr(dyspec, "node_rng", old)
    result = run(planner_for("dyspec", PAIR), PAIR, SEEDING_STEPS, seed=4)
    print(f"\nold seeding: p(first) = {result.p_first:.3g}, p(later) = {result.p_later:.3g}")
    assert not result.passed


def test_node_streams_are_distinct_where_the_old_seeding_collided():
    """numpy pads seeds with zero words: [s, 5] and [s, 5, 0] were the same stream."""
    seed = 12345
    assert np.array_equal(
        np.random.default_rng([seed, 5]).random(4), np.random.default_rng([seed, 5, 0]).random(4)
    )
    paths = [(5,), (5, 0), (5, 0, 0), (0, 5), (5, 1), (6,)]
    draws = {path: node_rng(seed, path).random(4).tobytes() for path in paths}
    assert len(set(draws.values())) == len(paths)
    assert node_rng(seed, (5, 0)).random() == node_rng(seed, (5, 0)).random()  # a function of the node
    assert node_rng(2**32, (5,)).random() != node_rng(0, (1, 5)).random()  # the seed is fixed-width


def test_harness_catches_parallelspec_children_not_drawn_from_q(monkeypatch):
    """Sampling trees whose children are the top tokens but verified as draws: the residual rule
    assumes a draw from q that never happened."""
    from edgespec.planner import parallel

    monkeypatch.setattr(parallel, "draw_order", lambda dist, seed, path: dyspec.draw_order(dist, None, path))
    result = run(planner_for("parallelspec", PAIR), PAIR, DEFECT_STEPS, seed=5)
    print(f"\ntop tokens as draws: p(first) = {result.p_first:.3g}, p(later) = {result.p_later:.3g}")
    assert not result.passed


def test_harness_catches_a_verifier_that_ignores_top_k_and_top_p(monkeypatch):
    """The verifier given the target's plain softmax (temperature only) instead of its sampling
    distribution: tokens the target's top-K / top-P cut are emitted."""
    target_probs = rows.target_probs
    monkeypatch.setattr(
        rows, "target_probs", lambda row, params: target_probs(row, SamplingParams(params.temperature))
    )
    result = run(planner_for("chain", PAIR), PAIR, DEFECT_STEPS, seed=6)
    print(f"\nno top-K / top-P: p(first) = {result.p_first:.3g}, p(later) = {result.p_later:.3g}")
    assert not result.passed
    assert SAMPLING.top_k and SAMPLING.top_p < 1
