"""The logits-row reductions both models need, right after each decode: the draft's top-K candidates
with their full-softmax probabilities (``draft_dists``); the target's argmax with its top-1 − top-2
margin (``argmax_margin``), its sampling distribution (``target_probs``) and best candidates, read
through ``RowsVerified`` (the ``ports.Verified`` of a decode's rows). numpy, a few passes over each row
and none that sorts it but top-p's.

A compiled kernel did these until it was measured: on the bundled pair at 1 thread (Xeon, AVX-512)
``generate --strategy dyspec|opt-tree --budget 16`` ran 0.4 % and 1.2 % faster with it than with the
numpy it replaced, under the 5 % a second implementation must buy (docs/development.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..planner.tree import SparseDist
from .ports import Sampling, Verified

_NO_IDS = np.zeros(0, dtype=np.int32)
BLOCK = 256  # logits per block when bounding the top K from below by block maxima
TOP_P_PARTITION = 2048  # top-p is resolved among this many best logits when their mass suffices


class RowsVerified:
    """``ports.Verified`` over a decode's logits rows (one per node), each reduced when first asked:
    the greedy walk reads the argmax of the accepted path's rows only."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows  # (nodes, V) float32: often a view of llama.cpp's buffer (until its next decode)
        self._tops: dict[int, tuple[int, float]] = {}

    def top(self, node: int) -> tuple[int, float]:
        if node not in self._tops:
            self._tops[node] = argmax_margin(self.rows[node])
        return self._tops[node]

    def probs(self, node: int, sampling: Sampling) -> np.ndarray:
        return target_probs(self.rows[node], sampling)

    def candidates(self, node: int, sampling: Sampling, k: int, vocab_limit: int) -> SparseDist:
        if sampling.temperature <= 0:  # greedy: ranked by logit
            return draft_dists(self.rows[node : node + 1], k, 1.0, vocab_limit)[0]
        p = target_probs(self.rows[node], sampling)[:vocab_limit]
        k = min(k, int(np.count_nonzero(p)))
        best = np.argpartition(-p, k - 1)[:k]
        best = best[np.argsort(-p[best], kind="stable")]  # most likely first
        return SparseDist(ids=best.astype(np.int32), probs=p[best])

    def detach(self) -> Verified:
        return RowsVerified(np.array(self.rows))


def argmax_margin(logits_row: np.ndarray) -> tuple[int, float]:
    """The target's greedy token (the first maximum, as ``np.argmax``) and top-1 minus top-2 logit: how
    close that decision was to a tie (0 when the top is shared)."""
    best = int(np.argmax(logits_row))
    if logits_row.shape[0] < 2:
        return best, 0.0
    # the largest logit at any other id: equal to the best one when the top is shared
    second = max(logits_row[:best].max(initial=-np.inf), logits_row[best + 1 :].max(initial=-np.inf))
    return best, float(logits_row[best]) - float(second)


