"""How often the draft's guess is the target's token, as a function of the probability q the draft gave
it: ``auto``'s calibration curve, learnt online from the trees it verified.

A draft's probabilities are seldom calibrated, and not by one factor. Measured on three prompts' greedy
answers (``lab/scripts/acceptance_by_q.py``, the bundled pair): guesses at q ≈ 0.15, 0.31, 0.49, 0.71,
0.97 were right 50, 64, 81, 100, 98 % of the time — accepted ÷ predicted 3.4, 2.0, 1.65, 1.41, 1.01.
One factor r on q (or on a path's Π q) under-rates the confident tokens of an unsure draft or
over-rates its unsure ones. So the chance a guess is right is Platt's logistic curve on the draft's
log-odds,

    chance(q) = σ(a · logit q + b),     the identity at a = 1, b = 0,

(the three prompts: a ≈ 0.8, b ≈ 1.4), fitted by weighted maximum likelihood to **trials**: at each
node of a verified tree's accepted path whose draft children it held, was the target's next token the
draft's top-1 child (q its probability)? Older trials fade by ``acceptance_decay`` per step; a Gaussian prior
(``acceptance_prior_weight``) holds (a, b) near where the pair's fit puts them (``Calibration.set_fit``)
until trials say otherwise. A fit measured on n positions weighs on b as the trials it saw would
(``from_rate``), up to ``fit_trials`` of them: otherwise four unlucky one-token trees, on a 7B target
where drafting wins by 12 %, moved the curve below break-even, and auto decoded plainly for the rest of
its answer (plain steps teach the curve nothing). A node's chance is the product of its path's
chances, each capped so that siblings share at most 1 (``calibrated``): the top m nodes by it still
form a subtree.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .tuning import TUNING

EPS = 1e-6
NEWTON_STEPS = 20  # at most (from the last fit: usually 2–3)


def logit(q):
    q = np.clip(np.asarray(q, dtype=np.float64), EPS, 1 - EPS)
    return np.log(q) - np.log1p(-q)


def calibrated(q, a: float, b: float) -> np.ndarray:
    """The chances that each of a node's children is the target's next token, their draft probabilities
    q given best first: σ(a·logit q + b) each, capped at 1 − Σ of the better siblings' chances (one of
    them at most is the target's token), so still best first."""
    q = np.asarray(q, dtype=np.float64)
    chance = np.where(q > 0, 1.0 / (1.0 + np.exp(-(a * logit(q) + b))), 0.0)
    before = np.cumsum(chance) - chance  # past 1 the rest get 0 anyway
    return np.clip(np.minimum(chance, 1.0 - before), 0.0, None)


def trials(tree, path) -> list[tuple[float, bool]]:
    """A verified tree's trials: at each node of the accepted ``path`` (root first) with drafted children,
    (q of the likeliest of them — the draft's top-1 guess, which auto always keeps — and whether the
    path goes on through it). (Copies' children are the copies' evidence, ``copies``.)"""
    out = []
    for i, node in enumerate(path):
        kids = [u for u in tree.children(node) if not tree.copied_flags[u]]
        if kids:
            top = max(kids, key=lambda u: tree.draft_probs[u])
            out.append((float(tree.draft_probs[top]), i + 1 < len(path) and path[i + 1] == top))
    return out


class Acceptance:
    """The curve (a, b), its prior, and the trials it was fitted to."""

    def __init__(self, a: float = 1.0, b: float = 0.0, b_weight: float | None = None):
        self.prior = np.array([a, b])
        # the prior's pull, 1 / variance, on a and on b
        self.prior_weight = TUNING.acceptance_prior_weight.copy()
        if b_weight is not None:
            self.prior_weight[1] = max(b_weight, self.prior_weight[1])
        self.theta = self.prior.copy()
        self.step = 0
        # (logit q, hit, step)
        self._trials: deque[tuple[float, float, int]] = deque(maxlen=TUNING.trials_kept)

    @classmethod
    def from_rate(cls, q: float, right: float, seen: int = 0) -> Acceptance:
        """The prior where a guess of probability q is right ``right`` of the time: b = logit(right) −
        logit(q) at a = 1 (a pair's fit gives its mean top-1 and how often it was right, over ``seen``
        positions). Its pull on b is what those trials' own would be: each trial's Fisher information
        on the log-odds is right · (1 − right), so n = min(seen, ``fit_trials``) of them pull with
        n · right · (1 − right) (never less than the default's)."""
        right = min(right, 0.99)
        b = float(np.clip(logit(right) - logit(q), *TUNING.b_range))
        return cls(1.0, b, min(seen, TUNING.fit_trials) * right * (1.0 - right))

    @property
    def a(self) -> float:
        return float(self.theta[0])

    @property
    def b(self) -> float:
        return float(self.theta[1])

    def chances(self, q) -> np.ndarray:
        return calibrated(q, self.a, self.b)

    def chance(self, q: float) -> float:
        """The chance a lone guess of probability q is right."""
        return float(self.chances([q])[0])

    def learn(self, observed: list[tuple[float, bool]]) -> None:
        """One step's trials: the curve refitted (Newton's method from the last fit)."""
        self.step += 1
        for q, hit in observed:
            self._trials.append((float(logit(q)), float(hit), self.step))
        if not self._trials:
            return
        x, y, when = (np.array(column) for column in zip(*self._trials))
        w = TUNING.acceptance_decay ** (self.step - when)
        features = np.stack([x, np.ones_like(x)], axis=1)  # (n, 2): log-odds and the intercept
        theta = self.theta.copy()
        for _ in range(NEWTON_STEPS):  # maximise Σ w·log-likelihood − ½ Σ prior weight·(θ − prior)²
            p = 1.0 / (1.0 + np.exp(-(features @ theta)))
            grad = features.T @ (w * (y - p)) - self.prior_weight * (theta - self.prior)
            hess = -(features.T * (w * p * (1 - p))) @ features - np.diag(self.prior_weight)
            step = np.linalg.solve(hess, grad)
            theta = theta - step
            if np.abs(step).max() < 1e-4:
                break
        self.theta = np.array([np.clip(theta[0], *TUNING.a_range), np.clip(theta[1], *TUNING.b_range)])
