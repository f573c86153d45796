"""Copying from the conversation without a model: the incremental n-gram index against brute force,
the copy trie and its p̂, learning the acceptance rates, and the ``ngram`` / ``hybrid`` planners."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.events import StepEvent, StepTimings
from edgespec.planner.copy_drafts import HybridPlanner, NGramPlanner
from edgespec.planner.costmodel import CostModel
from edgespec.planner.inputs import PlanContext
from edgespec.planner.ngram import AGREE_BINS, Copier, CopyTrie, NGramIndex, common_prefix, prior_rate
from edgespec.planner.tree import ChildRule
from tests.support.fakes import SyntheticDrafter, sparse
from tests.unit.test_planners import check_tree


def ctx(history, fresh=True, max_nodes=256, sampling=False) -> PlanContext:
    return PlanContext(
        sampling=sampling, rng=np.random.default_rng(0), max_nodes=max_nodes, history=history, fresh=fresh
    )


def rebuilt(tokens, n_max=4) -> NGramIndex:
    index = NGramIndex(n_max)
    for t in tokens:
        index.append(t)
    return index


def brute_matches(tokens, root, n_max, n_min, limit):
    """Reference: for n from long to short, every earlier end of the suffix's last n tokens, newest first."""
    context = [*tokens, root]
    found, taken = [], set()
    for n in range(min(n_max, len(context)), n_min - 1, -1):
        suffix = context[-n:]
        for end in range(len(tokens), n - 1, -1):  # the n-gram tokens[end-n:end] continues at `end`
            if tokens[end - n : end] == suffix and end < len(tokens) and end not in taken:
                taken.add(end)
                found.append((end, n))
    return found[:limit]


# -- the index ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_matches_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4 + seed, size=120).tolist()  # a small vocabulary: many repeats
    index = rebuilt(tokens, n_max=5)
    for root in range(4 + seed):
        assert index.matches(root, 7) == brute_matches(tokens, root, 5, 1, 7)


def test_longest_match_first_then_newest():
    tokens = [1, 2, 3, 9, 5, 2, 3, 8, 6, 3, 7, 1, 2]
    index = rebuilt(tokens, n_max=4)
    # root 3: "1 2 3" occurred once (→ 9), "2 3" once more (→ 8), "3" once more (→ 7)
    assert index.matches(3, 10) == [(3, 3), (7, 2), (10, 1)]
    assert index.matches(3, 2) == [(3, 3), (7, 2)]
    assert index.matches(42, 10) == []


@pytest.mark.parametrize("seed", range(4))
def test_truncate_undoes_appends_exactly(seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 5, size=80).tolist()
    index = rebuilt(tokens)
    for length in (70, 31, 31, 4, 0):
        index.truncate(length)
        reference = rebuilt(tokens[:length])
        assert index.tokens == reference.tokens and index.ends == reference.ends


def test_sync_appends_only_the_new_tokens_within_a_request():
    index = NGramIndex(4)
    history = list(range(5000))
    index.sync(history, fresh=True)
    calls = []
    original = index.append
    index.append = lambda t: (calls.append(t), original(t))
    history += [7, 8, 9]
    index.sync(history, fresh=False)
    assert calls == [7, 8, 9]  # O(new tokens): no rescan of the 5000 before


def test_a_new_request_keeps_the_common_prefix():
    index = NGramIndex(4)
    first = [1, 2, 3, 4, 5, 6, 1, 2]
    index.sync(first, fresh=True)
    second = [1, 2, 3, 4, 9, 9, 1, 2, 3]  # an edited conversation: differs from position 4 on
    index.sync(second, fresh=True)
    reference = rebuilt(second)
    assert index.tokens == second and index.ends == reference.ends
    assert common_prefix(first, second) == 4 and common_prefix(second, second[:3]) == 3


def test_each_token_adds_at_most_n_max_entries():
    index = NGramIndex(6)
    for i, t in enumerate(np.random.default_rng(1).integers(0, 3, size=200).tolist()):
        before = sum(len(v) for v in index.ends.values())
        index.append(t)
        assert sum(len(v) for v in index.ends.values()) - before == min(6, i + 1)


