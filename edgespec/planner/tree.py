"""The data every planner produces and every engine consumes.

A draft tree is rooted at the *pending* token: the token the target chose last, which neither model
has decoded yet. Node 0 is that root; every other node is a drafted token. Parents come before
children (``parents[i] < i``), so a tree can be packed into one llama.cpp batch in index order.

The children of a node are listed in the order they were chosen. That order matters for lossless
verification of several branches: the verifier tries them one after the other.

``Planner``, the base of the strategies that grow these trees, is here too; what a planner is given
(the drafter, the step's context, the pair's profile) is in ``inputs.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import overload

import numpy as np


class ChildRule(IntEnum):
    """How the children of a node were chosen; decides the verification rule that keeps it lossless."""

    NONE = 0  # not expanded (a leaf)
    TOP = 1  # deterministic (top-k of the draft): one-hot rule — accept x with p(x), else p[x] = 0
    SAMPLED = 2  # sampled without replacement from q: residual rule — accept with min(1, p/q)
    LONGEST = 3  # the target's own candidates (mcsd-target-init): keep the one whose subtree is accepted
    # longest — LOSSY: which token is emitted then depends on how well the draft continues it


class SparseDist:
    """The draft's next-token distribution, kept to its top candidates: ``ids`` ((k,) int32 token ids,
    most likely first) and ``probs`` ((k,) float64, descending; read-only).

    ``probs`` are probabilities under the full softmax (so they sum to at most 1), sorted in
    descending order. When the draft *samples*, it samples from ``q = probs / probs.sum()`` — the
    truncated distribution — and the verifier uses that same q, which keeps rejection sampling
    exactly lossless (any draft distribution is fine as long as both sides use the same one).
    """

    __slots__ = ("ids", "probs")

    def __init__(self, ids: np.ndarray, probs: np.ndarray):
        self.ids, self.probs = ids, probs

    def sampling_q(self) -> np.ndarray:
        """q: the distribution the draft samples from (the truncated, renormalised softmax)."""
        return self.probs / self.probs.sum()

    def prob_of(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0


@dataclass(frozen=True)
class PlanStats:
    """What planning cost and what it expects; exposed per step in ``generate --json``."""

    draft_decodes: int = 0  # batched draft decodes (one per level)
    drafted_nodes: int = 0  # nodes the draft model actually evaluated
    merges: int = 0  # GSD: τ-redundant nodes merged into an earlier occurrence
    expected_accept: float = 0.0  # E[A] = Σ p̂ over drafted nodes (predicted accepted draft tokens)


class _Column:
    """A ``DraftTree`` column as a numpy array (dtype ``dtype``), built from its tuple ``source`` on first
    read and kept in the instance, where later reads find it (a non-data descriptor)."""

    def __init__(self, source: str, dtype):
        self.source, self.dtype = source, dtype

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, tree: None, owner: type | None = None) -> _Column: ...
    @overload
    def __get__(self, tree: DraftTree, owner: type | None = None) -> np.ndarray: ...
    def __get__(self, tree: DraftTree | None, owner: type | None = None) -> _Column | np.ndarray:
        if tree is None:  # read on the class: the descriptor itself
            return self
        array = np.asarray(getattr(tree, self.source), dtype=self.dtype)
        tree.__dict__[self.name] = array  # past the frozen dataclass's __setattr__: a cache, not a field
        return array


@dataclass(frozen=True)
class DraftTree:
    """A planner's finished tree. Its columns are tuples of Python numbers — what the step's bookkeeping
    reads between decodes — with numpy arrays of them built on first use (``tokens``, ``parents``, …)
    for the planners and verifiers that compute on whole columns.

    Why both: on a CPU each decode streams the model's weights through the caches and the code after it
    runs cold; there a numpy scalar read or a small reduction costs tens of µs (``depth.max()`` measured
    70 µs right after a target decode, against ~1 µs warm), a tuple read well under one."""

    token_ids: tuple[int, ...]  # token_ids[0] is the pending root token
    parent_ids: tuple[int, ...]  # parent_ids[0] == -1, parent_ids[i] < i
    depths: tuple[int, ...]  # depths[0] == 0
    draft_probs: tuple[float, ...]  # q(token | path to parent) under the draft; 1.0 at the root
    path_probs: tuple[float, ...]  # p̂ = product of draft_prob along the path (root: 1.0)
    merged_flags: tuple[bool, ...]  # GSD: node replicated from a merged subtree, not drafted again
    copied_flags: tuple[bool, ...]  # proposed by copying from the conversation (n-gram match), not the draft
    child_rules: tuple[int, ...]  # ChildRule of each node's children
    dists: dict[int, SparseDist]  # the draft distribution at each expanded node (for the residual rule)
    stats: PlanStats = field(default_factory=PlanStats)
    _children: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        children: list[list[int]] = [[] for _ in self.parent_ids]
        for node in range(1, len(self.parent_ids)):
            children[self.parent_ids[node]].append(node)
        object.__setattr__(self, "_children", tuple(tuple(c) for c in children))

    # The columns as arrays, built once each on first use.
    tokens = _Column("token_ids", np.int32)
    parents = _Column("parent_ids", np.int32)
    depth = _Column("depths", np.int32)
    draft_prob = _Column("draft_probs", np.float64)
    path_prob = _Column("path_probs", np.float64)
    merged = _Column("merged_flags", bool)
    copied = _Column("copied_flags", bool)
    child_rule = _Column("child_rules", np.int8)

    @property
    def size(self) -> int:
        return len(self.token_ids)

    @property
    def height(self) -> int:
        """The deepest node's depth (0 for the root alone)."""
        return max(self.depths)

    def children(self, node: int) -> tuple[int, ...]:
        """Children of ``node`` in the order they were chosen."""
        return self._children[node]

    @property
    def leaves(self) -> list[int]:
        return [node for node, children in enumerate(self._children) if not children]

    def path(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive."""
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = self.parent_ids[node]
        return nodes[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.token_ids[i] for i in self.path(node)]


class TreeBuilder:
    """Mutable tree that planners grow; ``freeze()`` gives the immutable ``DraftTree``."""

    def __init__(self, root_token: int):
        self.tokens: list[int] = [int(root_token)]
        self.parents: list[int] = [-1]
        self.depth: list[int] = [0]
        self.draft_prob: list[float] = [1.0]
        self.path_prob: list[float] = [1.0]
        self.merged: list[bool] = [False]
        self.copied: list[bool] = [False]
        self.child_rule: list[int] = [ChildRule.NONE]
        self.dists: dict[int, SparseDist] = {}

    @property
    def size(self) -> int:
        return len(self.tokens)

    def add(
        self, parent: int, token: int, draft_prob: float, *, merged: bool = False, copied: bool = False
    ) -> int:
        """Append a child of ``parent``; p̂(child) = p̂(parent) · q(token)."""
        if not 0 <= parent < self.size:
            raise ValueError(f"parent {parent} is not a node of this tree (size {self.size})")
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.depth.append(self.depth[parent] + 1)
        self.draft_prob.append(float(draft_prob))
        self.path_prob.append(self.path_prob[parent] * float(draft_prob))
        self.merged.append(bool(merged))
        self.copied.append(bool(copied))
        self.child_rule.append(ChildRule.NONE)
        return self.size - 1

    def set_children_rule(self, node: int, rule: ChildRule) -> None:
        self.child_rule[node] = int(rule)

    def path_tokens(self, node: int) -> list[int]:
        out = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]

    def freeze(self, stats: PlanStats | None = None) -> DraftTree:
        return DraftTree(
            token_ids=tuple(self.tokens),
            parent_ids=tuple(self.parents),
            depths=tuple(self.depth),
            draft_probs=tuple(self.draft_prob),
            path_probs=tuple(self.path_prob),
            merged_flags=tuple(self.merged),
            copied_flags=tuple(self.copied),
            child_rules=tuple(self.child_rule),
            dists=dict(self.dists),
            stats=stats or PlanStats(),
        )


def chain_tree(tokens: Sequence[int]) -> DraftTree:
    """A tree that is one chain: ``tokens[0]`` the root, each next token the child of the one before
    (to time or check verification of a given continuation)."""
    tree = TreeBuilder(tokens[0])
    node = 0
    for token in tokens[1:]:
        node = tree.add(node, token, 1.0)
    return tree.freeze()
