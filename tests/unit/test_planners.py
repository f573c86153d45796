"""Planners on synthetic draft distributions: tree invariants for every strategy, then each paper's
rules — TSD pruning, GSD merging, OPT-Tree optimality, DySpec's Algorithms 1 and 2 — and the registry."""

from __future__ import annotations

import argparse
import heapq
from dataclasses import replace

import numpy as np
import pytest

from edgespec.errors import EdgespecError
from edgespec.options import add_parameter_flags, parameters_from_args
from edgespec.planner.dyspec import DySpecPlanner, draw_order
from edgespec.planner.gsd import GSDPlanner, unmerge
from edgespec.planner.inputs import PlanContext
from edgespec.planner.opt_tree import OptTreePlanner, top_nodes, worth_drafting
from edgespec.planner.strategies import (
    PARAM_NAMES,
    STRATEGY_NAMES,
    StrategyError,
    parameter_table,
)
from edgespec.planner.strategies import (
    build as make_planner,
)
from edgespec.planner.tree import ChildRule, DraftTree, TreeBuilder
from edgespec.planner.tsd import TSDPlanner
from tests.support.fakes import SyntheticDrafter, sparse
from tests.support.profiles import Given

# A conversation before the root (7) that 7 occurred in: the copying planners find continuations.
HISTORY = (3, 7, 11, 13, 5, 7, 11, 17, 2, 9)


def ctx(sampling: bool = False, seed: int = 0, max_nodes: int = 256) -> PlanContext:
    return PlanContext(
        sampling=sampling, rng=np.random.default_rng(seed), max_nodes=max_nodes, history=HISTORY
    )


def run(planner, drafter: SyntheticDrafter, context: PlanContext, root: int = 7) -> DraftTree:
    if planner.needs_target_root:
        return planner.plan(root, drafter, replace(context, root_dist=drafter.dist_for((root, 999))))
    return planner.plan(root, drafter, context)


def check_tree(tree: DraftTree, max_nodes: int, stats: bool = True) -> None:
    """The invariants every planner's tree must satisfy."""
    n = tree.size
    assert 1 <= n <= max_nodes
    assert tree.parents[0] == -1 and tree.depth[0] == 0 and tree.path_prob[0] == 1.0
    for i in range(1, n):
        parent = int(tree.parents[i])
        assert 0 <= parent < i, "parents come before children"
        assert tree.depth[i] == tree.depth[parent] + 1
        path = tree.path(i)
        assert np.isclose(tree.path_prob[i], np.prod(tree.draft_prob[path[1:]]), rtol=1e-12)
        assert 0.0 < tree.draft_prob[i] <= 1.0
    for node in range(n):
        children = tree.children(node)
        if not children:
            assert tree.child_rule[node] == ChildRule.NONE, f"leaf {node} has a child rule"
            continue
        rules = (ChildRule.TOP, ChildRule.SAMPLED) + ((ChildRule.LONGEST,) if node == 0 else ())
        assert tree.child_rule[node] in rules, f"node {node}: no child rule"
        tokens = [int(tree.tokens[c]) for c in children]
        assert len(set(tokens)) == len(tokens), f"node {node}: duplicate siblings {tokens}"
        drafted = [c for c in children if not tree.copied[c]]  # copies come from the conversation
        if any(tree.copied[c] for c in children):
            assert tree.child_rule[node] == ChildRule.TOP, "copies are deterministic: one-hot rule"
        if drafted:
            assert node in tree.dists, f"node {node} has drafted children but no distribution"
        for c in drafted:  # every drafted child was proposed by the distribution stored for its parent
            assert tree.draft_prob[c] == pytest.approx(
                tree.dists[node].prob_of(int(tree.tokens[c])), rel=1e-12
            )
    if stats:
        assert tree.stats.expected_accept == pytest.approx(float(tree.path_prob[1:].sum()))


def paths_with_children(tree) -> dict[tuple[int, ...], list[int]]:
    """Canonical form independent of node numbering: token path → child tokens in order."""
    return {
        tuple(tree.path_tokens(i)): [int(tree.tokens[c]) for c in tree.children(i)] for i in range(tree.size)
    }


