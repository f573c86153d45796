"""What a pair is predicted to gain on a machine: plain decoding's tokens/s and each strategy's speedup,
from the cost curves (``CostModel``) and the pair's fit (``DraftFit``) — ``edgespec models advise``.

Plain decoding commits one token per target decode: rate 1 / c_t(1).

A greedy chain of n draft tokens commits the target's bonus token plus its draft tokens up to the first
wrong one; the i-th is accepted when the draft's top-1 was right i times in a row, which the fit
measured (``runs[i − 1]``), so

    E[tokens per step] = 1 + Σ_{i=1..n} runs[i − 1],      speedup = E / chain_seconds(n) · c_t(1),

with ``chain_seconds`` the chain step's cost (``costmodel``). ``auto``'s speedup is its own forecast:
an ``AutoPlanner`` on the same curves and fit decides its first step (``Policy.decide``) — its forecast
rate when it drafts, else 1 (it decodes plainly where nothing pays).

A lower acceptance (``lowered``): every guess right ``factor`` × as often — runs of i right guesses
``factor``^i × as often, and the fit's r (accepted ÷ predicted) ``factor`` × its value.

Curves for a model not on this machine (``fitted_curve``): decoding one token multiplies every weight
once, and on a CPU with few cores that work (dequantising, then multiply-adding) bounds it, beside a
fixed cost per decode (the graph, the threads' barriers, the 151,936-logit output): c(1) = a + b · N,
N the weights multiplied, a line through two models measured here (the bundled target and draft;
``line_through``). The curve's shape c(n)/c(1) is the measured model's of the same role. Checked
(lab/scripts/advise_check.py) against random-weight files of the real shapes timed on the same CPU: a
2-core Xeon, the 7B's c_t(1) 383 ms fitted vs 401 measured (−5 %), c_t(16) −2 % (three hours
earlier, when the same machine's c(16)/c(1) was 4.0 and not 5.5: +9 %, +10 %); a 16-core Xeon
(../shared/notes/many-core-cpu.md), c_t(1) of the 7B −16…−8 % and of the 14B −19…−11 %. (c(1) ∝
bytes^α through the same two models: +35 % on the 2-core; a line over bytes: +48 %.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .auto import AutoPlanner
from .auto.policy import Mode
from .costmodel import CostModel, DraftFit, chain_seconds

LOWER = 0.8  # the lower acceptance shown beside the pair's: every guess right 0.8× as often
AUTO_BUDGET = 48  # auto's default cap (``AutoPlanner.budget``)


def plain_rate(costs: CostModel) -> float:
    """Tokens per second of plain decoding: one target decode a token."""
    return 1.0 / float(costs.t(1))


def chain_tokens(runs: tuple[float, ...], n: int) -> float:
    """Expected tokens a greedy chain of n commits per step (the module's formula)."""
    if n > len(runs):
        raise ValueError(f"the fit counted runs up to {len(runs)} right guesses; a chain of {n} needs more")
    return 1.0 + float(np.sum(runs[:n]))


def chain_speedup(costs: CostModel, fit: DraftFit, n: int) -> float:
    """A chain of n over plain decoding."""
    rate = chain_tokens(fit.runs, n) / float(chain_seconds(costs, n))
    return rate / plain_rate(costs)


def auto_speedup(costs: CostModel, fit: DraftFit, budget: int = AUTO_BUDGET) -> float:
    """``auto``'s own forecast of its first step over plain decoding (1: it decodes plainly)."""
    planner = AutoPlanner(budget=budget, costs=costs)
    planner.calibration.set_fit(fit)
    if planner.policy.decide(pending=1, cap=budget) is not Mode.SPECULATE:
        return 1.0
    return planner.policy.forecast_rate / plain_rate(costs)


def lowered(fit: DraftFit, factor: float = LOWER) -> DraftFit:
    """The fit with every guess right ``factor`` × as often (see the module's docstring)."""
    runs = tuple(float(r) * factor ** (i + 1) for i, r in enumerate(fit.runs))
    return replace(fit, ratio=fit.ratio * factor, runs=runs)


@dataclass(frozen=True)
class Prediction:
    plain: float  # tokens/s of plain decoding
    chains: dict[int, float]  # chain of n → speedup
    auto: float  # auto's speedup

    @property
    def best(self) -> tuple[str, float]:
        """The best strategy's key (``chain:n`` or ``auto``) and speedup; ties go to auto."""
        n, chain = max(self.chains.items(), key=lambda item: (item[1], -item[0]))
        return ("auto", self.auto) if self.auto >= chain else (f"chain:{n}", chain)


def predict(costs: CostModel, fit: DraftFit) -> Prediction:
    """Plain tokens/s, every chain the fit can forecast, and auto, on these curves with this fit."""
    chains = {n: chain_speedup(costs, fit, n) for n in range(1, len(fit.runs) + 1)}
    return Prediction(plain_rate(costs), chains, auto_speedup(costs, fit))


def fitted_curve(shape: np.ndarray, c1: float) -> np.ndarray:
    """A curve of one token's cost ``c1`` with the measured ``shape`` (seconds by n; only c(n)/c(1) used)."""
    return shape / shape[0] * c1


def line_through(n_a: float, c1_a: float, n_b: float, c1_b: float) -> tuple[float, float]:
    """(a, b) of c(1) = a + b · N through two measured models (N: weights multiplied a token). A fixed
    cost below 0 or a cost that falls with size (noise, or a draft of slower types than the target)
    gives the proportional line through the larger model: (0, c1 / N)."""
    if n_a <= 0 or n_b <= 0 or n_a == n_b or c1_a <= 0 or c1_b <= 0:
        raise ValueError("two models of different sizes, with costs, are needed to fit c(1) to their weights")
    (n_small, c_small), (n_large, c_large) = sorted([(n_a, c1_a), (n_b, c1_b)])
    b = (c_large - c_small) / (n_large - n_small)
    a = c_large - b * n_large
    if a < 0 or b <= 0:
        return 0.0, c_large / n_large
    return float(a), float(b)