def draft_dists(
    logits_rows: np.ndarray, k: int, temperature: float, vocab_limit: int, exclude: Sequence[int] = ()
) -> list[SparseDist]:
    """Top-k candidates of each row of a (rows, V) logits block, with full-softmax probabilities.

    ``temperature`` is the draft's softmax temperature (1.0 when the target is greedy, where the
    probabilities only rank and estimate acceptance). Ids ≥ ``vocab_limit`` (tokens the target's
    vocabulary lacks) and ids in ``exclude`` (ParallelSpec's [MASK] tokens) are never proposed.
    Candidates are ordered by logit, descending; equal logits by id, ascending — exactly
    ``np.argsort(-row, kind="stable")`` without the excluded ids, cut to k. Probabilities are
    p_i = exp((l_i − m)/T) / Σ_v exp((l_v − m)/T), m the row's maximum, with the sum's terms in float32
    (each within 1 ulp) added in float64: within 1e-6 of the float64 softmax.
    """
    rows = logits_rows[:, :vocab_limit]  # (R, V) float32, usually a view of llama.cpp's buffer
    n_rows, vocab = rows.shape
    banned = np.unique(np.asarray(exclude, dtype=np.int32)) if len(exclude) else _NO_IDS
    found = min(k, vocab - int(np.count_nonzero(banned < vocab)))  # k unless exclude leaves fewer
    if n_rows == 0 or found <= 0:
        return [SparseDist(ids=_NO_IDS, probs=np.zeros(0)) for _ in range(n_rows)]
    pool = min(found + banned.shape[0], vocab)  # the top `pool` logits hold the top `found` allowed ids
    # Block maxima: the row's maximum m, and a floor under its top `pool` — the pool-th largest block
    # maximum (each of the pool best blocks holds a logit at least that large). Only blocks whose
    # maximum reaches the floor can hold a top id: about `pool` of them, read again below.
    whole = vocab - vocab % BLOCK
    block_max = rows[:, :whole].reshape(n_rows, -1, BLOCK).max(axis=2)
    if whole < vocab:
        block_max = np.concatenate([block_max, rows[:, whole:].max(axis=1, keepdims=True)], axis=1)
    peak = block_max.max(axis=1)
    if pool <= block_max.shape[1]:
        floor = np.partition(block_max, -pool, axis=1)[:, -pool]
    else:  # fewer blocks than ids wanted: every id is a candidate
        floor = rows.min(axis=1)
    # Σ_v exp((l_v − m)/T): float32 terms, a float64 sum
    shifted = np.subtract(rows, peak[:, None], dtype=np.float32)
    if temperature != 1.0:
        shifted *= np.float32(1.0 / temperature)
    norm = np.exp(shifted, out=shifted).sum(axis=1, dtype=np.float64)
    block_row, block = np.nonzero(block_max >= floor[:, None])
    ids = (block[:, None] * BLOCK + np.arange(BLOCK)).ravel()  # every id of those blocks
    row_of = np.repeat(block_row, BLOCK)
    inside = ids < vocab  # the last block may be short
    row_of, ids = row_of[inside], ids[inside]
    keep = rows[row_of, ids] >= floor[row_of]  # every id reaching the floor, ties included
    row_of, ids = row_of[keep], ids[keep]
    if banned.shape[0]:
        allowed = ~np.isin(ids, banned)
        row_of, ids = row_of[allowed], ids[allowed]
    logits = rows[row_of, ids]
    order = np.lexsort((ids, -logits, row_of))  # by row, then logit descending, then id ascending
    row_of, ids, logits = row_of[order], ids[order], logits[order]
    starts = np.searchsorted(row_of, np.arange(n_rows))
    out = []
    for r in range(n_rows):
        top = slice(starts[r], starts[r] + found)
        scaled = (logits[top].astype(np.float64) - float(peak[r])) / temperature
        out.append(SparseDist(ids=ids[top].astype(np.int32), probs=np.exp(scaled) / norm[r]))
    return out


def target_probs(logits_row: np.ndarray, sampling: Sampling) -> np.ndarray:
    """Dense p over the vocabulary: softmax(logits / T) restricted by top-k and top-p, renormalised."""
    scaled = logits_row.astype(np.float64) / sampling.temperature
    keep = _kept_ids(scaled, sampling)
    probs = np.zeros(scaled.shape[0], dtype=np.float64)
    kept_logits = scaled[keep] if keep is not None else scaled
    weights = np.exp(kept_logits - kept_logits.max())
    if keep is None:
        probs[:] = weights
    else:
        probs[keep] = weights
    return probs / probs.sum()


def _kept_ids(scaled: np.ndarray, sampling: Sampling) -> np.ndarray | None:
    """Ids surviving top-k then top-p (None: the whole vocabulary)."""
    vocab = scaled.shape[0]
    k = sampling.top_k if 0 < sampling.top_k < vocab else 0
    if k == 0 and sampling.top_p >= 1.0:
        return None
    pool = k or min(TOP_P_PARTITION, vocab)
    candidates = np.argpartition(scaled, -pool)[-pool:]
    candidates = candidates[np.argsort(-scaled[candidates], kind="stable")]
    if sampling.top_p >= 1.0:
        return candidates
    # top-p (nucleus): smallest prefix of the sorted candidates whose mass reaches top_p, where the
    # mass is measured against the full softmax (or the top-k pool when top-k is on).
    log_norm = _logsumexp(scaled) if k == 0 else _logsumexp(scaled[candidates])
    cumulative = np.cumsum(np.exp(scaled[candidates] - log_norm))
    if cumulative[-1] < sampling.top_p and k == 0:  # the pool was too small: sort everything (rare)
        candidates = np.argsort(-scaled, kind="stable")
        cumulative = np.cumsum(np.exp(scaled[candidates] - log_norm))
    cut = int(np.searchsorted(cumulative, sampling.top_p)) + 1
    return candidates[: min(cut, candidates.shape[0])]


def _logsumexp(x: np.ndarray) -> float:
    peak = x.max()
    return float(peak + np.log(np.exp(x - peak).sum()))
