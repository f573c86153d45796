"""A decode llama.cpp refuses becomes the ``EngineError`` that says so, and the context stays usable: the
caller's ownership is released once (a second release raised ``RuntimeError: release unlocked lock``
over the real message)."""

from __future__ import annotations

import pytest

from edgespec.engine._context import Context, ContextSettings
from edgespec.engine._model import Model
from edgespec.errors import EngineError


def test_a_refused_decode_says_why_and_the_context_goes_on(tiny_gguf):
    model = Model(tiny_gguf)
    ctx = Context(model, ContextSettings(n_ctx=128, n_batch=16, n_seq_max=2, n_threads=1))
    try:
        with pytest.raises(EngineError, match="rejected a batch of 1 tokens"):
            ctx.decode([10], [0], [(5,)], [True])  # sequence id 5 of 2: llama.cpp refuses the batch
        ctx.decode([10, 20], [0, 1], [(0,), (0,)], [False, True])  # the context is the caller's again
        assert ctx.verified(1).top(0)[0] >= 0
    finally:
        ctx.close()
        model.close()
