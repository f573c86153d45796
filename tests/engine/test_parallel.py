"""ParallelSpec without a model: the planner on synthetic per-depth distributions, and the mask step on
the strict fake llama context (one decode, K + 1 rows, no mask cell left, output equal to plain
decoding). The mechanism on a real (tiny random) GGUF and the LoRA adapter: test_parallel_gguf.py."""

from __future__ import annotations

import heapq
import itertools

import numpy as np
import pytest

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams
from edgespec.engine.rows import draft_dists
from edgespec.planner.dyspec import draw_order
from edgespec.planner.inputs import PlanContext
from edgespec.planner.parallel import ParallelSpecPlanner
from edgespec.planner.tree import ChildRule, TreeBuilder
from tests.support.fake_llama import FakePair
from tests.support.fakes import random_dist_fn

ROOT = 3


class ParallelFake:
    """The parallel half of the Drafter protocol over fixed per-depth distributions."""

    def __init__(self, dists):
        self.dists = dists
        self.calls: list[int] = []

    def parallel_dists(self, tree: TreeBuilder, k: int):
        assert tree.size == 1, "the parallel pass drafts from the root alone"
        self.calls.append(k)
        return list(self.dists[: k + 1])

    def expand(self, tree, nodes):
        raise AssertionError("ParallelSpec must not call expand (one draft pass per step)")


def depth_dists(n_depths: int, vocab: int = 30, top_k: int = 5, seed: int = 0):
    """Distinct pseudo-random distributions, one per depth (no ties in p̂)."""
    fn = random_dist_fn(vocab=vocab, top_k=top_k, seed=seed)
    return [fn((d,)) for d in range(n_depths)]


def ctx(sampling=False, seed=0, max_nodes=256) -> PlanContext:
    return PlanContext(sampling=sampling, rng=np.random.default_rng(seed), max_nodes=max_nodes)


def brute_force_top(dists, n: int) -> set[tuple[int, ...]]:
    """The n token paths of largest p̂ in the whole product tree (depth ≤ len(dists))."""
    scored = []
    for depth in range(1, len(dists) + 1):
        for ranks in itertools.product(*(range(d.ids.shape[0]) for d in dists[:depth])):
            phat = float(np.prod([dists[i].probs[r] for i, r in enumerate(ranks)]))
            scored.append((phat, tuple(int(dists[i].ids[r]) for i, r in enumerate(ranks))))
    return {path for _, path in heapq.nlargest(n, scored)}


def paths(tree) -> set[tuple[int, ...]]:
    return {tuple(tree.path_tokens(node)[1:]) for node in range(1, tree.size)}


@pytest.mark.parametrize("budget", [1, 5, 16, 40])
def test_greedy_tree_is_the_top_n_by_path_probability_of_the_product(budget):
    dists = depth_dists(4)  # K = 3
    drafter = ParallelFake(dists)
    tree = ParallelSpecPlanner(k=3, budget=budget).plan(ROOT, drafter, ctx())
    assert tree.size == budget + 1
    assert paths(tree) == brute_force_top(dists, budget)
    assert drafter.calls == [min(3, budget - 1)]  # one pass, no more masks than the tree can use
    assert tree.stats.draft_decodes == 1
    for node in range(tree.size):
        children = tree.children(node)
        if children:
            assert tree.child_rule[node] == ChildRule.TOP
            dist = dists[tree.depth[node]]
            assert tree.dists[node] is dist
            # children: the top of their depth's ranking, in rank order
            assert [int(tree.tokens[c]) for c in children] == dist.ids[: len(children)].tolist()
    np.testing.assert_allclose(tree.stats.expected_accept, tree.path_prob[1:].sum())


def test_depth_is_at_most_k_plus_one_and_budget_is_capped_by_max_nodes():
    dists = depth_dists(3)
    tree = ParallelSpecPlanner(k=2, budget=200).plan(ROOT, ParallelFake(dists), ctx())
    assert tree.depth.max() == 3 and tree.size == 1 + 5 + 25 + 125  # the whole product tree
    small = ParallelSpecPlanner(k=2, budget=200).plan(ROOT, ParallelFake(dists), ctx(max_nodes=9))
    assert small.size == 9
    drafter = ParallelFake(dists)
    empty = ParallelSpecPlanner(k=2, budget=16).plan(ROOT, drafter, ctx(max_nodes=1))
    assert empty.size == 1 and drafter.calls == []  # no room: no draft pass at all


def test_sampling_children_are_draws_without_replacement_from_their_depth():
    dists = depth_dists(5)
    planner = ParallelSpecPlanner(k=4, budget=16)
    tree = planner.plan(ROOT, ParallelFake(dists), ctx(sampling=True, seed=7))
    again = planner.plan(ROOT, ParallelFake(dists), ctx(sampling=True, seed=7))
    other = planner.plan(ROOT, ParallelFake(dists), ctx(sampling=True, seed=8))
    assert tree.size == 17 and paths(tree) == paths(again) and paths(tree) != paths(other)
    step_seed = int(np.random.default_rng(7).integers(2**63))  # the planner's one draw from ctx.rng
    for node in range(tree.size):
        children = tree.children(node)
        if not children:
            continue
        dist = dists[tree.depth[node]]
        assert tree.child_rule[node] == ChildRule.SAMPLED and tree.dists[node] is dist
        # the verifier's contract: the children are the first draws of the node's own stream, in order
        order = draw_order(dist, step_seed, tree.path_tokens(node))
        assert [int(tree.tokens[c]) for c in children] == dist.ids[order[: len(children)]].tolist()