# -- every planner ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", STRATEGY_NAMES)
@pytest.mark.parametrize("sampling", [False, True])
@pytest.mark.parametrize("seed,max_nodes", [(0, 256), (1, 64), (2, 16), (3, 5)])
def test_every_planner_builds_a_valid_tree(name, sampling, seed, max_nodes):
    drafter = SyntheticDrafter.random(vocab=40, top_k=8, seed=seed, sharpness=1.5 + seed)
    planner = make_planner(name)
    tree = run(planner, drafter, ctx(sampling, seed, max_nodes))
    check_tree(tree, max_nodes)
    assert tree.size > 1
    assert tree.stats.draft_decodes == drafter.decodes
    assert tree.stats.drafted_nodes == drafter.nodes_expanded
    assert drafter.nodes_expanded <= max_nodes  # the draft's sequences are bounded like the tree
    budget = getattr(planner, "budget", 0) or max_nodes
    assert tree.size - 1 <= budget
    if sampling and name in ("dyspec", "mcsd", "mcsd-target-init", "chain"):
        assert ChildRule.SAMPLED in set(tree.child_rule.tolist())
    if not planner.lossy:  # the lossy selection among the target's own tokens is flagged as such
        assert ChildRule.LONGEST not in set(tree.child_rule.tolist())
    if name in ("tsd", "gsd", "opt-tree") or not sampling:
        assert ChildRule.SAMPLED not in set(tree.child_rule.tolist())  # deterministic: one-hot rule


@pytest.mark.parametrize("name", STRATEGY_NAMES)
@pytest.mark.parametrize("budget", [1, 3, 10])
def test_budget_caps_verified_nodes(name, budget):
    drafter = SyntheticDrafter.random(vocab=30, top_k=6, seed=budget, sharpness=1.0)
    key = "gamma" if name == "chain" else "budget"
    tree = run(make_planner(name, {key: budget}), drafter, ctx())
    check_tree(tree, 256)
    assert tree.size - 1 <= budget


# -- TSD ---------------------------------------------------------------------------------------------
def table_drafter(table: dict[tuple[int, ...], list[float]], default: list[float]) -> SyntheticDrafter:
    """Distributions by token path; token ids are 10·depth + rank so every path is distinct and readable."""

    def dist(path):
        probs = table.get(path, default)
        base = 10 * len(path)
        return sparse(probs, ids=[base + i for i in range(len(probs))])

    return SyntheticDrafter(dist)


def test_tsd_probability_pruning_makes_leaves():
    # Root: 0.5 and 0.3 pass θ_prob = 0.2; 0.15 and 0.05 do not (leaves, never expanded).
    drafter = table_drafter({(1,): [0.5, 0.3, 0.15, 0.05]}, default=[0.1, 0.05])
    tree = TSDPlanner(k=4, theta_prob=0.2, theta_sib=0.0, max_depth=3, budget=100).plan(1, drafter, ctx())
    assert [int(tree.tokens[c]) for c in tree.children(0)] == [10, 11, 12, 13]  # all k children kept
    assert drafter.calls[1] == [1, 2]  # only the two above θ_prob grow
    assert drafter.decodes == 2  # then nothing passes θ_prob: draft exit before the depth limit
    assert tree.depth.max() == 2


def test_tsd_sibling_pruning_makes_leaves():
    # 0.25 passes θ_prob = 0.2 but is below θ_sib · m_q = 0.3 · 0.9 = 0.27: a leaf.
    drafter = table_drafter({(1,): [0.9, 0.25]}, default=[0.95, 0.01])
    tree = TSDPlanner(k=4, theta_prob=0.2, theta_sib=0.3, max_depth=3, budget=100).plan(1, drafter, ctx())
    assert list(tree.children(0)) == [1, 2]
    assert drafter.calls[1] == [1]
    drafter = table_drafter({(1,): [0.9, 0.28]}, default=[0.95, 0.01])  # 0.28 ≥ 0.27: grows
    TSDPlanner(k=4, theta_prob=0.2, theta_sib=0.3, max_depth=3, budget=100).plan(1, drafter, ctx())
    assert drafter.calls[1] == [1, 2]


