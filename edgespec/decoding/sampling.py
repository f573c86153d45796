"""Logits to probabilities, for both sides of speculation.

Target side: one dense distribution p per tree node the verifier visits (only the accepted path), in
numpy; under greedy only each visited row's argmax and margin.
Draft side: a whole level's rows at once, reduced to their top-K candidates with the full softmax's
probabilities. The row reductions run in ``_rows.c``: one read of a row gives its block maxima (the
max, and a floor under the top K: the top K are found among the few logits above it) and, at T = 1,
the normaliser, with a vectorised float32 exp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..planner.tree import SparseDist
from . import _rows

_NO_IDS = np.zeros(0, dtype=np.int32)
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


def argmax_margin(logits_row: np.ndarray) -> tuple[int, float]:
    """The target's greedy token (the first maximum, as ``np.argmax``) and top-1 minus top-2 logit: how
    close that decision was to a tie (0 when the top is shared). One compiled pass over the row."""
    return _rows.argmax_margin(logits_row)


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


def draft_dists(
    logits_rows: np.ndarray, k: int, temperature: float, vocab_limit: int, exclude: Sequence[int] = ()
) -> list[SparseDist]:
    """Top-k candidates of each row of a (rows, V) logits block, with full-softmax probabilities.

    ``temperature`` is the draft's softmax temperature (1.0 when the target is greedy, where the
    probabilities only rank and estimate acceptance). Ids ≥ ``vocab_limit`` (tokens the target's
    vocabulary lacks) and ids in ``exclude`` (ParallelSpec's [MASK] tokens) are never proposed.
    Candidates are ordered by logit, descending; equal logits by id, ascending — exactly
    ``np.argsort(-row, kind="stable")`` without the excluded ids, cut to k. Probabilities are within
    7e-7 of the float64 softmax, 3e-7 at T = 1 (the bound is in ``_row_kernels.h``).
    """
    rows = logits_rows[:, :vocab_limit]  # (R, V) float32, usually a view of llama.cpp's buffer
    banned = np.unique(np.asarray(exclude, dtype=np.int32)) if len(exclude) else _NO_IDS
    k = min(k, rows.shape[1])
    ids = np.empty((rows.shape[0], k), dtype=np.int32)
    probs = np.empty((rows.shape[0], k), dtype=np.float64)
    found = _rows.top_k(rows, k, temperature, banned, ids, probs)  # k unless exclude leaves fewer ids
    return [SparseDist(ids=ids[r, :found], probs=probs[r, :found]) for r in range(rows.shape[0])]


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw from a dense distribution."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), probs.shape[0] - 1))
