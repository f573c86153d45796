"""MCSD's early-stop decision model (Lu et al. 2024, §3.3, the second kind): a small MLP on the
draft's output distribution — its top-k probabilities and its entropy — predicting whether the
target will accept the token drawn from it. Drafting stops at a level when the prediction for every
branch is below β (0.4 in the paper).

Pure numpy: features from a ``SparseDist``, a logistic regression (``hidden=0``) or a one-hidden-layer
MLP trained by full-batch Adam on the log-loss, ``save``/``load`` as ``.npz``, and AUC / accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .tree import SparseDist

N_TOP = 8  # top-k probabilities in the features
FEATURE_NAMES = (*(f"p{i + 1}" for i in range(N_TOP)), "entropy", "tail_mass", "chosen_prob")


def features(dist: SparseDist, chosen_prob: float | None = None) -> np.ndarray:
    """(F,) features of the distribution a token was drawn from.

    * the top-8 probabilities (zero-padded);
    * an entropy estimate: −Σ p log p over the kept candidates, plus the leftover mass m counted as
      one outcome (−m log m) — a lower bound, since the tail is really spread over many tokens;
    * the leftover (tail) mass 1 − Σ p;
    * the probability of the token actually chosen (the top one when not given).
    """
    probs = np.asarray(dist.probs, dtype=np.float64)
    top = np.zeros(N_TOP)
    top[: min(N_TOP, probs.shape[0])] = probs[:N_TOP]
    tail = max(0.0, 1.0 - float(probs.sum()))
    kept = probs[probs > 0.0]
    entropy = float(-(kept * np.log(kept)).sum()) + (-tail * np.log(tail) if tail > 0.0 else 0.0)
    chosen = float(probs[0]) if chosen_prob is None else float(chosen_prob)
    return np.concatenate([top, [entropy, tail, chosen]])


def feature_matrix(dists: Sequence[SparseDist], chosen_probs: Sequence[float] | None = None) -> np.ndarray:
    """(n, F): one row of ``features`` per (distribution, chosen probability)."""
    if not dists:
        return np.zeros((0, len(FEATURE_NAMES)))
    chosen = chosen_probs if chosen_probs is not None else [None] * len(dists)
    return np.stack([features(d, c) for d, c in zip(dists, chosen)])


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # = 1 / (1 + e^{-z}), without overflow


@dataclass
class DecisionModel:
    """P(accept | features) = σ(w2 · tanh(W1 x̃ + b1) + b2), x̃ the standardised features.

    With no hidden layer (``w1`` of shape (F, 0)) it is a logistic regression: σ(w2 · x̃ + b2).
    """

    mean: np.ndarray  # (F,) feature means from the training set
    scale: np.ndarray  # (F,) feature standard deviations (1 where constant)
    w1: np.ndarray  # (F, H)
    b1: np.ndarray  # (H,)
    w2: np.ndarray  # (H,) or (F,) when H = 0
    b2: float

    @property
    def hidden(self) -> int:
        return int(self.w1.shape[1])

    def logits(self, x: np.ndarray) -> np.ndarray:
        z = (np.atleast_2d(x) - self.mean) / self.scale  # (n, F)
        h = np.tanh(z @ self.w1 + self.b1) if self.hidden else z  # (n, H) or (n, F)
        return h @ self.w2 + self.b2  # (n,)

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """(n,) predicted acceptance probabilities for an (n, F) feature matrix."""
        return _sigmoid(self.logits(x))

    @classmethod
    def fit(
        cls,
        x: np.ndarray,
        y: np.ndarray,
        hidden: int = 16,
        epochs: int = 400,
        lr: float = 0.05,
        l2: float = 1e-4,
        seed: int = 0,
    ) -> DecisionModel:
        """Minimise the mean log-loss (+ l2/2 · |weights|²) with full-batch Adam."""
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if x.ndim != 2 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
            raise ValueError(f"need an (n, F) feature matrix and n labels, got {x.shape} and {y.shape}")
        mean = x.mean(axis=0)
        scale = x.std(axis=0)
        scale[scale == 0.0] = 1.0
        z = (x - mean) / scale  # (n, F)
        rng = np.random.default_rng(seed)
        n, f = z.shape
        params = {
            "w1": rng.normal(0.0, 1.0 / np.sqrt(f), (f, hidden)),
            "b1": np.zeros(hidden),
            "w2": rng.normal(0.0, 1.0 / np.sqrt(max(hidden, 1)), hidden if hidden else f),
            "b2": np.zeros(1),
        }
        moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
        beta1, beta2, eps = 0.9, 0.999, 1e-8
        for step in range(1, epochs + 1):
            h = np.tanh(z @ params["w1"] + params["b1"]) if hidden else z  # (n, H)
            p = _sigmoid(h @ params["w2"] + params["b2"][0])  # (n,)
            err = (p - y) / n  # d(mean log-loss)/d(logit)
            grads = {"w2": h.T @ err + l2 * params["w2"], "b2": np.array([err.sum()])}
            if hidden:
                dh = np.outer(err, params["w2"]) * (1.0 - h**2)  # (n, H) back through tanh
                grads["w1"] = z.T @ dh + l2 * params["w1"]
                grads["b1"] = dh.sum(axis=0)
            for k, g in grads.items():
                m, v = moments[k]
                m[...] = beta1 * m + (1 - beta1) * g
                v[...] = beta2 * v + (1 - beta2) * g**2
                m_hat, v_hat = m / (1 - beta1**step), v / (1 - beta2**step)
                params[k] = params[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
        return cls(mean, scale, params["w1"], params["b1"], params["w2"], float(params["b2"][0]))

    def save(self, path: str | Path) -> None:
        np.savez(
            path,
            mean=self.mean,
            scale=self.scale,
            w1=self.w1,
            b1=self.b1,
            w2=self.w2,
            b2=np.array(self.b2),
            feature_names=np.array(FEATURE_NAMES),
        )

    @classmethod
    def load(cls, path: str | Path) -> DecisionModel:
        with np.load(path) as data:
            names = tuple(str(s) for s in data["feature_names"])
            if names != FEATURE_NAMES:
                raise ValueError(
                    f"{path}: the model was trained on features {names}, this version computes "
                    f"{FEATURE_NAMES}; train it again"
                )
            return cls(data["mean"], data["scale"], data["w1"], data["b1"], data["w2"], float(data["b2"]))


def auc(y_true: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: P(score of a random positive > score of a random negative), ties ½.

    The Mann–Whitney statistic from average ranks.
    """
    y = np.asarray(y_true).astype(bool).reshape(-1)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both positive and negative examples")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(s.shape[0])
    ranks[order] = np.arange(1, s.shape[0] + 1)
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    # Ties share the mean of the ranks they span.
    rank_sums = np.bincount(inverse, weights=ranks)
    ranks = (rank_sums / counts)[inverse]
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def accuracy(y_true: np.ndarray, scores: np.ndarray, threshold: float = 0.5) -> float:
    """Share of examples where (score ≥ threshold) equals the label."""
    y = np.asarray(y_true).astype(bool).reshape(-1)
    return float(np.mean((np.asarray(scores).reshape(-1) >= threshold) == y))
