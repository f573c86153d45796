"""Logits to probabilities, for both sides of speculation. Pure numpy.

Target side: one dense distribution p per tree node the verifier visits (only the accepted path).
Draft side: a whole level's rows at once, reduced to their top-K candidates without sorting or
exponentiating per node in Python: one ``argpartition`` and one ``logsumexp`` over the (rows, V) block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .planner.tree import SparseDist

TOP_P_PARTITION = 2048  # top-p is resolved among this many best logits when their mass suffices


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 → greedy: every emitted token is the target's argmax
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def top2_margin(logits_row: np.ndarray) -> float:
    """Top-1 minus top-2 logit: how close this decision was to a tie."""
    top2 = np.partition(logits_row, -2)[-2:]
    return float(top2[1] - top2[0])


def target_probs(logits_row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Dense p over the vocabulary: softmax(logits / T) restricted by top-k and top-p, renormalised."""
    scaled = logits_row.astype(np.float64) / params.temperature
    keep = _kept_ids(scaled, params)
    probs = np.zeros(scaled.shape[0], dtype=np.float64)
    kept_logits = scaled[keep] if keep is not None else scaled
    weights = np.exp(kept_logits - kept_logits.max())
    if keep is None:
        probs[:] = weights
    else:
        probs[keep] = weights
    return probs / probs.sum()


def _kept_ids(scaled: np.ndarray, params: SamplingParams) -> np.ndarray | None:
    """Ids surviving top-k then top-p (None: the whole vocabulary)."""
    vocab = scaled.shape[0]
    k = params.top_k if 0 < params.top_k < vocab else 0
    if k == 0 and params.top_p >= 1.0:
        return None
    pool = k or min(TOP_P_PARTITION, vocab)
    candidates = np.argpartition(scaled, -pool)[-pool:]
    candidates = candidates[np.argsort(-scaled[candidates], kind="stable")]
    if params.top_p >= 1.0:
        return candidates
    # top-p (nucleus): smallest prefix of the sorted candidates whose mass reaches top_p, where the
    # mass is measured against the full softmax (or the top-k pool when top-k is on).
    log_norm = _logsumexp(scaled) if k == 0 else _logsumexp(scaled[candidates])
    cumulative = np.cumsum(np.exp(scaled[candidates] - log_norm))
    if cumulative[-1] < params.top_p and k == 0:  # the pool was too small: sort everything (rare)
        candidates = np.argsort(-scaled, kind="stable")
        cumulative = np.cumsum(np.exp(scaled[candidates] - log_norm))
    cut = int(np.searchsorted(cumulative, params.top_p)) + 1
    return candidates[: min(cut, candidates.shape[0])]


def _logsumexp(x: np.ndarray) -> float:
    peak = x.max()
    return float(peak + np.log(np.exp(x - peak).sum()))


def draft_dists(logits_rows: np.ndarray, k: int, temperature: float, vocab_limit: int) -> list[SparseDist]:
    """Top-k candidates of each row of a (rows, V) logits block, with full-softmax probabilities.

    ``temperature`` is the draft's softmax temperature (1.0 when the target is greedy, where the
    probabilities only rank and estimate acceptance). Ids ≥ ``vocab_limit`` (tokens the target's
    vocabulary lacks) are never proposed.
    """
    rows = logits_rows[:, :vocab_limit]
    k = min(k, rows.shape[1])
    top_ids = np.argpartition(rows, -k, axis=1)[:, -k:]  # (R, k) unordered
    top_logits = np.take_along_axis(rows, top_ids, axis=1).astype(np.float64) / temperature
    # log Σ_v exp(l_v / T) per row, vectorised over the whole block (the only O(V) work per row).
    peak = rows.max(axis=1, keepdims=True).astype(np.float64) / temperature
    log_norm = peak[:, 0] + np.log(np.exp(rows / temperature - peak).sum(axis=1))
    order = np.argsort(-top_logits, axis=1)
    top_ids = np.take_along_axis(top_ids, order, axis=1).astype(np.int32)
    top_probs = np.exp(np.take_along_axis(top_logits, order, axis=1) - log_norm[:, None])
    return [SparseDist(ids=top_ids[r], probs=top_probs[r]) for r in range(rows.shape[0])]


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw from a dense distribution."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), probs.shape[0] - 1))
