"""The full-vocabulary draft top-k: one stable sort of the whole row and a float64 softmax over it, what
``engine.rows.draft_dists`` must give (tests compare it against this)."""

from __future__ import annotations

import numpy as np


def full_vocabulary_top_k(logits_rows: np.ndarray, k: int, temperature: float, vocab_limit: int):
    """(ids (R, k), probs (R, k)): ids by logit descending, ties by id ascending; full-softmax probs."""
    rows = logits_rows[:, :vocab_limit]
    k = min(k, rows.shape[1])
    top_ids = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    scaled = rows.astype(np.float64) / temperature
    peak = scaled.max(axis=1, keepdims=True)
    log_norm = peak[:, 0] + np.log(np.exp(scaled - peak).sum(axis=1))  # log Σ_v exp(l_v / T)
    return top_ids.astype(np.int32), np.exp(np.take_along_axis(scaled, top_ids, axis=1) - log_norm[:, None])
