"""auto's calibration per token (planner/costmodel.calibrated, auto_calibration.trials): the draft's r
applied to each token's conditional, learnt from one trial per accepted node — against a target that
accepts each draft token with exactly the calibrated chance."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import SyntheticDrafter, sparse

from edgespec.decoding.events import EmittedToken, Provenance, StepEvent, StepTimings
from edgespec.planner.auto import SPECULATE, AutoPlanner
from edgespec.planner.auto_calibration import trials
from edgespec.planner.costmodel import CostModel, calibrated
from edgespec.planner.tree import DraftTree, PlanContext, TreeBuilder

R_TRUE = 1.45  # the draft is right more often than it says (traced over RPC: top-1 0.45, right 0.65)
Q = [0.45, 0.1] + [0.045] * 10  # every node's draft distribution, best first
# The target behind a slow link: a verify costs 50 ms and little more per token; drafting is cheap.
SLOW_LINK = CostModel.from_functions(lambda n: 0.05 + 0.002 * n, lambda n: 0.004)


def test_calibrated_scales_each_token_and_caps_what_siblings_share():
    np.testing.assert_allclose(calibrated([0.45, 0.2, 0.1], 1.45), [0.6525, 0.29, 0.0575])
    np.testing.assert_allclose(calibrated([0.45, 0.2], 0.5), [0.225, 0.1])
    rng = np.random.default_rng(0)
    for _ in range(200):
        q, r = np.sort(rng.dirichlet(np.ones(6)))[::-1], rng.uniform(0.2, 4.0)
        chances = calibrated(q, r)
        assert chances.sum() <= 1 + 1e-12 and (chances >= 0).all() and (chances <= r * q + 1e-12).all()
        assert (np.diff(chances) <= 1e-12).all()  # still best first: a subtree stays a subtree


def test_a_trial_is_each_accepted_node_with_drafted_children():
    t = TreeBuilder(5)
    a, b = t.add(0, 10, 0.5), t.add(0, 11, 0.2)
    c = t.add(0, 12, 0.1, copied=True)  # a copy: the copies' evidence, not the draft's
    d = t.add(a, 13, 0.6)
    tree = t.freeze()
    assert trials(tree, (0,)) == (0, pytest.approx(0.7))
    assert trials(tree, (0, a)) == (1, pytest.approx(1.3))  # the root's trial hit, a's missed
    assert trials(tree, (0, a, d)) == (2, pytest.approx(1.3))  # d has no children: no trial
    assert trials(tree, (0, b)) == (1, pytest.approx(0.7))
    assert trials(tree, (0, c)) == (0, pytest.approx(0.7))


def _drafter() -> SyntheticDrafter:
    def dist(path):
        ids = [(sum(path) * 31 + 7 * i + len(path)) % 1000 for i in range(len(Q))]
        return sparse(Q, ids=ids)

    return SyntheticDrafter(dist)


def _target_path(tree: DraftTree, rng: np.random.Generator) -> list[int]:
    """The accepted path: at each node the target writes the draft's j-th token with the calibrated
    chance calibrated(q, R_TRUE)_j (else a token the draft did not rank), the tree followed while
    it holds that token."""
    path = [0]
    while tree.children(path[-1]):
        dist = tree.dists[path[-1]]
        chances = calibrated(dist.probs, R_TRUE)
        j = rng.choice(chances.shape[0] + 1, p=[*chances, max(1.0 - chances.sum(), 0.0)])
        token = int(dist.ids[j]) if j < chances.shape[0] else -1
        nxt = [u for u in tree.children(path[-1]) if tree.token_ids[u] == token]
        if not nxt:
            break
        path.append(nxt[0])
    return path


def test_auto_learns_r_per_token_and_its_forecast_holds():
    """Statistics: 1,200 steps, the last 1,000 scored. r's estimate is decayed over ~33 steps of ~3
    trials (SE ≈ 0.1 at any step); its mean over 1,000 steps has SE ≈ 0.03, so ±0.12 is 4 SE (power:
    an r on whole products, 0.45 + 0.45² + … against the same hits, would sit near 2, far outside).
    The forecast's rate against the realised one: each step's tokens have SD ≈ 1.2 around a mean ≈ 3,
    so the realised rate over 1,000 steps has SE ≈ 1.3 %; ±10 % leaves room for the forecast being on
    the average distribution, not each tree."""
    planner = AutoPlanner(costs=SLOW_LINK, budget=16)
    drafter, rng = _drafter(), np.random.default_rng(7)
    ctx = PlanContext(sampling=False, rng=rng, max_nodes=65, fresh=False)
    ratios, forecast, tokens, seconds, depths = [], [], 0, 0.0, []
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
            ratios.append(planner.ratio)
            forecast.append(planner.policy.forecast_rate)
            tokens, seconds = tokens + len(path), seconds + draft + verify
            depths.append(tree.height)
    assert len(ratios) > 900  # it drafts on this link
    assert np.mean(ratios) == pytest.approx(R_TRUE, abs=0.12)
    assert tokens / seconds == pytest.approx(np.mean(forecast), rel=0.10)
    # r·q = 0.65 per token makes depth 3 pay here: r on the whole product (0.65, 0.29, 0.13 at depths
    # 1, 2, 3) stopped every tree at depth 2 (run before the change: 32.0 tokens/s against 34.8 now).
    assert np.median(depths) >= 3
