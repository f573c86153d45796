"""One draft level in one compiled call (``engine/_level.c``, ``Draft.expand`` through
``Context.decode_top_k``) against the Python path it replaces (``Context.decode``, ``logits_rows``, then
``draft_dists``): the same batch, the same rows, the same ids and probabilities bit for bit, the same KV
cells — so whole generations of the planners that grow their trees in Python are identical."""

from __future__ import annotations

from collections import Counter
from functools import partial

import numpy as np
import pytest
from realmodels import chat_prompt

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams, draft_dists
from edgespec.engine import _level
from edgespec.engine.draft import Draft
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.planner.gsd import GSDPlanner
from edgespec.planner.parallel import ParallelSpecPlanner
from edgespec.planner.tree import DraftSetup
from edgespec.planner.tsd import TSDPlanner


def test_bad_arguments_are_errors_not_crashes():
    # ctx, batch, n_batch, n_seq_max, n_vocab, tokens, positions, seq_counts, seq_ids, n_rows, k, temperature,
    # vocab_limit, banned
    args = [1, 1, 512, 4, 100, [5, 6], [0, 1], [1, 2], [0, 1, 2], 1, 8, 1.0, 100, [3, 7]]
    with pytest.raises(RuntimeError, match="closed context"):
        _level.decode_top_k(0, *args[1:])  # a NULL context never reaches llama.cpp
    for at, bad in [
        (5, []),  # no token
        (5, ["5", 6]),  # not an int
        (6, [0]),  # a position short
        (6, [0, -1]),  # a negative position
        (7, [1, 5]),  # more ids than the context has
        (8, [0, 1, 4]),  # an id out of range
        (8, [0, 1, 2, 3]),  # more ids than the counts add up to
        (9, 3),  # more rows than tokens
        (9, 0),  # no row
        (10, 0),  # k = 0
        (11, 0.0),  # no temperature
        (12, 101),  # past the vocabulary
        (13, [7, 3]),  # banned not ascending
        (13, [3, 3]),  # banned not unique
        (2, 1),  # more tokens than n_batch
    ]:
        broken = list(args)
        broken[at] = bad
        with pytest.raises((ValueError, TypeError)):
            _level.decode_top_k(*broken)
    broken = list(args)
    broken[5] = [5, 2**40]
    with pytest.raises(OverflowError, match="int32"):  # a token that does not fit
        _level.decode_top_k(*broken)
    with pytest.raises(ValueError, match="four function addresses"):
        _level.bind(1, 1, 1, 0)


def decode_top_k_in_python(self, tokens, positions, seq_counts, seq_ids, n_rows):
    """The reference: the batch through ``Context.decode``, the rows through ``logits_rows`` and
    ``draft_dists``."""
    ends = np.cumsum(seq_counts)
    ids = [tuple(seq_ids[end - count : end]) for end, count in zip(ends, seq_counts)]
    n = len(tokens)
    self.ctx.decode(tokens, positions, ids, [i >= n - n_rows for i in range(n)])
    rows = self.ctx.logits_rows(n_rows)
    return draft_dists(rows, self.top_k, self.temperature, self.vocab_limit, self.mask_ids)


@pytest.mark.model
@pytest.mark.parametrize(
    "planner, sampling, ban",
    [
        (partial(TSDPlanner, budget=16), SamplingParams(), 0),
        (partial(GSDPlanner, budget=16), SamplingParams(), 0),
        (partial(TSDPlanner, budget=12), SamplingParams(temperature=0.8, seed=3), 0),
        # ids never proposed (ParallelSpec's masks): the five the unbanned run proposed most
        (partial(TSDPlanner, budget=12), SamplingParams(), 5),
        # one pass of the root and four [MASK] tokens (untrained), their five rows, the masks banned
        (partial(ParallelSpecPlanner, k=4, budget=12, adapter="none"), SamplingParams(), 0),
    ],
    ids=["tsd", "gsd", "tsd-sampled", "tsd-banned", "parallelspec"],
)
def test_compiled_levels_equal_the_python_path(pair, planner, sampling, ban):
    prompt = chat_prompt(pair, ENGINE_PROMPTS[0])
    set_up = type(pair).set_up_draft

    def steps(decode_top_k, banned=()):
        """Whole generations with ``decode_top_k`` as ``Draft._decode_top_k``: every step, every level's
        distributions (bytes), the draft's cells."""
        levels = []

        def recording(self, *args):
            dists = decode_top_k(self, *args)
            levels.append([(d.ids.tobytes(), d.probs.tobytes()) for d in dists])
            return dists

        def set_up_with_banned(setup):  # generate() sets the draft up (no masks) first
            spec = set_up(pair, setup)
            pair.draft.mask_ids = pair.draft.mask_ids or tuple(banned)
            return spec

        request = Request(prompt=prompt, max_tokens=32, sampling=sampling)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Draft, "_decode_top_k", recording)
            patch.setattr(pair, "set_up_draft", set_up_with_banned)
            events = generate(pair, planner(), request)
            runs = [
                ([(t.id, t.provenance, t.margin) for t in e.tokens], e.verified_nodes, e.draft_decodes)
                for e in events
            ]
        return runs, levels, pair.draft.ctx.seq_state_bytes(0), pair.draft.committed[:]

    def proposed(levels) -> set[int]:
        return {int(t) for level in levels for ids, _ in level for t in np.frombuffer(ids, "<i4")}

    banned = [t for t, _ in Counter(proposed(steps(Draft._decode_top_k)[1])).most_common(ban)]
    compiled = steps(Draft._decode_top_k, banned)
    in_python = steps(decode_top_k_in_python, banned)
    assert compiled == in_python  # tokens, margins, trees, every level's distributions, the draft's cells
    assert any(len(level) > 1 for level in compiled[1])  # levels of several rows were drafted
    assert not proposed(compiled[1]) & {*banned, *pair.draft.mask_ids}
    pair.set_up_draft(DraftSetup())  # the session's pair goes back to a plain draft