def test_mask_ids_are_never_proposed():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(3, 200)).astype(np.float32)
    masks = (150, 151, 152, 153)
    rows[:, masks] = 50.0  # the likeliest ids of every row
    for row, dist in zip(rows, draft_dists(rows, 8, 1.0, 200, exclude=masks)):
        # the same ranking with the masks taken out; probabilities of the full softmax
        allowed = [i for i in np.argsort(-row, kind="stable") if i not in masks][:8]
        assert dist.ids.tolist() == allowed
        softmax = np.exp(row.astype(np.float64) - row.max())
        np.testing.assert_allclose(dist.probs, softmax[allowed] / softmax.sum(), rtol=0, atol=1e-6)


# -- the mask step on the strict fake context ---------------------------------------------------------
MASKS = (44, 45, 46, 47)
PROMPT = [5, 17, 3, 29, 8, 40, 12]


def fake_pair(**kw) -> FakePair:
    pair = FakePair(**kw)
    pair.draft.mask_ids = MASKS
    return pair


GREEDY = SamplingParams()


def _tokens(pair, planner, sampling=GREEDY, max_tokens=60):
    request = Request(prompt=PROMPT, max_tokens=max_tokens, sampling=sampling)
    events = list(generate(pair, planner, request))
    return [t.id for e in events for t in e.tokens], events


def test_mask_step_returns_k_plus_one_rows_and_leaves_only_the_real_tokens():
    pair = fake_pair()
    draft = pair.draft
    draft.sync(PROMPT)
    draft.pending = [PROMPT[-1], 9, 21]  # the old root, an accepted token, the new root
    draft.begin_step(0.0)
    tree = TreeBuilder(21)
    before = draft.ctx.decodes
    dists = draft.parallel_dists(tree, 4)
    assert len(dists) == 5 and draft.decodes == 1 and draft.ctx.decodes == before + 1
    assert draft.ctx.batch_sizes[-1] == 3 + 4  # the pending tokens and the masks, in one batch
    assert draft.committed == PROMPT + [9, 21] and draft.pending == []
    view = draft.ctx.committed_view()  # no mask cell left: exactly the committed tokens
    assert [(pos, tok) for pos, tok, _ in view] == list(enumerate(draft.committed))
    # the rows: the last real token's, then each mask's (seeing the masks before it)
    seen = tuple(draft.committed)
    for i, dist in enumerate(dists):
        expected = draft_dists(draft.ctx.model.logits(seen + MASKS[:i])[None, :], 8, 1.0, 48, MASKS)[0]
        np.testing.assert_array_equal(dist.ids, expected.ids)
        assert not set(dist.ids.tolist()) & set(MASKS)


@pytest.mark.parametrize("k,budget", [(4, 16), (2, 8), (1, 3)])
def test_greedy_output_equals_plain_decoding_with_one_draft_pass_per_step(k, budget):
    plain, _ = _tokens(FakePair(), None)
    pair = fake_pair(n_seq=33)
    tokens, events = _tokens(pair, ParallelSpecPlanner(k=k, budget=budget))
    assert tokens == plain
    steps = [e for e in events if e.verified_nodes > 1]
    assert steps and all(e.draft_decodes == 1 for e in steps)
    assert all(e.depth <= k + 1 for e in steps)
    assert sum(e.accepted for e in events) > 0
    for runner in (pair.target, pair.draft):  # every cell committed, no mask or branch left behind
        view = runner.ctx.committed_view()
        assert [(pos, tok) for pos, tok, _ in view] == list(enumerate(runner.committed))


def test_sampling_runs_on_the_engine():
    pair = fake_pair(n_seq=33)
    params = SamplingParams(temperature=0.9, seed=3)
    tokens, events = _tokens(pair, ParallelSpecPlanner(k=4, budget=16), params, max_tokens=40)
    again, _ = _tokens(fake_pair(n_seq=33), ParallelSpecPlanner(k=4, budget=16), params, max_tokens=40)
    assert len(tokens) == 40 and tokens == again
    assert all(e.draft_decodes == 1 for e in events if e.verified_nodes > 1)


def test_the_draft_without_masks_says_so():
    pair = FakePair()
    pair.draft.sync(PROMPT)
    pair.draft.begin_step(0.0)
    with pytest.raises(ValueError, match="masks"):
        pair.draft.parallel_dists(TreeBuilder(PROMPT[-1]), 4)


def test_depth_acceptance_counts_how_deep_accepted_paths_go():
    from edgespec.decoding.events import StepEvent, StepTimings
    from tests.support.scripts import load

    DepthAcceptance = load("depths").DepthAcceptance  # scripts/depths.py: a dev tool, not in the package

    chain = TreeBuilder(1)
    chain.add(chain.add(chain.add(0, 2, 0.5), 3, 0.5), 4, 0.5)
    tree = chain.freeze()
    result = DepthAcceptance()
    for accepted in (0, 1, 2, 2):
        result.add(
            StepEvent((), "", 3, accepted, StepTimings(), tree=tree, draft_decodes=1, committed=accepted + 1)
        )
    assert result.rates() == [0.75, 0.5, 0.0]  # depth 3 was drafted every step, never reached
    assert result.conditional() == [0.75, 2 / 3, 0.0]
    summary = result.as_dict()
    assert summary["mal"] == 2.25 and summary["draft_passes_per_step"] == 1.0
