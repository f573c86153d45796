"""Verification rules on synthetic distributions: greedy longest match, and that multi-branch
rejection sampling emits exactly the target's distribution (seeded statistical tests)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.verify import verify_greedy, verify_sampling
from edgespec.planner.inputs import sample_without_replacement
from edgespec.planner.tree import ChildRule, SparseDist, TreeBuilder

V = 6
TARGET = np.array([0.35, 0.25, 0.2, 0.1, 0.07, 0.03])
DRAFT = np.array([0.1, 0.4, 0.05, 0.3, 0.1, 0.05])  # deliberately unlike the target
SAMPLES = 60_000  # σ of a frequency ≤ 0.002: a 1 % error is ≥ 5σ


def _dist(probs: np.ndarray) -> SparseDist:
    order = np.argsort(-probs, kind="stable")
    return SparseDist(ids=order.astype(np.int32), probs=probs[order])


def _target_second(first: int) -> np.ndarray:
    """The target's distribution of the second token, given the first."""
    return np.roll(TARGET, first)


_TREES: dict = {}


def _tree(rng, rule: ChildRule, k: int, depth2: bool):
    """A fresh draft tree: children sampled from q without replacement (SAMPLED) or the top ones."""
    draft, second = _dist(DRAFT), _dist(np.roll(DRAFT, 1))
    sampled = rule == ChildRule.SAMPLED
    picks = tuple(sample_without_replacement(draft, k, rng)) if sampled else tuple(range(k))
    picks2 = tuple(tuple(sample_without_replacement(second, 2, rng)) if sampled else (0, 1) for _ in picks)
    key = (rule, picks, picks2 if depth2 else ())
    if key not in _TREES:  # the same shapes recur; building them once keeps the test fast
        tree = TreeBuilder(root_token=99)
        tree.dists[0] = draft
        tree.set_children_rule(0, rule)
        for j, js in zip(picks, picks2):
            child = tree.add(0, int(draft.ids[j]), float(draft.probs[j]))
            if depth2:
                tree.dists[child] = second
                tree.set_children_rule(child, rule)
                for j2 in js:
                    tree.add(child, int(second.ids[j2]), float(second.probs[j2]))
        _TREES[key] = tree.freeze()
    return _TREES[key]


def _target_at(tree):
    def p(node: int) -> np.ndarray:
        if node == 0:
            return TARGET
        return _target_second(int(tree.tokens[node]))

    return p


@pytest.mark.slow
@pytest.mark.parametrize("rule", [ChildRule.SAMPLED, ChildRule.TOP])
@pytest.mark.parametrize("k", [1, 3])
def test_first_token_follows_the_target(rule, k):
    rng = np.random.default_rng(1234)
    counts = np.zeros(V)
    for _ in range(SAMPLES):
        tree = _tree(rng, rule, k, depth2=False)
        verdict = verify_sampling(tree, _target_at(tree), rng)
        first = int(tree.tokens[verdict.path[1]]) if len(verdict.path) > 1 else verdict.next_token
        counts[first] += 1
    assert np.abs(counts / SAMPLES - TARGET).max() < 0.006


@pytest.mark.slow
@pytest.mark.parametrize("rule", [ChildRule.SAMPLED, ChildRule.TOP])
def test_two_tokens_follow_the_target_jointly(rule):
    rng = np.random.default_rng(99)
    counts = np.zeros((V, V))
    for _ in range(SAMPLES):
        tree = _tree(rng, rule, 2, depth2=True)
        verdict = verify_sampling(tree, _target_at(tree), rng)
        emitted = [int(tree.tokens[n]) for n in verdict.path[1:]] + [verdict.next_token]
        if len(emitted) < 2:  # the first token was the target's own: draw the second as it would
            emitted.append(int(rng.choice(V, p=_target_second(emitted[0]))))
        counts[emitted[0], emitted[1]] += 1
    joint = TARGET[:, None] * np.stack([_target_second(a) for a in range(V)])
    assert np.abs(counts / SAMPLES - joint).max() < 0.006


def test_sampling_rejects_a_wrong_rule():
    """A residual rule applied to a token its q never proposed is a planner bug, not silent loss."""
    tree = TreeBuilder(root_token=1)
    tree.dists[0] = _dist(DRAFT)
    tree.set_children_rule(0, ChildRule.SAMPLED)
    tree.add(0, 7, 0.5)  # token 7 is not in q
    frozen = tree.freeze()
    with pytest.raises(ValueError, match="planner bug"):
        verify_sampling(frozen, lambda node: np.ones(8) / 8, np.random.default_rng(0))


def test_greedy_longest_match():
    tree = TreeBuilder(root_token=0)
    a = tree.add(0, 3, 0.5)
    tree.add(0, 4, 0.3)
    b = tree.add(a, 1, 0.5)
    tree.add(b, 2, 0.5)
    frozen = tree.freeze()
    argmax = {0: 3, a: 1, b: 5}
    verdict = verify_greedy(frozen, lambda node: argmax[node])
    assert verdict.path == (0, a, b) and verdict.next_token == 5 and verdict.accepted == 2
    verdict = verify_greedy(frozen, lambda node: 9)
    assert verdict.path == (0,) and verdict.next_token == 9
