"""Logits to probabilities, for both sides of speculation.

Target side: one dense distribution p per tree node the verifier visits (only the accepted path), in
numpy; under greedy only each visited row's argmax and margin.
Draft side: a whole level's rows at once, reduced to their top-K candidates with the full softmax's
probabilities (``engine.rows.draft_dists``, run by the draft as it decodes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw from a dense distribution."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), probs.shape[0] - 1))