def test_tsd_depth_k_and_budget():
    drafter = SyntheticDrafter.random(vocab=20, top_k=6, seed=5)
    tree = TSDPlanner(k=3, theta_prob=0.0, theta_sib=0.0, max_depth=3, budget=10_000).plan(1, drafter, ctx())
    assert tree.size == 1 + 3 + 9 + 27  # the full 3-ary tree of depth 3
    assert drafter.decodes == 3
    # With a budget, each level keeps its candidates of largest p̂.
    small = TSDPlanner(k=3, theta_prob=0.0, theta_sib=0.0, max_depth=3, budget=7)
    drafter2 = SyntheticDrafter.random(vocab=20, top_k=6, seed=5)
    pruned = small.plan(1, drafter2, ctx())
    assert pruned.size == 8
    level2_full = sorted((tree.path_prob[i] for i in range(tree.size) if tree.depth[i] == 2), reverse=True)
    level2_kept = sorted(
        (pruned.path_prob[i] for i in range(pruned.size) if pruned.depth[i] == 2), reverse=True
    )
    assert level2_kept == pytest.approx(level2_full[: len(level2_kept)])


# -- GSD ---------------------------------------------------------------------------------------------
def bigram_drafter(seed: int = 0) -> SyntheticDrafter:
    """Next token depends only on the last one: the same n-grams recur across branches."""
    return SyntheticDrafter.random(vocab=9, top_k=4, seed=seed, context=1, sharpness=0.8)


def taus_of(graph, tau):
    return {
        node: tuple(graph.tree.path_tokens(node)[-tau:])
        for node in graph.nodes
        if graph.tree.depth[node] >= tau - 1
    }


