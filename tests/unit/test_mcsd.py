"""MCSD: k-configuration shapes, sampling without replacement, the engine's layout of MCSD trees,
early stopping and the target-initialised variant — on synthetic distributions."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from edgespec.decoding.verify import verify_greedy, verify_sampling
from edgespec.engine.layout import tree_layout
from edgespec.errors import EdgespecError
from edgespec.planner.earlystop import N_TOP, DecisionModel, features
from edgespec.planner.inputs import PlanContext
from edgespec.planner.mcsd import MCSDPlanner, MCSDTargetInitPlanner
from edgespec.planner.tree import ChildRule
from tests.support.fakes import SyntheticDrafter, sparse

CONFIGS = [(4, 2, 2, 1), (2, 4, 3, 1, 1), (3,), (1, 1, 1), (2, 3)]


def ctx(sampling: bool = False, seed: int = 0, max_nodes: int = 256) -> PlanContext:
    return PlanContext(sampling=sampling, rng=np.random.default_rng(seed), max_nodes=max_nodes)


def level_sizes(tree) -> list[int]:
    return np.bincount(tree.depth).tolist()


def full_level_sizes(config) -> list[int]:
    """Nodes per level of a k-configuration's full tree, the root's level first: (1, k1, k1·k2, …)."""
    return np.cumprod((1, *config)).tolist()


# -- shape -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("sampling", [False, True])
def test_k_config_shape(config, sampling):
    drafter = SyntheticDrafter.random(vocab=40, top_k=8, seed=len(config))
    tree = MCSDPlanner(k_config=config).plan(1, drafter, ctx(sampling))
    assert level_sizes(tree) == full_level_sizes(config)
    for node in range(tree.size):
        children = tree.children(node)
        depth = int(tree.depth[node])
        assert len(children) == (config[depth] if depth < len(config) else 0)
        if children:
            assert tree.child_rule[node] == (ChildRule.SAMPLED if sampling else ChildRule.TOP)
            tokens = [int(tree.tokens[c]) for c in children]
            assert len(set(tokens)) == len(tokens), "siblings are drawn without replacement"
            if not sampling:  # greedy: the draft's top k, in order
                assert tokens == tree.dists[node].ids[: len(tokens)].tolist()
    assert drafter.decodes == len(config)  # one batched decode per level
    assert tree.stats.drafted_nodes == sum(full_level_sizes(config)[:-1])


def test_first_and_second_child_follow_q_without_replacement():
    q = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    drafter = SyntheticDrafter(lambda path: sparse(q))
    planner = MCSDPlanner(k_config=(2,))
    rng = np.random.default_rng(42)
    runs = 20_000
    first, second = np.zeros(6), np.zeros(6)
    for _ in range(runs):
        tree = planner.plan(99, drafter, PlanContext(sampling=True, rng=rng))
        a, b = (int(tree.tokens[c]) for c in tree.children(0))
        first[a] += 1
        second[b] += 1
    # First draw ~ q; second ~ Σ_a q(a) · q(b) / (1 − q(a)) for b ≠ a (q with the first removed).
    expected_second = np.array([sum(q[a] * q[b] / (1 - q[a]) for a in range(6) if a != b) for b in range(6)])
    assert first / runs == pytest.approx(q, abs=0.015)  # σ ≤ 0.0035
    assert second / runs == pytest.approx(expected_second, abs=0.015)


def test_a_thin_distribution_gives_fewer_children_and_the_budget_caps():
    drafter = SyntheticDrafter(lambda path: sparse([0.7, 0.3]))  # only 2 candidates anywhere
    tree = MCSDPlanner(k_config=(4, 2)).plan(1, drafter, ctx(True))
    assert level_sizes(tree) == [1, 2, 4]
    capped = MCSDPlanner(k_config=(4, 2, 2, 1), budget=10).plan(1, SyntheticDrafter.random(seed=1), ctx())
    assert capped.size == 11 and level_sizes(capped) == [1, 4, 6]


# -- the engine's layout of MCSD trees ---------------------------------------------------------------
@pytest.mark.parametrize("config", CONFIGS)
def test_engine_layout_of_a_k_configuration_tree(config):
    """What the batch needs (engine/layout.py): positions are depths, each leaf's sequence id tags
    exactly its root path, and a recurring shape is laid out once (the paper's reuse, §3.2)."""
    tree = MCSDPlanner(k_config=config).plan(1, SyntheticDrafter.random(vocab=40, seed=len(config)), ctx())
    layout = tree_layout(tree.parents)
    assert np.array_equal(layout.depth, tree.depth)
    assert layout.n_leaves == full_level_sizes(config)[-1]
    for leaf_id, leaf in enumerate(tree.leaves):
        assert {u for u in range(tree.size) if leaf_id in layout.seq_ids[u]} == set(tree.path(leaf))
    for u in range(tree.size):
        assert layout.leaf_below[u] in layout.seq_ids[u]
    again = MCSDPlanner(k_config=config).plan(1, SyntheticDrafter.random(vocab=40, seed=99), ctx())
    assert tree_layout(again.parents) is layout  # same shape, built once


def test_an_early_stopped_tree_is_the_configuration_cut_at_a_level():
    """Early stopping keeps a prefix of the full tree's levels: the shape of the shorter configuration."""
    stopped = MCSDPlanner(k_config=(4, 2, 2, 1), early_stop="threshold", beta=1.0).plan(
        1, SyntheticDrafter.random(seed=2), ctx()
    )
    short = MCSDPlanner(k_config=(4,)).plan(1, SyntheticDrafter.random(seed=2), ctx())
    assert np.array_equal(stopped.parents, short.parents)
    assert tree_layout(stopped.parents) is tree_layout(short.parents)


# -- early stop --------------------------------------------------------------------------------------
def constant_model(p: float) -> DecisionModel:
    f = N_TOP + 3
    logit = float(np.log(p / (1 - p)))
    return DecisionModel(np.zeros(f), np.ones(f), np.zeros((f, 0)), np.zeros(0), np.zeros(f), logit)


def test_threshold_early_stop_when_every_branch_is_unlikely():
    flat = SyntheticDrafter(lambda path: sparse([0.3, 0.3, 0.2, 0.1, 0.1]))  # every draft prob < 0.4
    tree = MCSDPlanner(k_config=(4, 2, 2), early_stop="threshold", beta=0.4).plan(1, flat, ctx())
    assert level_sizes(tree) == [1, 4] and flat.decodes == 1
    # One confident branch is enough to go on (the stop needs *every* branch below β).
    peaked = SyntheticDrafter(
        lambda path: sparse([0.5, 0.2, 0.2, 0.1]) if len(path) == 1 else sparse([0.35, 0.3])
    )
    tree = MCSDPlanner(k_config=(4, 2, 2), early_stop="threshold", beta=0.4).plan(1, peaked, ctx())
    assert level_sizes(tree) == [1, 4, 8] and peaked.decodes == 2  # then every depth-2 node has q < β
    off = MCSDPlanner(k_config=(4, 2, 2)).plan(1, SyntheticDrafter(flat.dist_fn), ctx())
    assert level_sizes(off) == [1, 4, 8, 16]


@pytest.mark.parametrize("p,expected_levels", [(0.1, [1, 4]), (0.9, [1, 4, 8, 16, 16])])
def test_model_early_stop(p, expected_levels):
    drafter = SyntheticDrafter.random(seed=3)
    planner = MCSDPlanner(early_stop="model", beta=0.4, model=constant_model(p))
    tree = planner.plan(1, drafter, ctx())
    assert level_sizes(tree) == expected_levels
    assert planner.predicted_acceptance(drafter.tree, [1, 2]) == pytest.approx([p, p])


def test_model_sees_the_distribution_each_node_was_drawn_from():
    drafter = SyntheticDrafter.random(seed=4)
    planner = MCSDPlanner(k_config=(2, 2))
    tree = planner.plan(1, drafter, ctx())
    node = tree.children(0)[1]
    expected = features(tree.dists[0], tree.draft_prob[node])
    seen = []

    class Spy(DecisionModel):
        def predict_proba(self, x):
            seen.append(x)
            return np.ones(x.shape[0])

    base = constant_model(0.5)
    spy = Spy(base.mean, base.scale, base.w1, base.b1, base.w2, base.b2)
    MCSDPlanner(k_config=(2, 2), early_stop="model", model=spy).plan(
        1, SyntheticDrafter(drafter.dist_fn), ctx()
    )
    assert seen[0].shape == (2, N_TOP + 3) and np.allclose(seen[0][1], expected)


# -- target-initialised ------------------------------------------------------------------------------
def test_target_init_children_come_from_the_target():
    drafter = SyntheticDrafter.random(vocab=40, seed=5)
    target = sparse([0.5, 0.3, 0.2], ids=[31, 32, 33])
    planner = MCSDTargetInitPlanner(w=2, k_config=(3, 1))
    assert planner.lossy and planner.needs_target_root and planner.name == "mcsd-target-init"
    tree = planner.plan(1, drafter, replace(ctx(), root_dist=target))
    assert [int(tree.tokens[c]) for c in tree.children(0)] == [31, 32]  # the target's top w (greedy)
    assert tree.dists[0] is target and tree.child_rule[0] == ChildRule.LONGEST  # the lossy choice
    assert {int(r) for r in tree.child_rule[1:3]} == {int(ChildRule.TOP)}  # the draft's rules below
    assert level_sizes(tree) == [1, 2, 6, 6]
    assert drafter.calls[0] == [0] and drafter.calls[1] == [1, 2]  # the draft still decodes the root first
    sampled = MCSDTargetInitPlanner(w=2, k_config=(3, 1)).plan(
        1, SyntheticDrafter(drafter.dist_fn), replace(ctx(True), root_dist=target)
    )
    assert sampled.child_rule[0] == ChildRule.LONGEST and sampled.dists[0] is target
    assert {int(sampled.tokens[c]) for c in sampled.children(0)} <= {31, 32, 33}
    assert {int(sampled.child_rule[c]) for c in sampled.children(0)} == {int(ChildRule.SAMPLED)}


@pytest.mark.parametrize("sampling", [False, True])
def test_target_init_keeps_the_branch_accepted_longest(sampling):
    """The paper's selection: the second target token wins when only its draft continuation is accepted
    — under greedy that emits a token that is not the target's argmax (why it is lossy)."""
    target = sparse([0.6, 0.4], ids=[31, 32])
    drafter = SyntheticDrafter(lambda path: sparse([0.9], ids=[5]))  # every node proposes 5 (q = 1)
    planner = MCSDTargetInitPlanner(w=2, k_config=(1, 1))
    tree = planner.plan(1, drafter, replace(ctx(sampling), root_dist=target))
    assert sorted(int(tree.tokens[c]) for c in tree.children(0)) == [31, 32]  # sampled: in either order

    # The target: 5 after 32 and after 32 5, something no branch drafted everywhere else.
    def after(node: int) -> np.ndarray:
        path = tuple(tree.path_tokens(node)[1:])
        p = np.zeros(40)
        p[5 if path in {(32,), (32, 5)} else 7] = 1.0
        return p

    rng = np.random.default_rng(0)
    if sampling:
        verdict = verify_sampling(tree, after, rng)
    else:
        verdict = verify_greedy(tree, lambda node: int(np.argmax(after(node))))
    emitted = [int(tree.tokens[u]) for u in verdict.path[1:]] + [verdict.next_token]
    assert emitted == [32, 5, 5, 7] and verdict.accepted == 3


def test_target_init_without_the_target_distribution_says_so():
    with pytest.raises(EdgespecError, match="root_dist"):
        MCSDTargetInitPlanner().plan(1, SyntheticDrafter.random(), ctx())


@pytest.mark.parametrize(
    "kwargs", [{"k_config": ()}, {"k_config": (2, 0)}, {"early_stop": "maybe"}, {"early_stop": "model"}]
)
def test_invalid_configuration(kwargs):
    with pytest.raises(ValueError):
        MCSDPlanner(**kwargs)
