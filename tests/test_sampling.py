"""The row reductions against the full-vocabulary computation: same ids in the same order (ties by id),
probabilities within 1e-6 — for both implementations, the compiled kernel and numpy (every test runs on
each); and the kernel's loader: missing or stale, numpy with a one-line notice."""

from __future__ import annotations

import timeit

import numpy as np
import pytest
from sampling_reference import argpartition_top_k, full_vocabulary_top_k

from edgespec.engine import rows as row_module
from edgespec.engine.rows import KernelWarning, argmax_margin, draft_dists

QWEN_VOCAB = 151_936


@pytest.fixture(autouse=True, params=["kernel", "numpy"])
def path(request, monkeypatch):
    """Every test of this module on the compiled kernel, then on numpy (EDGESPEC_ROW_KERNEL=numpy)."""
    row_module.kernel.cache_clear()
    if request.param == "numpy":
        monkeypatch.setenv("EDGESPEC_ROW_KERNEL", "numpy")
        assert row_module.kernel() is None
    else:
        monkeypatch.delenv("EDGESPEC_ROW_KERNEL", raising=False)
        assert row_module.kernel() is not None, "the compiled row kernel was not built (pip install -e .)"
    yield request.param
    row_module.kernel.cache_clear()


def assert_same_top_k(rows, k, temperature, vocab_limit):
    dists = draft_dists(rows, k, temperature, vocab_limit)
    ids, probs = full_vocabulary_top_k(rows, k, temperature, vocab_limit)
    assert len(dists) == rows.shape[0]
    for r, dist in enumerate(dists):
        np.testing.assert_array_equal(dist.ids, ids[r])
        np.testing.assert_allclose(dist.probs, probs[r], rtol=0, atol=1e-6)
        assert dist.ids.dtype == np.int32 and dist.probs.dtype == np.float64


def llm_like_rows(rng, n_rows, vocab, spread=2.5, peaks=5):
    """A bulk of N(0, spread²) logits with a few strong candidates per row, as a language model's."""
    rows = rng.normal(0.0, spread, (n_rows, vocab)).astype(np.float32)
    for row in rows:
        row[rng.integers(0, vocab, peaks)] += rng.uniform(5, 20, peaks).astype(np.float32)
    return rows


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("k", [1, 8, 32])
def test_fast_top_k_matches_full_vocabulary(temperature, k):
    rng = np.random.default_rng(k)
    assert_same_top_k(llm_like_rows(rng, 6, QWEN_VOCAB), k, temperature, QWEN_VOCAB)


def test_vocab_limit_drops_padding_ids():
    rng = np.random.default_rng(1)
    rows = llm_like_rows(rng, 3, 5000)
    rows[:, 4990:] = 100.0  # padding ids the target lacks: never proposed
    assert_same_top_k(rows, 16, 1.0, 4990)
    assert all(d.ids.max() < 4990 for d in draft_dists(rows, 16, 1.0, 4990))


def test_ties_go_to_the_lower_id():
    rng = np.random.default_rng(2)
    # Coarse logits: many exact ties, also across the k-th place.
    rows = np.round(rng.normal(0, 2, (5, 20_000)) * 2).astype(np.float32) / 2
    assert_same_top_k(rows, 32, 1.0, 20_000)
    flat = np.zeros((2, 1000), dtype=np.float32)  # everything tied: ids 0..k-1, uniform
    dists = draft_dists(flat, 8, 1.0, 1000)
    np.testing.assert_array_equal(dists[0].ids, np.arange(8))
    np.testing.assert_allclose(dists[0].probs, 1e-3, rtol=1e-6)


@pytest.mark.parametrize("vocab", [3, 31, 48, 1023])
def test_small_and_odd_vocabularies(vocab):
    rng = np.random.default_rng(vocab)
    assert_same_top_k(rng.normal(0, 3, (4, vocab)).astype(np.float32), 32, 1.0, vocab)


def test_extreme_rows():
    rng = np.random.default_rng(3)
    rows = llm_like_rows(rng, 4, QWEN_VOCAB, spread=8.0, peaks=1)
    rows[1] = -1e4  # all very negative, one clear winner
    rows[1, 77] = 40.0
    rows[2] = rng.uniform(-0.01, 0.01, QWEN_VOCAB).astype(np.float32)  # nearly uniform: max entropy
    assert_same_top_k(rows, 32, 1.0, QWEN_VOCAB)
    assert_same_top_k(rows, 32, 0.5, QWEN_VOCAB)


@pytest.mark.parametrize("shift", [-60.0, -49.0, 79.0, 90.0])
def test_rows_near_and_past_the_exact_exp_range(shift):
    """At T = 1 exp(l) is taken unshifted only while the peak is in EXACT_EXP_RANGE (no overflow, no
    loss to underflow); past it the subtracting path takes over. Both agree with float64."""
    rng = np.random.default_rng(5)
    rows = llm_like_rows(rng, 3, QWEN_VOCAB)
    rows += np.float32(shift) - rows.max(axis=1, keepdims=True)  # peak exactly at the shift
    assert_same_top_k(rows, 32, 1.0, QWEN_VOCAB)