@pytest.mark.parametrize("tau", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_gsd_merges_every_redundant_tau_gram(tau, seed):
    planner = GSDPlanner(k=4, tau=tau, theta_prob=0.0, theta_sib=0.0, max_depth=3, budget=20_000)
    graph, _ = planner.build_graph(3, bigram_drafter(seed), ctx(max_nodes=100_000))
    assert graph.alias, "this distribution repeats n-grams: something must merge"
    assert graph.unmerged_counts()[1][0] <= 10_000, "the budget must not bind here (it would refuse merges)"
    grams = taus_of(graph, tau)
    by_gram: dict[tuple, list[int]] = {}
    for node, gram in grams.items():
        by_gram.setdefault(gram, []).append(node)
    for gram, nodes in by_gram.items():
        # Two graph nodes share a τ-gram only when one lies on the other's path (no merge: a cycle).
        for a in nodes:
            for b in nodes:
                if a < b:
                    assert graph.reaches(a, b), f"τ-gram {gram} ends at {a} and {b}: not merged"
    for c, f in graph.alias.items():
        assert tuple(graph.tree.path_tokens(c)[-tau:]) == grams[f]
        assert f < c and f not in graph.alias
        assert c not in graph.expanded and not graph.kids[c], "a merged node is never drafted"


def sink_paths(graph) -> list[tuple[int, ...]]:
    """Token sequences of every root→sink path of a GSD graph (the hypotheses it holds)."""
    paths, stack = [], [(0, (graph.tree.tokens[0],))]
    while stack:
        node, tokens = stack.pop()
        succ = graph.successors(node)
        if not succ:
            paths.append(tokens)
        for nxt in succ:
            stack.append((nxt, (*tokens, graph.tree.tokens[nxt])))
    return paths


@pytest.mark.parametrize("tau", [1, 2])
@pytest.mark.parametrize("budget,depth", [(6, 4), (20, 4), (60, 4), (400, 4), (20_000, 3)])
def test_gsd_unmerged_tree_holds_exactly_the_graph_paths(tau, budget, depth):
    planner = GSDPlanner(k=4, tau=tau, theta_prob=0.0, theta_sib=0.0, max_depth=depth, budget=budget)
    graph, _ = planner.build_graph(3, bigram_drafter(), ctx(max_nodes=100_000))
    tree = unmerge(graph).freeze()
    check_tree(tree, 100_000, stats=False)
    assert tree.size - 1 <= budget
    _, sub = graph.unmerged_counts()
    assert tree.size == sub[0]  # the budget accounting counted the unmerged tree exactly
    leaf_paths = sorted(tuple(tree.path_tokens(leaf)) for leaf in tree.leaves)
    assert leaf_paths == sorted(sink_paths(graph))
    # Drafted nodes keep their indices; replicas (merged) come after them and are never drafted.
    n = graph.tree.size
    assert np.array_equal(tree.tokens[:n], graph.tree.tokens) and not tree.merged[:n].any()
    assert tree.merged[n:].all() and (tree.size > n) == bool(
        graph.alias and any(graph.kids[f] for f in graph.alias.values())
    )


def test_gsd_drafts_less_than_tsd_on_repeating_ngrams():
    params = dict(k=4, theta_prob=0.0, theta_sib=0.0, max_depth=5, budget=400)
    tsd_drafter, gsd_drafter = bigram_drafter(), bigram_drafter()
    tsd = TSDPlanner(**params).plan(3, tsd_drafter, ctx(max_nodes=1000))
    gsd = GSDPlanner(tau=1, **params).plan(3, gsd_drafter, ctx(max_nodes=1000))
    assert gsd.stats.merges > 0 and gsd.merged.any()
    assert tsd.size - 1 == 400 >= gsd.size - 1 > 0.9 * 400  # about as many tokens verified…
    assert gsd_drafter.nodes_expanded < tsd_drafter.nodes_expanded / 3  # …for a third of the drafting
    # The replicated nodes are not drafted: the draft saw only the graph.
    replica_paths = {tuple(gsd.path_tokens(i)) for i in np.flatnonzero(gsd.merged)}
    assert not replica_paths & set(gsd_drafter.expanded_paths)
    assert gsd.stats.drafted_nodes == gsd_drafter.nodes_expanded < gsd.size


def test_gsd_uses_one_hot_rules_under_sampling():
    tree = GSDPlanner(tau=1, theta_prob=0.0, theta_sib=0.0, max_depth=4).plan(3, bigram_drafter(), ctx(True))
    assert set(tree.child_rule.tolist()) <= {ChildRule.NONE, ChildRule.TOP}
    for node in np.flatnonzero(tree.merged):  # a replica's parent carries the distribution it was copied from
        assert tree.dists[int(tree.parents[node])].prob_of(int(tree.tokens[node])) == tree.draft_prob[node]


# -- OPT-Tree ----------------------------------------------------------------------------------------
def best_subtree_value(children: dict[int, list[int]], value: dict[int, float], n: int) -> float:
    """Brute force: the largest Σ value over all subtrees of n nodes plus the root (node 0)."""
    best = 0.0

    def grow(chosen: int, total: float, frontier: list[int]) -> None:
        nonlocal best
        if chosen == n:
            best = max(best, total)
            return
        for i, node in enumerate(frontier):  # take node; never take frontier[:i] in this branch
            grow(chosen + 1, total + value[node], frontier[i + 1 :] + children.get(node, []))

    grow(0, 0.0, list(children.get(0, [])))
    return best


def full_tree(drafter: SyntheticDrafter, root: int, k: int, depth: int):
    children, value, paths = {}, {0: 1.0}, {0: (root,)}
    level, nxt_id = [0], 1
    for _ in range(depth):
        nxt = []
        for node in level:
            dist = drafter.dist_for(paths[node])
            for pos in range(k):
                children.setdefault(node, []).append(nxt_id)
                value[nxt_id] = value[node] * float(dist.probs[pos])
                paths[nxt_id] = (*paths[node], int(dist.ids[pos]))
                nxt.append(nxt_id)
                nxt_id += 1
        level = nxt
    return children, value


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [3, 5, 6])
def test_opt_tree_matches_the_brute_force_optimum(seed, n):
    drafter = SyntheticDrafter.random(vocab=12, top_k=3, seed=seed, sharpness=1.2)
    tree = OptTreePlanner(budget=n, delta=0.0, max_depth=3).plan(2, drafter, ctx())
    children, value = full_tree(drafter, 2, k=3, depth=3)
    value.pop(0)
    assert tree.size == n + 1
    assert tree.stats.expected_accept == pytest.approx(best_subtree_value(children, {0: 0.0, **value}, n))


@pytest.mark.parametrize("seed", range(4))
def test_opt_tree_keeps_the_top_n_which_form_a_subtree(seed):
    drafter = SyntheticDrafter.random(vocab=30, top_k=8, seed=seed)
    n = 12
    tree = OptTreePlanner(budget=n, delta=0.0, max_depth=6).plan(2, drafter, ctx())
    drafted = drafter.tree  # everything drafted, before the final selection
    keep = top_nodes(np.asarray(drafted.path_prob), n)
    assert set(drafted.parents[k] for k in keep) <= set(keep.tolist()) | {0}  # closed under parents
    kept_probs = sorted(np.asarray(drafted.path_prob)[keep])
    all_probs = sorted(drafted.path_prob[1:])
    assert kept_probs == pytest.approx(all_probs[-n:])
    assert sorted(tuple(drafted.path_tokens(int(k))) for k in keep) == sorted(
        tuple(tree.path_tokens(i)) for i in range(1, tree.size)
    )


