"""The draft's greedy chain in one compiled call (``engine/_chain.c``) against the level-by-level
reference (``greedy_chain_by_levels`` through ``Draft.expand``): the same tokens, probabilities, decodes
and KV cells, so whole generations are identical event by event."""

from __future__ import annotations

import ctypes
from functools import partial

import llama_cpp
import pytest
from realmodels import chat_prompt, compiled_and_by_levels

from edgespec.engine import _chain
from edgespec.engine.draft import Draft
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.planner.chain import ChainPlanner
from edgespec.planner.tree import TreeBuilder, greedy_chain_by_levels


def test_the_c_batch_layout_is_the_pinned_bindings():
    """_chain.c declares struct llama_batch itself: it must be llama-cpp-python's, field by field."""
    fields = [name for name, _ in llama_cpp.llama_batch._fields_]
    assert fields == ["n_tokens", "token", "embd", "pos", "n_seq_id", "seq_id", "logits"]
    offsets = [getattr(llama_cpp.llama_batch, name).offset for name in fields]
    assert offsets == [0, 8, 16, 24, 32, 40, 48] and ctypes.sizeof(llama_cpp.llama_batch) == 56


def test_bad_arguments_are_errors_not_crashes():
    args = [1, 1, 512, 4, [1], 0, [0], 0, 4, 0.0, 1.0, 100, []]
    with pytest.raises(RuntimeError, match="closed context"):
        _chain.greedy_chain(0, *args[1:])  # a NULL context never reaches llama.cpp
    for at, bad in [(8, 0), (10, 0.0), (7, 4), (4, [])]:  # length, temperature, chain_seq, no first token
        broken = list(args)
        broken[at] = bad
        with pytest.raises(ValueError):
            _chain.greedy_chain(*broken)
    with pytest.raises(OverflowError):
        _chain.greedy_chain(*args[:4], [2**40], *args[5:])


@pytest.mark.model
@pytest.mark.parametrize("gamma, p_min", [(4, 0.0), (6, 0.6)])
def test_compiled_chain_equals_drafting_level_by_level(pair, gamma, p_min):
    prompt = chat_prompt(pair, ENGINE_PROMPTS[1])
    make = partial(ChainPlanner, gamma=gamma, p_min=p_min)
    compiled = compiled_and_by_levels(pair, make, prompt, "greedy_chain", greedy_chain_by_levels)
    assert any(decodes > 1 for _, _, decodes, _, _ in compiled)  # chains were drafted, not just roots
    if p_min:
        assert any(decodes < gamma for _, _, decodes, _, _ in compiled)  # and some stopped early


@pytest.mark.model
def test_one_chain_has_the_levels_tokens_probabilities_and_cache(pair):
    prompt = chat_prompt(pair, ENGINE_PROMPTS[0])
    trees, cells = [], []
    for draft_chain in (Draft.greedy_chain, greedy_chain_by_levels):
        draft = pair.draft
        draft.sync(prompt)
        draft.begin_step(0.0)
        tree = TreeBuilder(prompt[-1])
        assert draft_chain(draft, tree, 5) == 5  # the root and 4 drafted tokens decoded
        trees.append((tree.tokens, tree.parents, tree.draft_prob, tree.child_rule))
        cells.append([draft.ctx.seq_pos_max(seq) for seq in range(2)])
    assert trees[0] == trees[1]
    assert cells[0] == cells[1]
