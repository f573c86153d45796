"""Group-wise parallel training layout (ParallelSpec §4.1, Fig. 3), as plain numpy arrays.

A training sequence x_0..x_{L-1} is a templated prompt (x_0..x_{P-1}) and the target's answer. The
real tokens run as usual: position i, causal attention, label x_{i+1} (the next token: depth 0).
For each chosen *anchor* t, a parallel group of K mask tokens is appended after the sequence:

    MASK_1 .. MASK_K   at positions t+1 .. t+K,   MASK_k labelled x_{t+k+1} (depth k)

Each mask sees the real prefix x_0..x_t and the earlier masks of its own group, never another
group's masks nor real tokens after t. That is exactly what the runtime computes when it decodes
the last committed token x_t followed by MASK_1..K, so training and inference agree. The paper
writes each group as [x_t, MASK_1..K] interleaved in the sequence; the group's copy of x_t would see
the same prefix at the same position as the real x_t, so its hidden state and its depth-0 loss are
the real token's: appending only the masks computes the same thing with K instead of K+1 extra rows.

Loss (Medusa-style, per depth the mean cross-entropy over the rows that have a label):

    L = CE_0 + sum_{k=1..K} lambda_k CE_k,   lambda_k = decay**k   (decay 0.8 by default)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IGNORE = -100  # label of a row without a target (the prompt; a mask whose target is past the end)
QWEN_MASK_BASE = 151664  # MASK_k = 151664 + k: unused padding ids of the Qwen2.5 vocabulary


def default_mask_ids(k: int = 4, base: int = QWEN_MASK_BASE) -> tuple[int, ...]:
    """MASK_1..MASK_K: ``base + 1 .. base + K`` (Qwen2.5: 151665..151668 for K = 4)."""
    return tuple(base + i for i in range(1, k + 1))


def loss_weights(k: int, decay: float = 0.8) -> np.ndarray:
    """lambda_0..lambda_K: 1 for the next token, ``decay**k`` for MASK_k's token k+1 steps ahead."""
    return decay ** np.arange(k + 1, dtype=np.float64)


@dataclass(frozen=True)
class Layout:
    """One sequence with its parallel groups appended; N = L + G*K rows."""

    input_ids: np.ndarray  # (N,) int64: the real tokens, then each group's MASK_1..K
    position_ids: np.ndarray  # (N,) int64: 0..L-1, then t+1..t+K per group
    allowed: np.ndarray  # (N, N) bool: row i may attend to column j
    labels: np.ndarray  # (N,) int64: the token this row must predict, or IGNORE
    depth: np.ndarray  # (N,) int64: 0 for real rows, k for MASK_k

    def additive_mask(self, dtype_min: float) -> np.ndarray:
        """(1, 1, N, N) float32: 0 where attention is allowed, ``dtype_min`` elsewhere (for sdpa/eager)."""
        return np.where(self.allowed, 0.0, dtype_min).astype(np.float32)[None, None]


def choose_anchors(prompt_len: int, total_len: int, n_groups: int, rng: np.random.Generator) -> np.ndarray:
    """Up to ``n_groups`` distinct anchors t, sorted, whose next token x_{t+1} is an answer token.

    Anchors run over P-1 .. L-2 (the last prompt token predicts the first answer token). Masks whose
    own target falls past the end are kept with an IGNORE label (the model still sees them).
    """
    candidates = np.arange(max(prompt_len - 1, 0), total_len - 1)
    if len(candidates) <= n_groups:
        return candidates
    return np.sort(rng.choice(candidates, size=n_groups, replace=False))


def build_layout(
    tokens: Sequence[int], prompt_len: int, anchors: Sequence[int], mask_ids: Sequence[int]
) -> Layout:
    """The rows, positions, attention and labels for ``tokens`` with one group per anchor."""
    x = np.asarray(tokens, dtype=np.int64)
    n_real, k, g = len(x), len(mask_ids), len(anchors)
    n = n_real + g * k
    ids = np.empty(n, dtype=np.int64)
    pos = np.empty(n, dtype=np.int64)
    labels = np.full(n, IGNORE, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    allowed = np.zeros((n, n), dtype=bool)

    # real rows: causal over the real tokens; row i predicts x_{i+1} when that is an answer token
    ids[:n_real], pos[:n_real] = x, np.arange(n_real)
    allowed[:n_real, :n_real] = np.tril(np.ones((n_real, n_real), dtype=bool))
    nxt = np.arange(n_real - 1)
    answer = nxt + 1 >= prompt_len
    labels[nxt[answer]] = x[nxt[answer] + 1]

    for gi, t in enumerate(anchors):
        start = n_real + gi * k  # rows of this group
        for j in range(k):  # MASK_{j+1}
            row = start + j
            ids[row], pos[row], depth[row] = mask_ids[j], t + 1 + j, j + 1
            target = t + j + 2  # MASK_k predicts x_{t+k+1}
            if target < n_real:
                labels[row] = x[target]
            allowed[row, : t + 1] = True  # the real prefix x_0..x_t
            allowed[row, start : row + 1] = True  # MASK_1..MASK_k of its own group
    return Layout(ids, pos, allowed, labels, depth)