@pytest.mark.parametrize("seed", range(4))
def test_opt_tree_builds_only_nodes_that_could_be_kept(seed):
    """A child at or below the n-th largest p̂ of the nodes before it can never be kept (they are older,
    and win ties): it is not built. Every built node was inside the running top n when added."""
    drafter = SyntheticDrafter.random(vocab=30, top_k=8, seed=seed, sharpness=4.0)
    n = 12
    OptTreePlanner(budget=n, delta=0.0, max_depth=6).plan(2, drafter, ctx())
    phat = np.asarray(drafter.tree.path_prob)
    assert phat.shape[0] - 1 > n
    for node in range(n + 1, phat.shape[0]):
        assert phat[node] > np.sort(phat[1:node])[-n]


def test_opt_tree_expected_accept_grows_with_depth_and_delta_stops_it():
    values = []
    for depth in range(1, 7):
        drafter = SyntheticDrafter.random(vocab=30, top_k=8, seed=9, sharpness=3.0)
        values.append(
            OptTreePlanner(budget=16, delta=0.0, max_depth=depth)
            .plan(2, drafter, ctx())
            .stats.expected_accept
        )
    assert all(b >= a - 1e-12 for a, b in zip(values, values[1:]))
    assert values[-1] > values[0]
    drafter = SyntheticDrafter.random(vocab=30, top_k=8, seed=9, sharpness=3.0)
    shallow = OptTreePlanner(budget=16, delta=5.0).plan(2, drafter, ctx())  # no level can add 5 tokens
    assert drafter.decodes == 1 and shallow.depth.max() == 1
    assert OptTreePlanner(mu=0.3).threshold(8, 16) == 0.3
    assert OptTreePlanner(mu=0.3, delta=0.5).threshold(8, 16) == 0.5


def test_opt_tree_takes_mu_from_the_cost_profile():
    from edgespec.planner.costmodel import CostModel

    costs = CostModel.from_functions(lambda n: 0.1 * n, lambda n: 0.04 * n)
    planner = OptTreePlanner(budget=24)
    assert planner.threshold(8, 24) == OptTreePlanner.DEFAULT_MU  # no profile yet
    planner.prepare(Given(costs))
    # μ = c_d(level) / c_t(n + 1): a level of 8 nodes against verifying 25 tokens
    assert planner.threshold(8, 24) == pytest.approx(0.04 * 8 / (0.1 * 25))
    assert planner.threshold(1, 24) == pytest.approx(0.04 / (0.1 * 25))
    given = OptTreePlanner(mu=0.3)
    given.prepare(Given(costs))
    assert given.threshold(8, 24) == 0.3  # a μ given on the command line wins over the measured one
    assert f"{0.04 * 24 / (0.1 * 25):.3g}" in planner.describe()  # δ of a full level of n


def test_planners_ask_the_profile_only_for_what_they_use():
    """``prepare``: auto asks for the cost curves, then the fit; OPT-Tree, n-gram and hybrid for the
    curves (OPT-Tree even with μ given: its levels' cost and its tree's size come from them); every other
    planner for nothing, so nothing is measured for it. Without a draft there are no curves: auto then
    asks no fit and decodes plainly."""
    from edgespec.planner.costmodel import CostModel, DraftFit

    costs = CostModel.from_functions(lambda n: 0.1 * n, lambda n: 0.04 * n)
    fit = DraftFit(np.array([0.8, 0.08, 0.03, 0.02]), ratio=1.0, tokens=64)
    asks = {"auto": ["costs", "fit"], "opt-tree": ["costs"], "ngram": ["costs"], "hybrid": ["costs"]}
    for name in STRATEGY_NAMES:
        given = Given(costs, fit)
        make_planner(name).prepare(given)
        assert given.asked == asks.get(name, []), name
    given = Given(costs)
    make_planner("opt-tree", {"mu": 0.3}).prepare(given)
    assert given.asked == ["costs"]
    no_draft, auto = Given(), make_planner("auto")
    auto.prepare(no_draft)
    assert no_draft.asked == ["costs"] and auto.costs is None and "plain decoding" in auto.describe()


