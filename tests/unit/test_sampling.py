"""The row reductions against the full-vocabulary computation: same ids in the same order (ties by id),
probabilities within 1e-6."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.engine.rows import argmax_margin, draft_dists
from tests.support.sampling_reference import full_vocabulary_top_k

QWEN_VOCAB = 151_936


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
    """Peaks far from 0, where exp(l) unshifted would overflow or lose the mass to underflow in float32:
    the shift by the row's maximum keeps them exact."""
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


def test_banned_ids_are_skipped_the_next_ones_take_their_place():
    """ParallelSpec's [MASK] ids (and ids past the vocabulary limit) are never proposed: the list is the
    top k of the other ids, ties by id; the probabilities stay those of the full softmax."""
    rng = np.random.default_rng(9)
    rows = np.round(llm_like_rows(rng, 6, QWEN_VOCAB) * 4) / 4  # coarse: ties at the k-th place
    banned = [int(i) for i in np.argsort(-rows[0])[:3]] + [QWEN_VOCAB - 1]
    limit = QWEN_VOCAB - 5
    scaled = rows[:, :limit].astype(np.float64) / 0.8
    softmax = np.exp(scaled - scaled.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    ranked = np.argsort(-rows[:, :limit], axis=1, kind="stable")
    for r, dist in enumerate(draft_dists(rows, 32, 0.8, limit, banned)):
        expected = [i for i in ranked[r] if i not in banned][:32]
        np.testing.assert_array_equal(dist.ids, expected)
        np.testing.assert_allclose(dist.probs, softmax[r, expected], rtol=0, atol=1e-6)


def test_fewer_allowed_ids_than_k():
    rows = np.arange(6, dtype=np.float32)[None, :]
    dist = draft_dists(rows, 8, 1.0, 5, exclude=[0, 4])[0]
    assert dist.ids.tolist() == [3, 2, 1]
