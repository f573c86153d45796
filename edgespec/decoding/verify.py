"""Verification rules: which drafted tokens the target accepts. Pure functions, no model.

Both walk the tree from the root. At a node u the target's distribution over the next token is
known (one row of the verify batch); the rule either moves to one child of u (an accepted draft
token) or stops and emits one token of its own choosing (the correction, or the bonus token when u
is a leaf). Either way every step emits at least one token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..planner.tree import ChildRule, DraftTree
from .sampling import sample


@dataclass(frozen=True)
class Verdict:
    path: tuple[int, ...]  # accepted tree nodes, root first (the root is always "accepted")
    next_token: int  # the target's own token after the last accepted node: the new pending root

    @property
    def accepted(self) -> int:
        """Draft tokens accepted (the root is not a draft token)."""
        return len(self.path) - 1


def verify_greedy(tree: DraftTree, argmax_at: Callable[[int], int]) -> Verdict:
    """Greedy longest match: follow the child whose token is the target's argmax, while one exists.

    Every emitted token is the target's argmax given the accepted path, so the output is exactly
    what plain greedy decoding would produce from the same logits (except below a ``LONGEST`` node).
    """

    def step(node: int) -> tuple[int | None, int]:
        best = argmax_at(node)
        return next((c for c in tree.children(node) if tree.token_ids[c] == best), None), best

    return _walk(tree, [0], step)


def verify_sampling(
    tree: DraftTree, target_p_at: Callable[[int], np.ndarray], rng: np.random.Generator
) -> Verdict:
    """Lossless multi-branch rejection sampling: the emitted tokens are distributed exactly as if
    the target had sampled them one by one (except below a ``LONGEST`` node).

    ``target_p_at(u)`` is the target's (temperature / top-k / top-p) distribution after node u.
    Children are tried in the order they were drafted, with the rule matching how they were chosen.
    """

    def step(node: int) -> tuple[int | None, int | None]:
        p = target_p_at(node).copy()
        children = tree.children(node)
        if children and tree.child_rules[node] == ChildRule.SAMPLED:
            accepted = _residual_rule(tree, node, children, p, rng)
        elif children:
            accepted = _one_hot_rule(tree, children, p, rng)
        else:
            accepted = None
        # Every child rejected (or a leaf): sample from what is left of p — the residual.
        return accepted, sample(p, rng) if accepted is None else None

    return _walk(tree, [0], step)


def _walk(tree: DraftTree, path: list[int], step: Callable[[int], tuple[int | None, int | None]]) -> Verdict:
    """Walk down from ``path[-1]``: ``step(node)`` gives the accepted child, or None and the token to emit.

    At a ``LONGEST`` node (mcsd-target-init, Lu et al. 2024 §3.1) the children are the target's own
    candidates: each one's subtree is verified by the rules above and the longest accepted path wins
    (ties: the earlier child, the target's likelier token). That choice is what makes it lossy.
    """
    while True:
        node = path[-1]
        if tree.child_rules[node] == ChildRule.LONGEST:
            branches = [_walk(tree, [*path, child], step) for child in tree.children(node)]
            return max(branches, key=lambda verdict: len(verdict.path))  # max keeps the first of equals
        accepted, token = step(node)
        if accepted is None:
            assert token is not None  # a step that accepts no child names the token to emit
            return Verdict(tuple(path), int(token))
        path.append(accepted)


def _residual_rule(
    tree: DraftTree, node: int, children: Sequence[int], p: np.ndarray, rng: np.random.Generator
) -> int | None:
    """Children x_1, x_2, … were drawn from q without replacement (SpecInfer; DySpec Alg. 3).

    Try x_i: accept with probability min(1, p(x_i) / q(x_i)). On rejection the target's residual
    becomes p ← norm(max(p − q, 0)), and x_i leaves q: q(x_i) ← 0, q ← norm(q) — the distribution
    the next child was actually drawn from. ``p`` is updated in place.
    """
    dist = tree.dists[node]
    q_ids = dist.ids
    q = dist.sampling_q().copy()
    for child in children:
        token = tree.token_ids[child]
        slot = np.flatnonzero(q_ids == token)
        if slot.size == 0 or q[slot[0]] <= 0.0:
            raise ValueError(f"node {child}: token {token} was not drawn from its parent's q (planner bug)")
        q_x = q[slot[0]]
        if rng.random() * q_x < p[token]:  # u < p(x)/q(x)  ⇔  accept with min(1, p/q)
            return child
        residual = p.copy()
        residual[q_ids] = np.maximum(p[q_ids] - q, 0.0)
        if residual.sum() > 0.0:  # zero only when p == q up to rounding; then keep p as it is
            p[:] = residual / residual.sum()
        q[slot[0]] = 0.0
        if q.sum() <= 0.0:
            return None
        q /= q.sum()
    return None


def _one_hot_rule(
    tree: DraftTree, children: Sequence[int], p: np.ndarray, rng: np.random.Generator
) -> int | None:
    """Children were chosen deterministically (the draft's top candidates): q = δ(x).

    Try x: accept with probability p(x); on rejection remove x from p and renormalise — the residual
    rule with a one-hot q. ``p`` is updated in place.
    """
    for child in children:
        token = tree.token_ids[child]
        if rng.random() < p[token]:
            return child
        p[token] = 0.0  # reached only when p(x) < 1, so something is left to renormalise
        p /= p.sum()
    return None
