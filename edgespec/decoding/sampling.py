"""Logits to probabilities, for both sides of speculation. Pure numpy.

Target side: one dense distribution p per tree node the verifier visits (only the accepted path).
Draft side: a whole level's rows at once, reduced to their top-K candidates: one strided pass over
the (rows, V) block for the group maxima (each row's max, and a floor under its top K: the top K
are found among the few logits above it, no partition of the whole row), then per row one float32
exp pass for the normaliser.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..planner.tree import SparseDist

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
    """Top-1 minus top-2 logit: how close this decision was to a tie (0 when the top is shared).

    Three linear scans (argmax, then the max on either side of it) instead of a partition of the row.
    """
    best = int(np.argmax(logits_row))
    runner_up = max(logits_row[:best].max(initial=-np.inf), logits_row[best + 1 :].max(initial=-np.inf))
    return float(logits_row[best] - runner_up)


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
    ``np.argsort(-row, kind="stable")`` without the excluded ids, cut to k.
    """
    rows = logits_rows[:, :vocab_limit]  # (R, V) float32, usually a view of llama.cpp's buffer
    banned = np.unique(np.asarray(exclude, dtype=np.int32))
    k = min(k, rows.shape[1])
    pool = min(k + banned.size, rows.shape[1])  # the top k + |exclude| hold the top k allowed ids
    groups = _Groups(rows, pool)
    scratch = np.empty(rows.shape[1], dtype=np.float32)  # one row at a time: stays in cache
    dists = []
    for r, row in enumerate(rows):
        peak = groups.peak[r]  # m
        top_ids = _top_ids(row, groups.survivors(r), pool)
        if banned.size:
            top_ids = top_ids[~np.isin(top_ids, banned)][:k]
        # p_i = exp((l_i − m)/T) / Z, the candidates' own terms in float64.
        scaled = (row[top_ids].astype(np.float64) - peak) / temperature
        probs = np.exp(scaled - _log_normaliser(row, peak, temperature, scratch))
        dists.append(SparseDist(ids=top_ids, probs=probs))
    return dists


GROUPS = 64  # logits per group in the top-k floor: a row of 152k has 2374 group maxima


