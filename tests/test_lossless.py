"""Every registered strategy through the losslessness harness (``lossless.py``): planner → tree →
``verify_sampling`` on a synthetic pair, chi-square tests at a false-alarm rate of 1e-3 per strategy,
STEPS steps (a 0.005 shift in any first-token frequency fails with probability ≥ 0.9), fixed seeds.

The self-checks below plant the three defects the harness exists for, and show it failing on each:
the with-replacement residual rule on siblings drawn without replacement, raw (un-renormalised)
top-K probabilities used as q, and DySpec's old node seeding ``default_rng([seed, *path])``.
"""

from __future__ import annotations

import numpy as np
import pytest
from lossless import ROOT, STEPS, STRATEGIES, history_for, make_pair, planner_for, run

from edgespec.decoding import verify
from edgespec.planner import dyspec
from edgespec.planner.tree import node_rng

PAIR = make_pair()
LOSSY_STEPS = STEPS // 10  # a lossy strategy must show its loss with a tenth of the data
DEFECT_STEPS = STEPS // 4  # the planted defects are caught with a quarter of it (a fortiori with all)


@pytest.mark.parametrize("name", STRATEGIES)
def test_strategy_is_lossless_or_flagged_lossy(name):
    planner = planner_for(name, PAIR)
    steps = LOSSY_STEPS if planner.lossy else STEPS
    result = run(planner, PAIR, steps=steps, seed=1, history=history_for(name))
    print(f"\n{name}: p(first) = {result.p_first:.3g}, p(later) = {result.p_later:.3g}")
    assert result.max_depth >= 3, f"{name}: give it parameters (lossless.PARAMS) that reach depth 3"
    if planner.lossy:
        assert not result.passed, f"{name} is flagged lossy but the harness sees no loss"
    else:
        assert result.passed, (
            f"{name} changes the output distribution: p = {result.p_first:.3g}, {result.p_later:.3g}"
        )


def test_the_pair_exercises_every_sibling_count():
    seen = set()
    for name in STRATEGIES:
        seen |= run(planner_for(name, PAIR), PAIR, steps=20, seed=2, history=history_for(name)).siblings
    assert {1, 2, 3, 4} <= seen
    assert all(d.probs.sum() < 0.99 for d in PAIR.draft)  # top-K truncation: q must be renormalised
    assert PAIR.target[ROOT].max() <= 0.07  # the sample size relies on it


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
    result = run(planner, PAIR, steps=DEFECT_STEPS, seed=3)
    print(f"\n{defect}: p(first) = {result.p_first:.3g}, p(later) = {result.p_later:.3g}")
    assert not result.passed


def test_harness_catches_the_old_dyspec_seeding(monkeypatch):
    old = lambda seed, path: np.random.default_rng([seed, *(int(t) for t in path)])  # noqa: E731
    monkeypatch.setattr(dyspec, "node_rng", old)
    result = run(planner_for("dyspec", PAIR), PAIR, steps=DEFECT_STEPS, seed=4)
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
    result = run(planner_for("parallelspec", PAIR), PAIR, steps=DEFECT_STEPS, seed=5)
    print(f"\ntop tokens as draws: p(first) = {result.p_first:.3g}, p(later) = {result.p_later:.3g}")
    assert not result.passed
