"""The best-first growth OPT-Tree, `hybrid` and `auto` share (planner/growth.py): its work tree, its
loop, and the top nodes by p̂ forming a subtree whatever the policy expanded."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.planner.growth import Growth, admit_top, grow
from edgespec.planner.tree import ChildRule, TreeBuilder
from tests.support.fakes import SyntheticDrafter, sparse


class BestFirst:
    """A minimal policy: expand the w best unexpanded nodes for ``levels`` levels, keep the top m."""

    def __init__(self, w: int, levels: int, m: int, k: int = 3):
        self.w, self.levels, self.m, self.k = w, levels, m, k

    def next_level(self, growth: Growth) -> list[int]:
        if not growth.levels:
            return [0]
        return growth.candidates()[: self.w] if len(growth.levels) < self.levels else []

    def admit(self, growth, nodes, dists) -> None:
        admit_top(growth, nodes, dists, self.k)

    def keep(self, growth: Growth) -> list[int]:
        return sorted(growth.ranked()[: self.m])


@pytest.mark.parametrize("seed", range(6))
def test_the_top_nodes_by_phat_form_a_subtree_and_copy_out_whole(seed):
    drafter = SyntheticDrafter.random(vocab=20, top_k=5, seed=seed, sharpness=1.0 + seed)
    growth = Growth.from_root(7)
    keep = grow(drafter, growth, BestFirst(w=3, levels=4, m=9))
    assert growth.levels == [len(call) for call in drafter.calls] and drafter.tree is growth.tree
    assert set(growth.tree.parents[u] for u in keep) <= set(keep) | {0}  # closed under parents
    phat = np.asarray(growth.tree.path_prob)
    assert sorted(phat[keep]) == pytest.approx(sorted(phat[1:])[-9:])
    out = TreeBuilder(7)
    at = growth.copy_into(keep, out)
    tree = out.freeze()
    assert tree.size == 10 and sorted(at) == [0, *keep]
    for old, new in at.items():
        assert tree.path_tokens(new) == growth.tree.path_tokens(old)
        assert tree.path_prob[new] == pytest.approx(growth.tree.path_prob[old])
        if tree.children(new):
            assert tree.child_rule[new] == ChildRule.TOP and new in tree.dists
    for node in range(tree.size):  # siblings keep the rank order the one-hot rule tries them in
        q = [tree.draft_prob[c] for c in tree.children(node)]
        assert q == sorted(q, reverse=True)


def test_a_new_q_carries_down_the_subtree():
    growth = Growth.from_root(1)
    a = growth.add(0, 5, 0.5, copied=True)
    b = growth.add(a, 6, 0.8, copied=True)
    c = growth.add(0, 9, 0.3)
    d = growth.add(b, 7, 0.5, copied=True)
    assert growth.child(0, 5) == a and growth.child(a, 6) == b and growth.child(a, 42) is None
    growth.set_q(a, 0.9)  # the draft proposed it too: both sources' evidence
    assert growth.tree.path_prob[b] == pytest.approx(0.72) and growth.tree.path_prob[d] == pytest.approx(0.36)
    assert growth.tree.path_prob[c] == pytest.approx(0.3)  # not below a: untouched
    assert growth.ranked() == [a, b, d, c]


def test_admission_keeps_each_nodes_likeliest_tokens_with_q_above_zero():
    dist = sparse([0.6, 0.3, 0.0, 0.1], ids=[4, 5, 6, 7])
    for k, kept in [(2, [4, 5]), (4, [4, 5, 7])]:  # 6 has q = 0
        growth = Growth.from_root(1)
        admit_top(growth, [0], [dist], k)
        assert [growth.tree.tokens[u] for u in growth.added] == kept
