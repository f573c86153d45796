"""The MCSD early-stop decision model: features, fitting, save/load, and the AUC/accuracy helpers."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.planner.earlystop import (
    FEATURE_NAMES,
    N_TOP,
    DecisionModel,
    accuracy,
    auc,
    feature_matrix,
    features,
)
from tests.support.fakes import sparse


def test_features_of_a_distribution():
    f = features(sparse([0.25, 0.25, 0.25, 0.25]))
    assert f.shape == (len(FEATURE_NAMES),) == (N_TOP + 3,)
    assert f[:4] == pytest.approx([0.25] * 4) and not f[4:N_TOP].any()
    assert f[N_TOP] == pytest.approx(np.log(4))  # entropy of a uniform over 4
    assert f[N_TOP + 1] == pytest.approx(0.0)  # no tail
    assert f[N_TOP + 2] == pytest.approx(0.25)  # chosen defaults to the top probability
    truncated = features(sparse([0.5, 0.2]), chosen_prob=0.2)
    tail = 0.3
    assert truncated[N_TOP] == pytest.approx(-(0.5 * np.log(0.5) + 0.2 * np.log(0.2) + tail * np.log(tail)))
    assert truncated[N_TOP + 1] == pytest.approx(tail) and truncated[N_TOP + 2] == 0.2
    assert feature_matrix([sparse([1.0]), sparse([0.6, 0.4])], [1.0, 0.4]).shape == (2, N_TOP + 3)
    assert feature_matrix([]).shape == (0, N_TOP + 3)


def synthetic_data(n: int, seed: int):
    """Peaked distributions get accepted, flat ones rejected (with 5 % label noise)."""
    rng = np.random.default_rng(seed)
    dists, labels = [], []
    for _ in range(n):
        sharp = rng.uniform(0.2, 4.0)
        logits = rng.normal(size=50) * sharp
        probs = np.exp(logits - logits.max())
        dist = sparse(probs / probs.sum(), top_k=16)
        accepted = dist.probs[0] > 0.5
        labels.append(accepted if rng.random() > 0.05 else not accepted)
        dists.append(dist)
    return feature_matrix(dists), np.asarray(labels, dtype=float)


@pytest.mark.parametrize("hidden", [0, 16])
def test_fit_separates_synthetic_data(hidden):
    x, y = synthetic_data(1500, seed=0)
    x_test, y_test = synthetic_data(800, seed=1)
    model = DecisionModel.fit(x, y, hidden=hidden, epochs=300, seed=0)
    scores = model.predict_proba(x_test)
    assert scores.shape == (800,) and ((scores >= 0) & (scores <= 1)).all()
    assert auc(y_test, scores) > 0.9
    assert accuracy(y_test, scores) > 0.85
    assert model.hidden == hidden


def test_save_load_roundtrip(tmp_path):
    x, y = synthetic_data(300, seed=2)
    model = DecisionModel.fit(x, y, hidden=8, epochs=50)
    path = tmp_path / "stop.npz"
    model.save(path)
    loaded = DecisionModel.load(path)
    assert np.array_equal(loaded.predict_proba(x), model.predict_proba(x))
    assert loaded.hidden == 8


def test_load_refuses_a_model_with_other_features(tmp_path):
    path = tmp_path / "old.npz"
    np.savez(
        path,
        mean=np.zeros(2),
        scale=np.ones(2),
        w1=np.zeros((2, 0)),
        b1=np.zeros(0),
        w2=np.zeros(2),
        b2=np.array(0.0),
        feature_names=np.array(["a", "b"]),
    )
    with pytest.raises(ValueError, match="train it again"):
        DecisionModel.load(path)


def test_fit_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        DecisionModel.fit(np.zeros((3, 2)), np.zeros(4))


def test_auc_and_accuracy_helpers():
    y = np.array([0, 0, 1, 1])
    assert auc(y, [0.1, 0.2, 0.8, 0.9]) == 1.0
    assert auc(y, [0.9, 0.8, 0.2, 0.1]) == 0.0
    assert auc(y, [0.5, 0.5, 0.5, 0.5]) == 0.5  # ties count half
    assert auc(y, [0.1, 0.6, 0.4, 0.9]) == 0.75
    assert accuracy(y, [0.1, 0.6, 0.4, 0.9]) == 0.5
    with pytest.raises(ValueError):
        auc([1, 1], [0.2, 0.3])
