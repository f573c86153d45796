"""The check that each token a step emits is the argmax of its own row of the verify batch, as the engine
handed those rows to the decoder (scripts/gpu/check.py's lossless stage). Random weights leave top-2
logit margins of ~0.1, where comparing with plain decoding alone would pass a wrong row as a near-tie."""

from __future__ import annotations

import time

import numpy as np

from edgespec.decoding.decoder import Request, generate
from edgespec.engine.ports import Joined


class RowKeeper:
    """A pair as the decoder sees it, except that each verify's result is also kept, detached (its rows
    copied before the next decode reuses llama.cpp's buffer), for ``argmax_errors``."""

    def __init__(self, pair):
        self.pair, self.last = pair, None
        self.target = _KeptTarget(pair.target, self)

    def __getattr__(self, name):
        return getattr(self.pair, name)


class _KeptTarget:
    def __init__(self, target, keeper: RowKeeper):
        self.inner, self.keeper = target, keeper

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start_verify(self, tree, root=None):
        def keep(verified):
            self.keeper.last = verified.detach()
            return verified

        return self.inner.start_verify(tree, root).then(keep)


def row_at(verified, node: int) -> np.ndarray | None:
    """Node ``node``'s logits row of a verify result (None: reduced where the rows are not kept)."""
    if isinstance(verified, Joined):
        return row_at(verified.root, 0) if node == 0 else row_at(verified.rest, node - 1)
    rows = getattr(verified, "rows", None)
    return None if rows is None else rows[node]


def argmax_errors(event, verified) -> tuple[int, int]:
    """(rows checked, emitted tokens that are not their row's argmax) for one step: the token emitted
    after accepted node ``path[i]`` is the accepted child's token, or the correction after the last."""
    checked = wrong = 0
    for node, token in zip(event.accepted_path, (t.id for t in event.tokens)):
        row = row_at(verified, node)
        if row is None:
            return 0, 0
        checked += 1
        wrong += int(np.argmax(row)) != token
    return checked, wrong


def run_tokens(pair, planner, prompt: list[int], tokens: int, keeper: RowKeeper | None = None) -> dict:
    """One greedy generation: tokens, margins, tokens/s and (with ``keeper``) the argmax check."""
    checked = wrong = 0
    ids, margins = [], []
    start = time.perf_counter()
    for event in generate(keeper or pair, planner, Request(prompt=prompt, max_tokens=tokens)):
        ids += [t.id for t in event.tokens]
        margins += [t.margin for t in event.tokens]
        if keeper is not None and keeper.last is not None and event.verified_nodes:
            c, w = argmax_errors(event, keeper.last)
            checked, wrong = checked + c, wrong + w
            keeper.last = None
    seconds = time.perf_counter() - start
    return {
        "tokens": ids,
        "margins": margins,
        "tokens_per_second": len(ids) / seconds,
        "rows_checked": checked,
        "not_argmax": wrong,
    }
