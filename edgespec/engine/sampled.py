"""The models' outputs read from llama.cpp's backend samplers (``samplers.py``) instead of whole logits
rows: ``SampledVerified``, the target's — per node the K best ids and their raw logits, K = 2 under
greedy, the request's top_k when it samples; the rules on top stay numpy (``rows.target_probs`` over
those K) — and ``sampled_dists``, the draft's distributions from its ``TopKSoftmax``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import EngineError
from ..planner.tree import SparseDist
from .ports import Sampling, Verified
from .rows import target_probs


@dataclass(frozen=True)
class _OverTopK:
    """A request's sampling rule applied to its top-k logits alone: top-k is done already."""

    temperature: float
    top_p: float
    top_k: int = 0


class SampledVerified:
    """``ports.Verified`` over a decode's sampled rows. Row i: ``ids[i]`` (int32) and their raw
    ``logits[i]`` (float32), the k best of the node's logits row in any order (ggml's top-k)."""

    def __init__(self, ids: list[np.ndarray], logits: list[np.ndarray], n_vocab: int):
        self.n_vocab = n_vocab
        self.ids, self.logits = [], []
        for row_ids, row_logits in zip(ids, logits):
            # logit descending, ties by id ascending: the order of np.argsort(-row, kind="stable")
            order = np.lexsort((row_ids, -row_logits))
            self.ids.append(row_ids[order])
            self.logits.append(row_logits[order])

    def top(self, node: int) -> tuple[int, float]:
        ids, logits = self.ids[node], self.logits[node]
        margin = float(logits[0]) - float(logits[1]) if logits.shape[0] > 1 else 0.0
        return int(ids[0]), margin

    def probs(self, node: int, sampling: Sampling) -> np.ndarray:
        """Dense p: softmax(logits / T) over the top_k ids, cut by top-p — ``rows.target_probs`` with
        top-k done by the backend (the same ids, ties at the k-th logit aside)."""
        ids, logits = self.ids[node], self.logits[node]
        if not 0 < sampling.top_k <= ids.shape[0]:
            raise EngineError(
                f"the target's backend sampler kept {ids.shape[0]} ids, sampling asks top_k={sampling.top_k} "
                "(edgespec bug: Target.use_sampling was not called for this request)."
            )
        best = slice(0, sampling.top_k)
        dense = np.zeros(self.n_vocab, dtype=np.float64)
        dense[ids[best]] = target_probs(logits[best], _OverTopK(sampling.temperature, sampling.top_p))
        return dense

    def candidates(self, node: int, sampling: Sampling, k: int, vocab_limit: int) -> SparseDist:
        """Under greedy: the best ids the sampler kept (at most its K), p renormalised over them (no
        full softmax here: estimates only, the tokens chosen are the same)."""
        ids, logits = self.ids[node], self.logits[node]
        if sampling.temperature > 0:
            p = self.probs(node, sampling)
            ids = ids[(ids < vocab_limit) & (p[ids] > 0)][:k]
            return SparseDist(ids=ids.astype(np.int32), probs=p[ids])
        allowed = ids < vocab_limit
        ids, logits = ids[allowed][:k], logits[allowed][:k]
        weights = np.exp(logits.astype(np.float64) - (logits[0] if logits.shape[0] else 0.0))
        return SparseDist(ids=ids.astype(np.int32), probs=weights / weights.sum())

    def detach(self) -> Verified:
        return self  # its arrays are copies already


def sampled_dists(
    ids: list[np.ndarray],
    logits: list[np.ndarray],
    probs: list[np.ndarray],
    k: int,
    exclude: Sequence[int] = (),
) -> list[SparseDist]:
    """``rows.draft_dists`` from a ``TopKSoftmax``'s rows (ids below the vocabulary limit, their logits
    and full-softmax probabilities, unordered): the ids in ``exclude`` dropped, ordered by logit
    descending and equal logits by id ascending, cut to ``k``."""
    banned = np.asarray(exclude, dtype=np.int32)
    out = []
    for row_ids, row_logits, row_probs in zip(ids, logits, probs):
        allowed = ~np.isin(row_ids, banned)
        row_ids, row_logits, row_probs = row_ids[allowed], row_logits[allowed], row_probs[allowed]
        best = np.lexsort((row_ids, -row_logits))[:k]
        out.append(SparseDist(ids=row_ids[best], probs=row_probs[best].astype(np.float64)))
    return out