def test_opt_tree_stops_earlier_where_a_draft_level_costs_its_size():
    """On a CPU a level of m nodes costs about m decodes: μ from c_d(1) / c_t(1) would grow the tree
    deeper than its levels pay for."""
    from edgespec.planner.costmodel import CostModel

    per_node = CostModel.from_functions(lambda n: 1.0, lambda m: 0.05 * m)  # c_d(1) / c_t(1) = 0.05
    depths = {}
    for label, planner in {
        "one token": OptTreePlanner(budget=24, mu=0.05),
        "level": OptTreePlanner(budget=24, layers="all"),  # every layer node: the δ rule alone
    }.items():
        if label == "level":
            planner.prepare(Given(per_node))
        drafter = SyntheticDrafter.random(vocab=30, top_k=8, seed=9, sharpness=3.0)
        tree = planner.plan(2, drafter, ctx())
        depths[label] = (int(tree.depth.max()), drafter.decodes)
    assert depths["level"][1] < depths["one token"][1]  # fewer draft levels
    assert depths["level"][0] < depths["one token"][0]


def test_opt_tree_drafts_only_layer_nodes_that_pay_for_their_level():
    """layers="paying": a layer's m best nodes, m maximising Σ p̂ − c_d(m) / c_t(n + 1). Where a row
    costs its share of a decode, unlikely alternatives go undrafted (fewer rows, no more passes); where
    draft rows cost nothing the trees are the paper's ("all") exactly."""
    from edgespec.planner.costmodel import CostModel

    def plan(draft_cost, layers, seed):
        planner = OptTreePlanner(budget=16, delta=0.05, layers=layers)
        planner.prepare(Given(CostModel.from_functions(lambda n: 1.0 + 0.05 * n, draft_cost)))
        drafter = SyntheticDrafter.random(vocab=40, top_k=8, seed=seed, sharpness=9.0)
        tree = planner.plan(2, drafter, ctx())
        return tree, drafter.decodes, tree.stats.drafted_nodes

    fewer = 0
    for seed in range(12):
        free, free_all = plan(lambda m: 0.0 * m, "paying", seed), plan(lambda m: 0.0 * m, "all", seed)
        assert np.array_equal(free[0].tokens, free_all[0].tokens)
        assert np.array_equal(free[0].parents, free_all[0].parents)
        assert free[2] == free_all[2]
        paying, every = plan(lambda m: 0.1 * m, "paying", seed), plan(lambda m: 0.1 * m, "all", seed)
        assert paying[2] <= every[2] and paying[1] <= every[1]
        fewer += paying[2] < every[2]
    assert fewer >= 6  # most plans leave rows undrafted


def test_opt_tree_paying_layer_maximises_value_minus_cost():
    from edgespec.planner.costmodel import CostModel

    planner = OptTreePlanner(budget=8)
    planner.prepare(Given(CostModel.from_functions(lambda n: 2.0, lambda m: 0.1 + 0.2 * m)))
    tree = TreeBuilder(7)
    for token, q in enumerate([0.5, 0.3, 0.12, 0.05, 0.03]):
        tree.add(0, token, q)
    # level cost / t = 0.05 + 0.1 m; Σ p̂ − cost: 0.35, 0.55, 0.57, 0.52, 0.45 → m = 3
    levels = planner.levels(8, 64)
    assert levels.threshold == levels.level_cost  # δ is the next level's cost in target steps
    assert worth_drafting(tree, [5, 1, 4, 2, 3], levels.level_cost) == [1, 2, 3]
    assert OptTreePlanner(budget=8, layers="all").levels(8, 64).level_cost is None
    assert worth_drafting(tree, [5, 1], None) == [5, 1]


def test_opt_tree_sizes_the_final_tree_by_the_cost_curves():
    """With the cost curves, the final tree is the top m ≤ n for the step's best expected rate: a dip
    in the verify curve (16 tokens cheaper than 15 or 17, as on a CPU's batched kernels) is taken,
    flat verify costs keep all n, and the kept nodes are still the top m by p̂."""
    from edgespec.planner.costmodel import CostModel

    def plan(target_cost):
        planner = OptTreePlanner(budget=16, delta=0.0, max_depth=6)
        planner.prepare(Given(CostModel.from_functions(target_cost, lambda m: 0.0)))
        drafter = SyntheticDrafter.random(vocab=30, top_k=8, seed=9, sharpness=3.0)
        return planner.plan(2, drafter, ctx()), drafter.tree

    flat, _ = plan(lambda n: 1.0)
    assert flat.size == 17
    dip, drafted = plan(lambda n: 0.6 if n == 16 else 1.0 + 0.01 * n)
    assert dip.size == 16  # 15 draft tokens and the root: the cheap batch
    keep = top_nodes(np.asarray(drafted.path_prob), 15)
    assert sorted(np.asarray(drafted.path_prob)[keep]) == pytest.approx(sorted(dip.path_prob[1:]))
    steep, _ = plan(lambda n: float(n))  # every token costs a decode: speculation cannot pay
    assert steep.size == 1


