"""The logits-row reductions both models need, right after each decode: the draft's top-K candidates
with their full-softmax probabilities (``draft_dists``), the target's argmax with its top-1 − top-2
margin (``argmax_margin``).

Each has two implementations of one definition: the optional compiled kernel (``_rows.c`` over
``_row_kernels.h``: one read of a row gives its block maxima — the max, and a floor under the top K —
and, at T = 1, the normaliser, with a vectorised float32 exp), and numpy, used where the kernel was not
built (no C compiler at install), is stale (another ``ABI``), or ``EDGESPEC_ROW_KERNEL=numpy`` asks for
it. The same ids in the same order either way; probabilities agree within 1e-6 (tests/test_sampling.py).
The kernel touches no llama.cpp structure: it reads float32 rows through the buffer protocol.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from functools import cache

import numpy as np

from ..planner.tree import SparseDist

_NO_IDS = np.zeros(0, dtype=np.int32)
KERNEL_ABI = 2  # the calling convention of _rows.c this module speaks (its ``ABI`` constant)


class KernelWarning(UserWarning):
    """The compiled row kernel is missing or stale: numpy computes the rows instead (printed once)."""


@cache
def kernel():
    """The compiled row kernel, or None for the numpy path (with a one-line notice why, once)."""
    if os.environ.get("EDGESPEC_ROW_KERNEL", "").lower() == "numpy":
        return None
    try:
        from . import _rows
    except ImportError:
        warnings.warn(
            "the compiled row kernel is not installed (no C compiler when edgespec was installed): rows are "
            "reduced in numpy, drafting trees is a little slower. Reinstall with a C compiler to build it.",
            KernelWarning, stacklevel=2,
        )  # fmt: skip
        return None
    if getattr(_rows, "ABI", None) != KERNEL_ABI:
        warnings.warn(
            f"the compiled row kernel is stale (ABI {getattr(_rows, 'ABI', None)}, this edgespec speaks "
            f"{KERNEL_ABI}): using numpy instead. Reinstall edgespec (pip install -e .) to rebuild it.",
            KernelWarning, stacklevel=2,
        )  # fmt: skip
        return None
    return _rows


def argmax_margin(logits_row: np.ndarray) -> tuple[int, float]:
    """The target's greedy token (the first maximum, as ``np.argmax``) and top-1 minus top-2 logit: how
    close that decision was to a tie (0 when the top is shared)."""
    rows = kernel()
    if rows is not None:
        return rows.argmax_margin(logits_row)
    best = int(np.argmax(logits_row))
    if logits_row.shape[0] < 2:
        return best, 0.0
    second = np.partition(logits_row, -2)[-2]  # the second largest (equal to the first on a shared top)
    return best, float(logits_row[best]) - float(second)


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
    compiled = kernel()
    if compiled is not None:
        found = compiled.top_k(rows, k, temperature, banned, ids, probs)  # k unless exclude leaves fewer
    else:
        found = min(k, rows.shape[1] - int(np.count_nonzero(banned < rows.shape[1])))
        for r, row in enumerate(rows):
            ids[r, :found], probs[r, :found] = _top_k_numpy(row, found, temperature, banned)
    return [SparseDist(ids=ids[r, :found], probs=probs[r, :found]) for r in range(rows.shape[0])]


def _top_k_numpy(row: np.ndarray, k: int, temperature: float, banned: np.ndarray):
    """``draft_dists`` of one row in numpy: the ids of the k largest logits not banned (ties by id), and
    their full-softmax probabilities p_i = exp((l_i − m)/T) / Σ_v exp((l_v − m)/T), in float64."""
    if k == 0:
        return _NO_IDS, np.zeros(0)
    # Every id whose logit reaches the (k + banned)-th largest: the top k allowed ids are among them,
    # ties at the edge included; then sort those few by (−logit, id).
    pool = min(k + banned.shape[0], row.shape[0])
    floor = np.partition(row, -pool)[-pool]
    candidates = np.flatnonzero(row >= floor)
    candidates = candidates[~np.isin(candidates, banned)]
    top = candidates[np.lexsort((candidates, -row[candidates]))][:k]
    scaled = row.astype(np.float64) / temperature
    peak = scaled.max()
    log_norm = peak + np.log(np.exp(scaled - peak).sum())  # log Σ_v exp(l_v / T)
    return top.astype(np.int32), np.exp(scaled[top] - log_norm)
