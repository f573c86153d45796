"""DySpec's greedy tree drafted in one compiled call (``engine/_dyspec.c``) against the level-by-level
reference (``dyspec_by_levels`` through ``Draft.expand``): the same nodes, probabilities, distributions,
decodes and KV cells, so whole generations are identical event by event."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from realmodels import chat_prompt, compiled_and_by_levels

from edgespec.engine import _dyspec
from edgespec.engine.draft import Draft
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.planner.dyspec import DySpecPlanner, dyspec_by_levels
from edgespec.planner.tree import TreeBuilder


def test_bad_arguments_are_errors_not_crashes():
    # ctx, memory, batch, n_batch, n_seq_max, first_tokens, first_position, n_tagged, budget, max_passes,
    # k, temperature, vocab_limit, banned
    args = [1, 1, 1, 512, 65, [1], 0, 1, 16, 0, 8, 1.0, 100, []]
    with pytest.raises(RuntimeError, match="closed context"):
        _dyspec.greedy_tree(0, *args[1:])  # a NULL context never reaches llama.cpp
    for at, bad in [(8, 0), (8, 512), (9, -1), (10, 0), (10, 101), (11, 0.0), (7, 0), (7, 66), (5, [])]:
        broken = list(args)
        broken[at] = bad
        with pytest.raises(ValueError):
            _dyspec.greedy_tree(*broken)
    with pytest.raises(OverflowError):
        _dyspec.greedy_tree(*args[:13], [2**40])
    with pytest.raises(ValueError, match="four function addresses"):
        _dyspec.bind(1, 1, 1, 0)


def _by_levels(draft, tree, budget, max_passes=0):
    return dyspec_by_levels(draft, tree, budget, max_passes)


@pytest.mark.model
@pytest.mark.parametrize("budget, max_passes", [(16, 0), (24, 3)])
def test_compiled_dyspec_equals_drafting_level_by_level(pair, budget, max_passes):
    prompt = chat_prompt(pair, ENGINE_PROMPTS[1])
    make = partial(DySpecPlanner, budget=budget, max_passes=max_passes)
    compiled = compiled_and_by_levels(pair, make, prompt, "greedy_dyspec", _by_levels)
    assert any(decodes > 2 for _, _, decodes, _, _ in compiled)  # trees of several levels were drafted
    if max_passes:
        assert max(decodes for _, _, decodes, _, _ in compiled) == max_passes


@pytest.mark.model
def test_one_tree_has_the_levels_nodes_distributions_and_cache(pair):
    prompt = chat_prompt(pair, ENGINE_PROMPTS[0])
    trees, dists, states = [], [], []
    for grow in (Draft.greedy_dyspec, _by_levels):
        draft = pair.draft
        draft.sync(prompt)
        draft.begin_step(0.0)
        tree = TreeBuilder(prompt[-1])
        decodes, evaluated = grow(draft, tree, 20)
        assert tree.size == 21 and decodes > 2 and evaluated >= decodes
        trees.append((decodes, evaluated, tree.tokens, tree.parents, tree.draft_prob, tree.child_rule))
        dists.append({node: (d.ids.tolist(), d.probs.tolist()) for node, d in tree.dists.items()})
        cells = [draft.ctx.seq_pos_max(seq) for seq in range(draft.n_seq)]
        book = (draft._node_seq, draft._path_seq, draft._seq_taken, draft._used_seqs, draft.tagged_seqs)
        states.append((cells, [dict(b) if isinstance(b, dict) else b for b in book], draft.committed[:]))
    assert trees[0] == trees[1]
    assert dists[0] == dists[1] and len(dists[0]) == trees[0][1]  # every evaluated node's top-k, exactly
    assert states[0] == states[1]  # the same cells per sequence and the same bookkeeping for commit
    assert np.unique(trees[0][3][1:]).size > 1  # a tree, not a chain
