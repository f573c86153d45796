"""The target's rows reduced by llama.cpp's backend samplers (``--reductions backend``:
``engine/samplers.py``, ``engine/sampled.py``) against numpy's reductions of the whole rows, on the tiny
random GGUF (quick tier): the same decode gives the same argmax, margin and sampling distribution; whole
generations give the same tokens; and sampling through the emulated samplers passes the χ² harness
(``tests/support/lossless.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams
from edgespec.engine import EngineSettings, ModelPair, probe
from edgespec.engine._context import Context, ContextSettings
from edgespec.engine._model import Model
from edgespec.engine.rows import RowsVerified, draft_dists
from edgespec.engine.sampled import SampledVerified, sampled_dists
from edgespec.engine.samplers import Keep
from edgespec.errors import EngineError
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.planner.strategies import build as make_planner
from tests.support.lossless import history_for, make_pair, planner_for, run
from tests.support.realmodels import chat_prompt

# A tree in 4 sequences (node: token, position, sequence ids): ids up to n_seq_max − 1, 3 outputs in seq 3
TOKENS, POSITIONS = [10, 20, 30, 40, 50, 60], [0, 1, 1, 2, 2, 3]
SEQS = [(0, 1, 2, 3), (0, 1), (2, 3), (1,), (3,), (3,)]
SAMPLINGS = [SamplingParams(0.8, 5, 0.9), SamplingParams(1.2, 40, 1.0), SamplingParams(0.7, 20, 0.5)]


@pytest.fixture(scope="module")
def contexts(tiny_gguf):
    model = Model(tiny_gguf)
    settings = ContextSettings(n_ctx=256, n_batch=64, n_seq_max=4, n_threads=1)
    numpy_ctx = Context(model, settings)
    backend_ctx = Context(model, ContextSettings(**{**settings.__dict__, "reductions": "backend"}))
    yield numpy_ctx, backend_ctx
    backend_ctx.close()
    numpy_ctx.close()
    model.close()


def _decode_both(contexts) -> tuple[RowsVerified, SampledVerified]:
    for ctx in contexts:
        ctx.clear()
        ctx.decode(TOKENS, POSITIONS, SEQS, [True] * len(TOKENS))
    rows, sampled = (ctx.verified(len(TOKENS)) for ctx in contexts)
    assert isinstance(rows, RowsVerified) and isinstance(sampled, SampledVerified)
    return rows, sampled


def test_a_decode_reduces_alike_on_a_numpy_and_a_backend_context(contexts):
    numpy_ctx, backend_ctx = contexts
    assert (numpy_ctx.reductions, backend_ctx.reductions) == ("numpy", "backend")
    backend_ctx.keep(Keep(2))
    rows, sampled = _decode_both(contexts)
    for node in range(len(TOKENS)):
        (best, margin), (backend_best, backend_margin) = rows.top(node), sampled.top(node)
        assert backend_best == best and abs(backend_margin - margin) <= 1e-5
    for sampling in SAMPLINGS:
        backend_ctx.keep(Keep(sampling.top_k))
        rows, sampled = _decode_both(contexts)
        for node in range(len(TOKENS)):
            ranked = np.sort(rows.rows[node])[::-1]
            assert ranked[sampling.top_k - 1] > ranked[sampling.top_k]  # no tie at the k-th logit
            p, backend_p = rows.probs(node, sampling), sampled.probs(node, sampling)
            np.testing.assert_array_equal(np.flatnonzero(backend_p), np.flatnonzero(p))
            np.testing.assert_allclose(backend_p, p, rtol=0, atol=1e-6)
            want, got = rows.candidates(node, sampling, 4, 300), sampled.candidates(node, sampling, 4, 300)
            np.testing.assert_array_equal(got.ids, want.ids)
            np.testing.assert_allclose(got.probs, want.probs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_drafts_top_k_softmax_sampler_gives_numpys_draft_dists(contexts, temperature):
    """``samplers.TopKSoftmax`` (ggml ops built from Python) against ``rows.draft_dists`` of the same
    rows: a vocabulary limit below V and excluded ids ([MASK]s) among the best."""
    numpy_ctx, backend_ctx = contexts
    k, limit = 6, 300
    numpy_ctx.clear()
    numpy_ctx.decode(TOKENS, POSITIONS, SEQS, [True] * len(TOKENS))
    rows = np.array(numpy_ctx.logits_rows(len(TOKENS)))
    exclude = [int(np.argsort(-rows[0, :limit])[1]), int(np.argsort(-rows[3, :limit])[0])]
    backend_ctx.keep(Keep(k + len(exclude), temperature, limit))
    backend_ctx.clear()
    backend_ctx.decode(TOKENS, POSITIONS, SEQS, [True] * len(TOKENS))
    got = sampled_dists(*backend_ctx.sampled_rows(len(TOKENS)), k, exclude)
    want = draft_dists(rows, k, temperature, limit, exclude)
    for node in range(len(TOKENS)):
        ranked = np.sort(rows[node, :limit])[::-1]
        assert ranked[k + len(exclude) - 1] > ranked[k + len(exclude)]  # no tie at the pool's edge
        assert not set(got[node].ids.tolist()) & set(exclude)
        np.testing.assert_array_equal(got[node].ids, want[node].ids)
        np.testing.assert_allclose(got[node].probs, want[node].probs, rtol=0, atol=1e-6)


def test_backend_reductions_refuse_logits_rows_and_switch_chains_cleanly(contexts):
    numpy_ctx, backend_ctx = contexts
    backend_ctx.keep(Keep(2))
    with pytest.raises(EngineError, match="backend samplers"):
        backend_ctx.logits_rows(1)
    backend_ctx.keep(None)  # sampling without top-k: whole rows again
    for ctx in contexts:
        ctx.clear()
        ctx.decode(TOKENS, POSITIONS, SEQS, [True] * len(TOKENS))
    rows, backend_rows = (ctx.verified(len(TOKENS)) for ctx in contexts)
    assert isinstance(rows, RowsVerified) and isinstance(backend_rows, RowsVerified)
    np.testing.assert_allclose(backend_rows.rows, rows.rows, rtol=0, atol=1e-5)
    for k in [2, 3, 7] * 7:  # fresh chains each time, the old ones freed
        backend_ctx.keep(Keep(k))
        backend_ctx.clear()
        backend_ctx.decode(TOKENS, POSITIONS, SEQS, [True] * len(TOKENS))
        assert all(ids.shape == (k,) for ids in backend_ctx.sampled_rows(len(TOKENS))[0])
    with pytest.raises(EngineError, match="cannot switch"):
        numpy_ctx.use_reductions("backend")


@pytest.fixture(scope="module")
def pairs(tiny_gguf, tmp_path_factory):
    probes = tmp_path_factory.mktemp("probes")
    made = []
    for reductions in ("numpy", "backend"):
        settings = EngineSettings(
            n_ctx=256, max_tree_nodes=16, threads=1, probe_dir=probes, reductions=reductions
        )
        made.append(ModelPair(tiny_gguf, tiny_gguf, settings))
    yield made
    for pair in made:
        pair.close()


@pytest.mark.parametrize("strategy", ["chain", "dyspec", "opt-tree", "tsd", "mcsd-target-init"])
def test_greedy_generations_are_the_same_on_both_paths_and_as_plain_decoding(pairs, strategy):
    numpy_pair, backend_pair = pairs
    assert (numpy_pair.reductions, backend_pair.reductions) == ("numpy", "backend")
    for text in ENGINE_PROMPTS[:2]:
        request = Request(chat_prompt(numpy_pair, text), 16)
        plain = [t.id for e in generate(numpy_pair, None, request) for t in e.tokens]
        runs = [
            [t for e in generate(pair, make_planner(strategy, {"budget": 8}), request) for t in e.tokens]
            for pair in pairs
        ]
        assert [t.id for t in runs[0]] == [t.id for t in runs[1]] == plain
        np.testing.assert_allclose([t.margin for t in runs[1]], [t.margin for t in runs[0]], atol=1e-4)


def test_a_seeded_top_k_sampling_draws_the_same_tokens_on_both_paths(pairs):
    sampling = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7)
    request = Request(chat_prompt(pairs[0], ENGINE_PROMPTS[0]), 16, sampling)
    got = [
        [t.id for e in generate(pair, make_planner("chain", {"budget": 4}), request) for t in e.tokens]
        for pair in pairs
    ]
    assert got[0] == got[1]


@pytest.mark.parametrize("name", ["chain", "dyspec", "opt-tree"])
def test_sampling_through_the_backend_samplers_is_lossless(name):
    """The harness with the target's outputs as llama.cpp's top-k sampler returns them (unordered top-k
    ids and logits; the test above checks llama.cpp against that), temperature and top-p in numpy."""
    pair = make_pair()
    result = run(planner_for(name, pair), pair, 4000, seed=1, history=history_for(name), backend=True)
    assert result.max_depth >= 3 and result.passed, (result.p_first, result.p_later)


def test_the_probe_decodes_with_the_backend_samplers_too(tiny_gguf):
    """A context with backend reductions is probed with its samplers' kernels, under a key of its own
    (numpy reductions keep the keys probes were remembered under)."""
    assert probe.child([tiny_gguf, "--reductions", "backend"]) == 0
    key = probe.probe_key(tiny_gguf, True, 0, "build", "cpu")
    assert key == probe.probe_key(tiny_gguf, True, 0, "build", "cpu", "numpy")
    assert key != probe.probe_key(tiny_gguf, True, 0, "build", "cpu", "backend")
