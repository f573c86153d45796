"""auto's acceptance curve (planner/auto/acceptance.py): the chance a draft guess is right as a function
of its probability q, σ(a·logit q + b), learnt from one trial per accepted node — against a target
that takes each draft token with exactly the curve's chance."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.events import EmittedToken, Provenance, StepEvent, StepTimings
from edgespec.planner.auto import SPECULATE, AutoPlanner
from edgespec.planner.auto.acceptance import Acceptance, calibrated, trials
from edgespec.planner.costmodel import CostModel
from edgespec.planner.inputs import PlanContext
from edgespec.planner.tree import DraftTree, TreeBuilder
from tests.support.fakes import SyntheticDrafter, sparse

TRUE = (0.8, 1.4)  # (a, b) as on the bundled pair's chat answer: q 0.3 → 0.67, 0.5 → 0.80, 0.9 → 0.97
TOP1 = (0.3, 0.45, 0.6, 0.9)  # the draft's top-1 at a node, by a hash of its path
# The target behind a slow link: a verify costs 50 ms and little more per token; drafting is cheap.
SLOW_LINK = CostModel.from_functions(lambda n: 0.05 + 0.002 * n, lambda n: 0.004)


def test_calibrated_is_the_identity_at_a_1_b_0_and_siblings_share_at_most_1():
    np.testing.assert_allclose(calibrated([0.45, 0.2, 0.1], 1.0, 0.0), [0.45, 0.2, 0.1])
    np.testing.assert_allclose(calibrated([0.5, 0.3], 1.0, np.log(3)), [0.75, 0.25])  # odds × 3, capped
    assert calibrated([0.0, 0.0], 0.8, 1.4).tolist() == [0.0, 0.0]
    rng = np.random.default_rng(0)
    for _ in range(200):
        q, a, b = np.sort(rng.dirichlet(np.ones(6)))[::-1], rng.uniform(0.2, 4.0), rng.uniform(-6, 6)
        chances = calibrated(q, a, b)
        assert chances.sum() <= 1 + 1e-12 and (chances >= 0).all()
        assert (np.diff(chances) <= 1e-12).all()  # still best first: a subtree stays a subtree


def test_a_trial_is_each_accepted_node_with_drafted_children_and_its_top_guess():
    t = TreeBuilder(5)
    a, b = t.add(0, 10, 0.5), t.add(0, 11, 0.2)
    c = t.add(0, 12, 0.1, copied=True)  # a copy: the copies' evidence, not the draft's
    d = t.add(a, 13, 0.6)
    tree = t.freeze()
    assert trials(tree, (0,)) == [(0.5, False)]
    assert trials(tree, (0, a)) == [(0.5, True), (0.6, False)]
    assert trials(tree, (0, a, d)) == [(0.5, True), (0.6, True)]  # d has no children: no trial
    assert trials(tree, (0, b)) == [(0.5, False)]  # the second guess was right: the top-1 was not
    assert trials(tree, (0, c)) == [(0.5, False)]


def test_the_curve_is_recovered_from_trials_and_held_by_its_prior_without_them():
    """Statistics: 60 steps of 8 trials at q ∈ TOP1, the last ~33 steps weighing (≈ 260 trials). The
    chance at q = 0.45 has SE ≈ 0.03 there; ±0.08 is over 2.5 SE, and a curve left at the identity
    (0.45) or a factor r fitted to the same trials (0.45 × 1.6 on average: 0.72 at 0.45, but 1.4 at
    0.9) is outside it at one q or another."""
    rng = np.random.default_rng(3)
    curve = Acceptance()
    assert curve.chance(0.45) == pytest.approx(0.45)  # no trials: the prior, the identity
    assert Acceptance.from_rate(0.77, 0.75).chance(0.77) == pytest.approx(0.75)
    for _ in range(60):
        q = rng.choice(TOP1, size=8)
        hits = rng.random(8) < calibrated_each(q)
        curve.learn(list(zip(q.tolist(), hits.tolist())))
    for q in TOP1:
        assert curve.chance(q) == pytest.approx(calibrated_each(np.array([q]))[0], abs=0.08)


def calibrated_each(q: np.ndarray) -> np.ndarray:
    return np.array([calibrated([x], *TRUE)[0] for x in q])


def _drafter() -> SyntheticDrafter:
    def dist(path):
        top = TOP1[(sum(path) * 7 + len(path)) % len(TOP1)]
        rest = (1 - top) * np.array([0.4, 0.25, 0.15, 0.1, 0.1])
        ids = [(sum(path) * 31 + 7 * i + len(path)) % 1000 for i in range(6)]
        return sparse([top, *rest], ids=ids)

    return SyntheticDrafter(dist)


def _target_path(tree: DraftTree, rng: np.random.Generator) -> list[int]:
    """The accepted path: at each node the target writes the draft's j-th token with the true curve's
    chance (else a token the draft did not rank), the tree followed while it holds that token."""
    path = [0]
    while tree.children(path[-1]):
        dist = tree.dists[path[-1]]
        chances = calibrated(dist.probs, *TRUE)
        j = rng.choice(chances.shape[0] + 1, p=[*chances, max(1.0 - chances.sum(), 0.0)])
        token = int(dist.ids[j]) if j < chances.shape[0] else -1
        nxt = [u for u in tree.children(path[-1]) if tree.token_ids[u] == token]
        if not nxt:
            break
        path.append(nxt[0])
    return path


def test_auto_learns_the_curve_on_its_own_trees_and_its_forecast_holds():
    """Statistics: 1,200 steps, the last 1,000 scored. The learnt chance at q = 0.45 is averaged over
    1,000 steps (SE well under 0.02; ±0.06 is the bias a decayed window and the prior may leave). The
    realised rate against the forecast: a step's tokens have SD ≈ 1.3 around a mean ≈ 3, so over 1,000
    steps the realised rate has SE ≈ 1.4 %; ±10 % leaves room for the forecast being on the average
    distribution, not each tree."""
    planner = AutoPlanner(costs=SLOW_LINK, budget=16)
    drafter, rng = _drafter(), np.random.default_rng(7)
    ctx = PlanContext(sampling=False, rng=rng, max_nodes=65, fresh=False)
    chances, forecast, tokens, seconds, depths = [], [], 0, 0.0, []
    for step in range(1200):
        tree = planner.plan(7, drafter, ctx)
        path = _target_path(tree, rng)
        draft, verify = 0.004 * tree.stats.draft_decodes, float(SLOW_LINK.t(tree.size))
        planner.observe(
            StepEvent(
                tokens=(EmittedToken(1, Provenance.TARGET, 1.0),) * len(path),
                text="", drafted=tree.size - 1, accepted=len(path) - 1,
                timings=StepTimings(draft=draft, verify=verify), tree=tree, accepted_path=tuple(path),
                verified_nodes=tree.size, draft_decodes=tree.stats.draft_decodes,
                expected_accept=tree.stats.expected_accept,
            )
        )  # fmt: skip
        if step >= 200 and planner.mode == SPECULATE:
            chances.append(planner.acceptance.chance(0.45))
            forecast.append(planner.policy.forecast_rate)
            tokens, seconds = tokens + len(path), seconds + draft + verify
            depths.append(tree.height)
    assert len(chances) > 900  # it drafts on this link
    assert np.mean(chances) == pytest.approx(calibrated([0.45], *TRUE)[0], abs=0.06)
    assert tokens / seconds == pytest.approx(np.mean(forecast), rel=0.10)
    assert np.median(depths) >= 3
