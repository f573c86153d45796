"""The fast draft top-k on real draft rows (the bundled 0.5B draft's logits, 151,936 ids): same ids and
order as the full-vocabulary computation, probabilities within 1e-6."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.measure.prompts import ENGINE_PROMPTS
from tests.support.realmodels import chat_prompt
from tests.unit.test_sampling import assert_same_top_k

pytestmark = pytest.mark.model


def test_fast_top_k_on_real_draft_rows(pair):
    draft = pair.draft
    prompt = chat_prompt(pair, ENGINE_PROMPTS[0])
    draft.sync(prompt)  # holds the prompt but its last token, which is pending
    first = draft.decode_committed(draft.pending, want_last=True).copy()
    draft.pending = []
    # A level of 8 rows in one batch: the 8 most likely continuations of the prompt, side by side.
    children = np.argsort(-first, kind="stable")[:8]
    base = len(draft.committed)
    draft.ctx.decode(children, [base] * 8, [(s,) for s in range(8)], [True] * 8)
    rows = np.vstack([first[None, :], draft.ctx.logits_rows(8)])
    draft.ctx.seq_rm(-1, base)  # leave the cache holding the committed prompt only
    for temperature in (1.0, 0.7):
        assert_same_top_k(rows, draft.top_k, temperature, draft.vocab_limit)
