"""The full-vocabulary draft top-k: one stable sort of the whole row and a float64 softmax over it —
what ``sampling.draft_dists`` computed before its fast path, except that the old code divided the
float32 logits by T in float32 (an error up to 1.4e-6 in the probabilities at T = 0.7; none at
T = 1, the draft's temperature whenever the target is greedy). Tests compare the fast path against
it; the micro-benchmark (tests/test_sampling.py, ``slow``) times both."""

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


def argpartition_top_k(logits_rows: np.ndarray, k: int, temperature: float, vocab_limit: int):
    """The previous ``draft_dists`` body, kept to time the fast path against: one ``argpartition`` and
    one float64 ``logsumexp`` over the whole (R, V) block (its ties went where argpartition put them)."""
    rows = logits_rows[:, :vocab_limit]
    k = min(k, rows.shape[1])
    top_ids = np.argpartition(rows, -k, axis=1)[:, -k:]
    top_logits = np.take_along_axis(rows, top_ids, axis=1).astype(np.float64) / temperature
    peak = rows.max(axis=1, keepdims=True).astype(np.float64) / temperature
    log_norm = peak[:, 0] + np.log(np.exp(rows / temperature - peak).sum(axis=1))
    order = np.argsort(-top_logits, axis=1)
    top_ids = np.take_along_axis(top_ids, order, axis=1).astype(np.int32)
    return top_ids, np.exp(np.take_along_axis(top_logits, order, axis=1) - log_norm[:, None])