# -- the copy trie -----------------------------------------------------------------------------------
def test_longer_matches_dominate_and_shorter_ones_branch():
    trie = CopyTrie([0])
    trie.add_chain([5, 6, 7], match_len=4)  # a long match
    trie.add_chain([8, 9], match_len=1)  # two short ones
    trie.add_chain([5, 4], match_len=1)
    rates = prior_rate(np.arange(24))
    trie.estimate(rates)
    five, eight = trie.kids[0][5], trie.kids[0][8]
    assert trie.weight[five] == 4.0**4 + 4.0 and trie.agree[five] == 4
    assert trie.share[five] > 0.98 and trie.share[eight] < 0.02
    assert trie.q[five] == pytest.approx(rates[4] * trie.share[five])
    six = trie.kids[five][6]
    assert trie.agree[six] == 5  # one more token of context agrees below the first copy
    assert trie.phat[six] == pytest.approx(trie.phat[five] * trie.q[six])
    assert np.all(trie.phat[1:] <= trie.phat[np.asarray(trie.parents[1:])])
    keep = trie.best(3)
    assert set(keep.tolist()) == {five, six, trie.kids[six][7]}  # the top p̂ form a subtree


def test_a_match_as_long_as_n_max_counts_its_true_length():
    # A 12-token passage, other text, then the passage again up to its 10th token (the root): the
    # index matches n_max = 4 tokens, and the context agrees on all 10.
    passage = list(range(10, 22))
    history = [*passage, 99, 98, *passage[:9]]
    trie = Copier(n_max=4).propose(passage[9], ctx(history))
    first = trie.kids[0][passage[10]]
    assert trie.agree[first] == 10 and trie.agree[trie.kids[first][passage[11]]] == 11
    short = Copier(n_max=4).propose(99, ctx([3, 7, 99, 98, 4, 7]))  # a 2-token match stays 2
    assert short.agree[short.kids[0][98]] == 2
    endless = [1, 2] * 40  # the extension stops at AGREE_BINS
    assert Copier(n_max=4).propose(1, ctx(endless)).agree[1] == AGREE_BINS


def test_copies_stop_before_the_end_of_a_turn():
    # A prompt that ends in "… 7 8 9 <end> <start> 50 51" (the template's markers around the answer's
    # header) and an answer that repeats "7 8": the copy is "9" — never the markers nor what follows.
    end, start = 100, 101
    history = [3, 7, 8, 9, end, start, 50, 51, 4, 7]
    copier = Copier(n_max=4)
    with_turns = PlanContext(
        sampling=False, rng=np.random.default_rng(0), history=history, turn_tokens=frozenset({end, start})
    )
    trie = copier.propose(8, with_turns)
    assert trie.tokens[1:] == [9]
    unaware = copier.propose(8, ctx(history))  # without the turn tokens the chain runs on
    assert unaware.tokens[1:5] == [9, end, start, 50]
    # a match whose continuation starts with a turn token adds nothing
    assert copier.propose(9, with_turns).size == 1



def test_observe_learns_the_rate_of_tested_copies():
    copier = Copier(n_max=4)
    history = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2]
    trie = copier.propose(3, ctx(history))
    tree = copier.copy_tree(trie, trie.best(4))
    before = copier.rates.copy()
    copier.observe(tree, (0, 1, 2))  # two copies accepted, the third one tested and rejected
    after = copier.rates
    agree = [min(trie.agree[int(n)], AGREE_BINS - 1) for n in trie.best(4)]
    assert after[agree[0]] > before[agree[0]] and after[agree[2]] < before[agree[2]]
    untested = [a for a in range(AGREE_BINS) if a not in agree]  # they fade alike: equal up to rounding
    assert np.all(after[untested] <= before[untested] + 1e-12)
    copier.observe(tree, (0,))  # the same tree again: already learned from
    assert np.array_equal(copier.rates, after)


# -- planners ----------------------------------------------------------------------------------------
class NoDrafter:
    def expand(self, tree, nodes):
        raise AssertionError("the ngram planner must not call the draft")


REPEAT = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]  # the root 4 continues "1 2 3" as before: 4 5 6 7 8