# -- DySpec ------------------------------------------------------------------------------------------
def reference_alg1(dist_for, root: int, m: int, seed: int | None):
    """DySpec Algorithm 1 as printed: one draft call per node, the residual R kept explicitly."""
    tree = TreeBuilder(root)
    heap, count, popped = [], 0, []

    def push(v, node, residual, order):
        nonlocal count
        heapq.heappush(heap, (-v, count, node, residual, order))
        count += 1

    def new_entry(node, v):  # line 14: d_i ← D(·|x_i)
        dist = dist_for(tuple(tree.path_tokens(node)))
        push(v, node, dist.sampling_q().copy(), list(draw_order(dist, seed, tree.path_tokens(node))))

    new_entry(0, 1.0)
    while heap and tree.size - 1 < m:
        neg_v, _, node, r, order = heapq.heappop(heap)
        v = -neg_v
        popped.append(v)
        y = order.pop(0)  # greedy: argmax of R; sampling: the node's next draw
        dist = dist_for(tuple(tree.path_tokens(node)))
        child = tree.add(node, int(dist.ids[y]), float(dist.probs[y]))
        v0, v1 = v * r[y], v * (1 - r[y])
        r = r.copy()
        r[y] = 0.0
        if r.sum() > 0:
            push(v1, node, r / r.sum(), order)
        new_entry(child, v0)
    return tree.freeze(), popped


@pytest.mark.parametrize("sampling", [False, True])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [5, 20, 48])
def test_dyspec_follows_algorithm_1(sampling, seed, budget):
    drafter = SyntheticDrafter.random(vocab=25, top_k=6, seed=seed, sharpness=1.0 + seed)
    tree = DySpecPlanner(budget=budget).plan(4, drafter, ctx(sampling, seed))
    step_seed = int(np.random.default_rng(seed).integers(2**63)) if sampling else None
    ref, _ = reference_alg1(drafter.dist_for, 4, budget, step_seed)
    assert np.array_equal(tree.tokens, ref.tokens) and np.array_equal(tree.parents, ref.parents)  # same order
    assert tree.draft_prob == pytest.approx(ref.draft_prob)
    assert drafter.decodes < budget  # Algorithm 1 as printed drafts once per node
    check_tree(tree, 256)


@pytest.mark.parametrize("sampling", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_dyspec_threshold_at_the_last_value_rebuilds_the_budget_tree(sampling, seed):
    drafter = SyntheticDrafter.random(vocab=25, top_k=6, seed=seed, sharpness=1.5)
    step_seed = int(np.random.default_rng(seed).integers(2**63)) if sampling else None
    ref, popped = reference_alg1(drafter.dist_for, 4, 30, step_seed)
    by_budget = DySpecPlanner(budget=30).plan(4, drafter, ctx(sampling, seed))
    layered_drafter = SyntheticDrafter(drafter.dist_fn)
    # The last popped value, less a hair: the reference renormalises R step by step, the planner divides
    # by what is left, so the same value may differ in the last bits.
    threshold = min(popped) * (1 - 1e-9)
    layered = DySpecPlanner(budget=10_000, threshold=threshold).plan(4, layered_drafter, ctx(sampling, seed))
    assert paths_with_children(layered) == paths_with_children(by_budget) == paths_with_children(ref)
    assert layered_drafter.decodes == layered.depth.max()  # Algorithm 2: one draft decode per layer
    check_tree(layered, 10_001)


# -- registry ----------------------------------------------------------------------------------------
def test_make_planner_defaults_and_overrides():
    assert set(STRATEGY_NAMES) == {
        "chain",
        "tsd",
        "gsd",
        "opt-tree",
        "dyspec",
        "mcsd",
        "mcsd-target-init",
        "ngram",
        "hybrid",
        "parallelspec",
    }
    gsd = make_planner("gsd", {"tau": "3", "theta-prob": 0.1, "budget": None, "gamma": 9})  # gamma: chain's
    assert (gsd.tau, gsd.theta_prob, gsd.budget, gsd.k) == (3, 0.1, 32, 4)
    assert make_planner("mcsd", {"k_config": "3x2"}).k_config == (3, 2)
    assert make_planner("mcsd-target-init").lossy and not make_planner("mcsd").lossy
    assert make_planner("opt-tree", {"mu": 0.25}).threshold(8, 24) == 0.25
    for name in STRATEGY_NAMES:
        planner = make_planner(name)
        assert planner.name == name and isinstance(planner.describe(), str)


def test_only_copying_needs_no_draft():
    from edgespec.strategy import needs_draft

    assert {name for name in STRATEGY_NAMES if not make_planner(name).needs_draft} == {"ngram"}
    assert not needs_draft("none") and not needs_draft("ngram")
    assert needs_draft("hybrid") and needs_draft("auto") and needs_draft("chain")


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("beam", {}, "unknown strategy"),
        ("tsd", {"thta_prob": 0.1}, "unknown strategy parameter"),
        ("tsd", {"k": "four"}, "not a valid int"),
        ("gsd", {"tau": 0}, "out of range"),
        ("tsd", {"theta_sib": 1.5}, "out of range"),
        ("mcsd", {"k_config": "4,0"}, "out of range"),
        ("mcsd", {"early_stop": "sometimes"}, "not one of"),
        ("mcsd", {"early_stop": "model"}, "--early-stop-model"),
        ("mcsd", {"early_stop": "model", "early_stop_model": "/nonexistent.npz"}, "cannot load"),
    ],
)
def test_make_planner_errors_say_what_is_wrong(name, params, message):
    with pytest.raises(StrategyError, match=message) as info:
        make_planner(name, params)
    assert isinstance(info.value, EdgespecError)