def test_argmax_margin_is_first_maximum_and_top_one_minus_top_two():
    rng = np.random.default_rng(4)
    # rounded logits: many rows whose top is shared
    rows = [np.round(rng.normal(0, 2, n)).astype(np.float32) for n in rng.integers(2, 300, 100)]
    rows += [np.array([7.0, 2.0], np.float32), np.array([2.0, 7.0], np.float32), np.ones(3, np.float32)]
    rows += list(llm_like_rows(rng, 3, QWEN_VOCAB))
    tail_top = llm_like_rows(rng, 1, QWEN_VOCAB)[0]
    tail_top[-1] = tail_top.max() + 1  # the maximum in the short last block
    rows.append(tail_top)
    for row in rows:
        top2 = np.sort(row)[-2:]
        assert argmax_margin(row) == (int(np.argmax(row)), float(top2[1] - top2[0]))


def test_row_kernels_refuse_what_they_cannot_read(path):
    if path == "numpy":
        pytest.skip("numpy reads any row it is given")
    with pytest.raises(ValueError, match="float"):
        argmax_margin(np.zeros(10, np.float64))
    with pytest.raises(ValueError, match="empty"):
        argmax_margin(np.zeros(0, np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        draft_dists(np.zeros((8, 100), np.float32)[:, ::2], 4, 1.0, 50)


def test_both_paths_give_the_same_ids(path, monkeypatch):
    """The kernel and numpy on the same rows (banned ids, ties, a vocabulary limit): identical ids and
    argmaxes; probabilities and margins within 1e-6."""
    rng = np.random.default_rng(9)
    rows = np.round(llm_like_rows(rng, 6, QWEN_VOCAB) * 4) / 4  # coarse: ties at the k-th place
    banned = [int(i) for i in np.argsort(-rows[0])[:3]] + [QWEN_VOCAB - 1]
    results = {}
    for which in ("kernel", "numpy"):
        row_module.kernel.cache_clear()
        monkeypatch.setenv("EDGESPEC_ROW_KERNEL", which)
        dists = draft_dists(rows, 32, 0.8, QWEN_VOCAB - 5, banned)
        results[which] = (dists, [argmax_margin(r) for r in rows])
    (dists_c, tops_c), (dists_n, tops_n) = results["kernel"], results["numpy"]
    for a, b in zip(dists_c, dists_n):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_allclose(a.probs, b.probs, rtol=0, atol=1e-6)
    assert [t for t, _ in tops_c] == [t for t, _ in tops_n]
    np.testing.assert_allclose([m for _, m in tops_c], [m for _, m in tops_n], atol=1e-6)


def test_a_missing_or_stale_kernel_gives_numpy_and_one_notice(path, monkeypatch):
    import sys
    import types

    monkeypatch.delenv("EDGESPEC_ROW_KERNEL", raising=False)
    stale = types.ModuleType("edgespec.engine._rows")
    stale.ABI = row_module.KERNEL_ABI - 1  # an extension left by an older install
    monkeypatch.setitem(sys.modules, "edgespec.engine._rows", stale)
    monkeypatch.delattr("edgespec.engine._rows", raising=False)
    row_module.kernel.cache_clear()
    with pytest.warns(KernelWarning, match="stale"):
        assert row_module.kernel() is None
    monkeypatch.setitem(sys.modules, "edgespec.engine._rows", None)  # not built: the import fails
    row_module.kernel.cache_clear()
    with pytest.warns(KernelWarning, match="not installed"):
        assert row_module.kernel() is None
    rows = llm_like_rows(np.random.default_rng(0), 2, 1000)
    assert [d.ids.tolist() for d in draft_dists(rows, 4, 1.0, 1000)] == np.argsort(-rows)[:, :4].tolist()


@pytest.mark.slow
def test_micro_benchmark_per_row(path):
    """Per-row cost on 152k-float rows against the previous argpartition + float64 logsumexp, printed
    (run with -s -m slow); the fast path must be at least twice as fast."""
    if path == "numpy":
        pytest.skip("times the kernel")
    rng = np.random.default_rng(0)
    for n_rows in (1, 16):
        rows = llm_like_rows(rng, n_rows, QWEN_VOCAB)
        fast = _per_row_us(draft_dists, rows)
        before = _per_row_us(argpartition_top_k, rows)
        print(f"\n{n_rows} rows: fast {fast:.0f} µs/row, argpartition + logsumexp {before:.0f} µs/row")
        assert fast < before / 2


def _per_row_us(top_k, rows) -> float:
    seconds = min(timeit.repeat(lambda: top_k(rows, 32, 1.0, QWEN_VOCAB), number=10, repeat=5))
    return seconds / 10 / rows.shape[0] * 1e6