class _Groups:
    """Group maxima of a (R, V) block: each row's max and a floor under its top k, in one strided pass.

    Split a row into n ≥ k groups (id j < size·n goes to group j mod n; the < n ids past size·n, the
    tail, are checked one by one) and take f = the k-th largest of the n group maxima: those k maxima
    are k distinct logits ≥ f, so the k-th largest logit is ≥ f and every top-k id has l ≥ f. Only the
    groups whose max is ≥ f (usually k to k + 2) and the tail can hold such ids: the survivors are
    found among their ~k·size logits, not by comparing all V.
    """

    def __init__(self, rows: np.ndarray, k: int):
        self.rows = rows
        self.size = max(1, min(GROUPS, rows.shape[1] // k))  # logits per group, so that n ≥ k
        self.n = rows.shape[1] // self.size
        self.body = body = self.size * self.n
        self.group_max = rows[:, :body].reshape(rows.shape[0], self.size, self.n).max(axis=1)  # (R, n)
        self.floor = np.partition(self.group_max, self.n - k, axis=1)[:, self.n - k]  # (R,) f
        tail_max = rows[:, body:].max(axis=1, initial=-np.inf)
        self.peak = np.maximum(self.group_max.max(axis=1), tail_max).astype(np.float64)  # (R,) m
        self.member = np.arange(self.size)[:, None] * self.n  # (size, 1): offsets of a group's ids

    def survivors(self, r: int) -> np.ndarray:
        """Ascending ids of row ``r`` with l ≥ f (a superset of its top k)."""
        row, floor = self.rows[r], self.floor[r]
        ids = (self.member + np.flatnonzero(self.group_max[r] >= floor)).ravel()  # the hit groups
        tail = self.body + np.flatnonzero(row[self.body :] >= floor)
        return np.sort(np.concatenate([ids[row[ids] >= floor], tail]))


def _top_ids(row: np.ndarray, survivors: np.ndarray, k: int) -> np.ndarray:
    """The top k of ``row`` in (logit desc, id asc) order, given ascending ``survivors`` ⊇ the top k."""
    values = row[survivors]
    if survivors.shape[0] > k:
        # Keep every survivor above the k-th largest value, then the lowest ids equal to it.
        kth = np.partition(values, survivors.shape[0] - k)[survivors.shape[0] - k]
        keep = values > kth
        keep[np.flatnonzero(values == kth)[: k - int(keep.sum())]] = True
        survivors, values = survivors[keep], values[keep]
    order = np.lexsort((survivors, -values))  # primary key: −logit; then the id
    return survivors[order].astype(np.int32)


EXACT_EXP_RANGE = (-50.0, 80.0)  # peaks m for which exp(l) is taken as it is (T = 1): see below
FOLDS = 3  # float32 halvings before the float64 sum: each term passes through 3 float32 additions


def _log_normaliser(row: np.ndarray, peak: float, temperature: float, scratch: np.ndarray) -> float:
    """log Z, Z = Σ_v exp((l_v − m) / T), accurate enough that every p_i = exp((l_i − m)/T) / Z is
    within 7e-7 of the float64 softmax, 3.5e-7 at T = 1 (``scratch``: a float32 buffer of the row's
    length, overwritten). The exponentials are taken in float32 (4× cheaper over 152k logits than
    float64) and summed by ``_folded_sum`` (≤ 1.8e-7 relative, below).

    T = 1 and m in EXACT_EXP_RANGE: Z' = Σ exp(l_v) = e^m · Z, one pass and no rounded argument.
    Each term carries only exp's own rounding (≤ 2.5 ulps, 1.5e-7 relative); no term overflows
    (e^80 < 3.4e38, float32's max); a term below float32's smallest normal (l < −87.3) may be flushed
    or denormal, off by < 2^-126 ≈ 1.2e-38 each, against Z' ≥ e^m ≥ e^-50: ≤ V · 6e-17 ≈ 1e-11
    relative in all. So Z is within 1.5e-7 + 1.8e-7 relative, and every p_i within 3.5e-7.

    Otherwise: d = (l − m)/T first. Each term exp(−d) (d ≥ 0) carries the rounding of its argument,
    ≤ 2 float32 ulps of d (relative 1.2e-7 · d), plus ≤ 2.5 ulps from exp itself (numpy's SIMD exp),
    so Z's relative error is ≤ 3.3e-7 + 1.2e-7 · E_p[d], where E_p[d] is the mean of d under the
    softmax p. Since the entropy of p is E_p[d] + log Z ≤ log V and Z ≥ 1, E_p[d] ≤ log V (≈ 12 for
    152k ids): ≤ 1.8e-6 relative at worst, and a candidate's probability p_i moves by p_i times that;
    where E_p[d] is large p_i is small (p_max · E_p[d] ≤ 3 for V = 152k), so every probability stays
    within 3.3e-7 + 3.6e-7 ≈ 7e-7 of the float64 softmax.
    """
    if temperature == 1.0 and EXACT_EXP_RANGE[0] <= peak <= EXACT_EXP_RANGE[1]:
        np.exp(row, out=scratch)  # (V,) float32, exp(l_v)
        return float(np.log(_folded_sum(scratch))) - peak
    np.subtract(row, np.float32(peak), out=scratch)  # (V,) float32, ≤ 0
    if temperature != 1.0:
        scratch *= np.float32(1.0 / temperature)
    np.exp(scratch, out=scratch)
    return float(np.log(_folded_sum(scratch)))


def _folded_sum(terms: np.ndarray) -> float:
    """Σ of positive float32 ``terms`` (overwritten), within 1.8e-7 relative, at about the cost of one
    float32 pass (a float64 sum of all V casts every term: twice as slow).

    FOLDS times, the upper half is added onto the lower half in float32 (an odd last term goes to the
    float64 total as it is): every remaining partial is a balanced sum of 2^FOLDS terms, each term
    through FOLDS roundings, so off by ≤ FOLDS · 2^-24 = 1.8e-7 of its value (all terms > 0: the
    relative errors do not cancel, nor add up beyond that). The V / 8 partials are then summed in
    float64 (relative error ≤ V / 8 · 2^-53 ≈ 2e-12).
    """
    total = 0.0
    for _ in range(FOLDS):
        half = terms.shape[0] // 2
        if terms.shape[0] % 2:
            total += float(terms[-1])
        terms[:half] += terms[half : 2 * half]
        terms = terms[:half]
    return total + float(terms.sum(dtype=np.float64))


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw from a dense distribution."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), probs.shape[0] - 1))