@pytest.mark.parametrize("sampling", [False, True])
def test_ngram_planner_copies_the_continuation(sampling):
    planner = NGramPlanner(budget=16, ngram_max=4)
    tree = planner.plan(4, NoDrafter(), ctx(REPEAT, sampling=sampling))
    check_tree(tree, 256)
    assert tree.path_tokens(int(np.argmax(tree.depth)))[:5] == [4, 5, 6, 7, 8]
    assert tree.copied[1:].all() and tree.stats.draft_decodes == 0
    assert set(tree.child_rule[tree.child_rule > 0].tolist()) == {ChildRule.TOP}  # one-hot, also sampling
    assert planner.plan(42, NoDrafter(), ctx(REPEAT)).size == 1  # never seen: plain decoding


def test_ngram_size_follows_the_cost_curves():
    cheap = CostModel.from_functions(lambda n: 1.0 + 0.01 * n, lambda n: 0.5)  # memory-bound: width is free
    dear = CostModel.from_functions(lambda n: float(n), lambda n: 0.5)  # compute-bound: no batch pays
    history = [3, 1, 2, 7, 7, 7, 3, 1, 2, 8, 3, 1, 2, 9, 3, 1]
    wide = NGramPlanner(budget=16, ngram_max=4, costs=cheap).plan(2, NoDrafter(), ctx(history))
    none = NGramPlanner(budget=16, ngram_max=4, costs=dear).plan(2, NoDrafter(), ctx(history))
    assert wide.size > 3 and len(wide.children(0)) == 3  # all three continuations of "3 1 2"
    assert none.size == 1


def test_hybrid_skips_the_draft_where_copies_cover_the_root():
    long_repeat = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10] * 3 + [1, 2, 3]
    drafter = SyntheticDrafter.random(vocab=12, top_k=4, seed=1)
    tree = HybridPlanner(budget=12, ngram_max=4, mu=0.3).plan(4, drafter, ctx(long_repeat))
    check_tree(tree, 256)
    assert drafter.decodes == 0 and tree.copied[1:].all()
    assert tree.path_tokens(int(np.argmax(tree.depth)))[:4] == [4, 5, 6, 7]


def test_hybrid_merges_a_token_both_sources_propose():
    # The draft's top token after the root (7) is 20 with q 0.6; the conversation also continued 7 with 20.
    drafter = SyntheticDrafter(lambda path: sparse([0.6, 0.3, 0.1], ids=[20, 21, 22]))
    history = [5, 7, 20, 1]
    planner = HybridPlanner(budget=8, ngram_max=2, mu=0.01, max_depth=2)
    tree = planner.plan(7, drafter, ctx(history))
    check_tree(tree, 256)
    twenty = [c for c in tree.children(0) if tree.tokens[c] == 20]
    assert len(twenty) == 1  # one node, reached both ways
    node = twenty[0]
    q_copy = planner.copier.rates[1]  # a single match of length 1: share 1
    assert tree.draft_prob[node] == pytest.approx(1 - (1 - 0.6) * (1 - q_copy))
    assert tree.copied[node] and drafter.decodes >= 1
    assert {int(tree.tokens[c]) for c in tree.children(0)} >= {20, 21}  # the draft's other candidates too


def test_hybrid_without_copies_is_a_draft_tree():
    drafter = SyntheticDrafter.random(vocab=30, top_k=6, seed=3)
    tree = HybridPlanner(budget=10).plan(7, drafter, ctx([1, 2, 3]))
    check_tree(tree, 256)
    assert tree.size == 11 and not tree.copied.any() and drafter.decodes >= 2


def test_planners_learn_through_observe():
    planner = NGramPlanner(budget=8, ngram_max=4)
    tree = planner.plan(4, NoDrafter(), ctx(REPEAT))
    before = planner.copier.rates.copy()
    path = tuple(tree.path(int(np.argmax(tree.depth))))
    event = StepEvent(
        tokens=(),
        text="",
        drafted=tree.size - 1,
        accepted=len(path) - 1,
        timings=StepTimings(),
        tree=tree,
        accepted_path=path,
    )
    planner.observe(event)
    assert (planner.copier.rates >= before).all() and (planner.copier.rates > before).any()
