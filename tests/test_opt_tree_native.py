"""OPT-Tree's levels drafted in one compiled call (``engine/_opt_tree.c``) against the level-by-level
reference (``opt_tree_by_levels`` through ``Draft.expand``): the same nodes, probabilities, distributions,
decodes and KV cells, so whole generations are identical event by event — greedy and sampling (the
compiled call serves both: OPT-Tree's children are the draft's top tokens either way)."""

from __future__ import annotations

import numpy as np
import pytest
from realmodels import chat_prompt, compiled_and_by_levels

from edgespec.decoding.sampling import SamplingParams
from edgespec.engine import _opt_tree
from edgespec.engine.draft import Draft
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.planner.costmodel import CostModel
from edgespec.planner.opt_tree import OptTreeLevels, OptTreePlanner, opt_tree_by_levels
from edgespec.planner.tree import TreeBuilder

# A CPU's shape (the bundled pair on 1 thread, in target decodes): a draft row costs a third of a target
# decode, so layers="paying" leaves unlikely rows undrafted and the δ rule stops trees.
CPU = CostModel.from_functions(lambda n: 1.0 + 0.05 * n, lambda m: 0.33 * m)


def test_bad_arguments_are_errors_not_crashes():
    # ctx, memory, batch, n_batch, n_seq_max, first_tokens, first_position, n_tagged, n, capacity,
    # max_depth, threshold, level_cost, level_seconds, overhead, verify_seconds, k, temperature, vocab_limit,
    # banned
    args = [1, 1, 1, 512, 65, [1], 0, 1, 4, 8, 3, [0.1] * 5, [], [], 0.0, [], 8, 1.0, 100, []]
    with pytest.raises(RuntimeError, match="closed context"):
        _opt_tree.opt_tree(0, *args[1:])  # a NULL context never reaches llama.cpp
    with pytest.raises(RuntimeError, match="closed context"):  # sizing: both curves, n + 1 floats each
        _opt_tree.opt_tree(0, *args[1:13], [0.1] * 5, 0.0, [0.2] * 5, *args[16:])
    for at, bad in [
        (8, 0), (8, 512), (9, 3), (10, 0), (11, [0.1] * 4), (12, [0.0] * 3), (13, [0.1] * 5), (15, [0.1] * 5),
        (13, [0.1] * 4), (16, 0), (16, 101), (17, 0.0), (7, 0), (7, 66), (5, []),
    ]:  # fmt: skip
        broken = list(args)
        broken[at] = bad
        with pytest.raises(ValueError):
            _opt_tree.opt_tree(*broken)
    with pytest.raises(OverflowError):
        _opt_tree.opt_tree(*args[:19], [2**40])
    with pytest.raises(TypeError):
        _opt_tree.opt_tree(*args[:11], ["δ"] * 5, *args[12:])
    with pytest.raises(ValueError, match="four function addresses"):
        _opt_tree.bind(1, 1, 1, 0)


def _planner(costs: CostModel | None = None, **params) -> OptTreePlanner:
    planner = OptTreePlanner(**params)
    if costs is not None:
        planner.use_costs(costs)
    return planner


@pytest.mark.model
@pytest.mark.parametrize(
    "params, costs, sampling",
    [
        ({"budget": 16}, CPU, SamplingParams()),  # paying layers, δ from the curves
        ({"budget": 24, "delta": 0.02, "layers": "all"}, None, SamplingParams()),  # the paper's levels
        ({"budget": 16}, CPU, SamplingParams(temperature=0.8, seed=11)),  # sampling: a tempered draft
    ],
)
def test_compiled_opt_tree_equals_drafting_level_by_level(pair, params, costs, sampling):
    prompt = chat_prompt(pair, ENGINE_PROMPTS[1])
    compiled = compiled_and_by_levels(
        pair, lambda: _planner(costs, **params), prompt, "grow_opt_tree", opt_tree_by_levels, sampling
    )
    assert any(decodes > 2 for _, _, decodes, _, _ in compiled)  # trees of several levels were drafted
    assert any(verified > 3 for _, verified, _, _, _ in compiled)


@pytest.mark.model
@pytest.mark.parametrize(
    "n, capacity, cut, sizing", [(16, 32, False, False), (8, 10, True, False), (12, 32, False, True)]
)
def test_one_tree_has_the_kept_nodes_distributions_and_cache(pair, n, capacity, cut, sizing):
    """cut: the sequences run out; sizing: step 4 by cost curves where each verified token costs half a
    target decode (only likely nodes pay: the kept tree is smaller than n)."""
    prompt = chat_prompt(pair, ENGINE_PROMPTS[0])
    steep = CostModel.from_functions(lambda n: 1.0 + 0.5 * n, lambda m: 0.33 * m)
    final = _planner(steep).sizing(n) if sizing else None
    levels = OptTreeLevels(n, capacity, 8, (0.0,) * (n + 1), None, final)  # δ = 0: as deep as allowed
    trees, dists, states, drafted = [], [], [], []
    for grow in (Draft.grow_opt_tree, opt_tree_by_levels):
        draft = pair.draft
        draft.sync(prompt)
        draft.begin_step(0.0)
        tree = TreeBuilder(prompt[-1])
        sizes = grow(draft, tree, levels)
        assert len(sizes) > 2 and sum(sizes) <= capacity + 1
        trees.append((sizes, tree.tokens, tree.parents, tree.draft_prob, tree.path_prob, tree.child_rule))
        dists.append([(node, d.ids.tolist(), d.probs.tolist()) for node, d in tree.dists.items()])
        cells = [draft.ctx.seq_pos_max(seq) for seq in range(draft.n_seq)]
        # what commit reads: the sequence of each kept path (the reference also has the dropped nodes')
        paths = [tuple(tree.path_tokens(node)) for node in range(tree.size)]
        path_seq = {path: draft._path_seq.get(path, "not decoded") for path in paths}
        states.append((cells, path_seq, draft._used_seqs, draft.tagged_seqs, draft.committed[:]))
        drafted.append(len(draft._path_seq))
    assert trees[0] == trees[1]
    assert dists[0] == dists[1]  # every kept node the draft evaluated, in evaluation order
    assert states[0] == states[1]  # the same cells per sequence and the same bookkeeping for commit
    assert np.unique(trees[0][2][1:]).size > 1  # a tree, not a chain
    assert drafted[0] == len(dists[0]) < drafted[1] == sum(trees[0][0])  # only the kept nodes came back
    kept = len(trees[0][1]) - 1
    assert 0 < kept < n if sizing else kept == n  # step 4 cut the tree by the curves, or kept the n best
    if cut:
        assert sum(trees[0][0]) == capacity + 1  # every sequence used: the layers were cut to fit