def test_cli_flags_come_from_the_table():
    parser = argparse.ArgumentParser()
    add_parameter_flags(parser)
    args = parser.parse_args(
        ["--tau", "1", "--theta-prob", "0.3", "--k-config", "4,2", "--early-stop", "threshold"]
    )
    given = parameters_from_args(args)
    assert given == {"tau": 1, "theta_prob": 0.3, "k_config": "4,2", "early_stop": "threshold"}
    assert make_planner("mcsd", given).k_config == (4, 2)
    assert parameters_from_args(parser.parse_args([])) == {}
    rows = parameter_table()
    assert {r["name"] for r in rows} == set(PARAM_NAMES)
    assert {"strategy": "gsd", "name": "tau", "flag": "--tau", "type": "int", "default": 2}.items() <= next(
        r for r in rows if r["strategy"] == "gsd" and r["name"] == "tau"
    ).items()
    assert all(r["help"] for r in rows)
    budget_help = next(a.help for a in parser._actions if a.dest == "budget")
    assert "opt-tree/hybrid: 24" in budget_help and "tsd/gsd/dyspec: 32" in budget_help


def test_a_frozen_tree_reads_as_python_numbers_and_as_arrays():
    """``DraftTree`` keeps its columns as tuples of Python numbers (what the step reads between decodes)
    and builds each array once, on first use, with the same values and dtypes as before."""
    builder = TreeBuilder(7)
    a = builder.add(0, 11, 0.5)
    builder.add(a, 12, 0.25, copied=True)
    builder.add(0, 13, 0.125, merged=True)
    builder.set_children_rule(0, ChildRule.TOP)
    tree = builder.freeze()
    assert tree.token_ids == (7, 11, 12, 13) and all(type(t) is int for t in tree.token_ids)
    assert tree.parent_ids == (-1, 0, 1, 0) and tree.depths == (0, 1, 2, 1) and tree.height == 2
    assert tree.path_probs == (1.0, 0.5, 0.125, 0.125)
    assert tree.merged_flags == (False, False, False, True)
    assert tree.copied_flags == (False, False, True, False)
    columns = {
        "tokens": np.int32, "parents": np.int32, "depth": np.int32, "draft_prob": np.float64,
        "path_prob": np.float64, "merged": np.bool_, "copied": np.bool_, "child_rule": np.int8,
    }  # fmt: skip
    for name, dtype in columns.items():
        array = getattr(tree, name)
        assert array.dtype == dtype and array is getattr(tree, name)  # built once
    assert tree.tokens.tolist() == list(tree.token_ids) and tree.child_rule.tolist() == [1, 0, 0, 0]
    assert tree.path(2) == [0, 1, 2] and tree.path_tokens(2) == [7, 11, 12] and tree.leaves == [2, 3]
