"""A synthetic draft model for planner tests: the ``Drafter`` protocol without llama.cpp.

``SyntheticDrafter`` turns the token path of a node into a ``SparseDist`` with any deterministic
function, counts what a planner asks of it (batched decodes, evaluated nodes) and enforces the
protocol: every node's parent must have been expanded by an *earlier* call, and no node twice.

    drafter = SyntheticDrafter.random(vocab=40, top_k=6, seed=3)      # full-path "language model"
    drafter = SyntheticDrafter.random(vocab=12, context=1)            # bigram: n-grams repeat a lot
    drafter = SyntheticDrafter(lambda path: my_dist(path))            # anything else
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import numpy as np

from edgespec.planner.tree import SparseDist, TreeBuilder

DistFn = Callable[[tuple[int, ...]], SparseDist]


def sparse(
    probs: Sequence[float] | np.ndarray, ids: Sequence[int] | None = None, top_k: int | None = None
) -> SparseDist:
    """A ``SparseDist`` from (full-softmax) probabilities over ids (default: 0..n-1), sorted, top-k."""
    p = np.asarray(probs, dtype=np.float64)
    token_ids = np.arange(p.shape[0]) if ids is None else np.asarray(ids)
    order = np.argsort(-p, kind="stable")[: top_k or p.shape[0]]
    return SparseDist(ids=token_ids[order].astype(np.int32), probs=p[order])


def random_dist_fn(
    vocab: int = 32, top_k: int = 8, seed: int = 0, context: int | None = None, sharpness: float = 2.0
) -> DistFn:
    """Pseudo-random next-token distributions keyed by the last ``context`` tokens (None: the whole path).

    Logits are N(0, sharpness²) drawn from a generator seeded by (seed, key), so the same key always
    gives the same distribution; probabilities are the full softmax, truncated to the top-k.
    """
    cache: dict[tuple[int, ...], SparseDist] = {}

    def dist(path: tuple[int, ...]) -> SparseDist:
        key = path if context is None else path[-context:]
        if key not in cache:
            rng = np.random.default_rng([seed, len(key), *key])
            logits = rng.normal(size=vocab) * sharpness
            probs = np.exp(logits - logits.max())
            cache[key] = sparse(probs / probs.sum(), top_k=top_k)
        return cache[key]

    return dist


class SyntheticDrafter:
    """Drafter protocol over a deterministic function of each node's token path (root first)."""

    def __init__(self, dist_fn: DistFn):
        self.dist_fn = dist_fn
        self.pending: tuple[int, ...] = ()  # the draft has caught up (the Drafter protocol's catch-up)
        self.decodes = 0  # expand() calls = batched draft decodes
        self.nodes_expanded = 0  # nodes evaluated over all calls
        self.calls: list[list[int]] = []  # the node lists, call by call
        self.expanded_paths: list[tuple[int, ...]] = []  # token path of every evaluated node
        self.tree: TreeBuilder | None = None  # the last tree expanded in: everything a planner drafted
        self._expanded: weakref.WeakKeyDictionary[TreeBuilder, set[int]] = weakref.WeakKeyDictionary()

    @classmethod
    def random(
        cls,
        vocab: int = 32,
        top_k: int = 8,
        seed: int = 0,
        context: int | None = None,
        sharpness: float = 2.0,
    ) -> SyntheticDrafter:
        return cls(random_dist_fn(vocab, top_k, seed, context, sharpness))

    def dist_for(self, path: Sequence[int]) -> SparseDist:
        """The distribution after ``path`` without counting a decode (for reference implementations)."""
        return self.dist_fn(tuple(int(t) for t in path))

    def known(self, path: Sequence[int]) -> bool:
        return False  # no look-ahead here

    def piece(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def expand(self, tree: TreeBuilder, nodes: Sequence[int]) -> list[SparseDist]:
        done = self._expanded.setdefault(tree, set())
        nodes = [int(n) for n in nodes]
        if not nodes:
            raise AssertionError("expand() called with no nodes (a wasted draft decode)")
        if len(set(nodes)) != len(nodes):
            raise AssertionError(f"expand() got a node twice in one call: {nodes}")
        for node in nodes:
            if not 0 <= node < tree.size:
                raise AssertionError(f"node {node} is not in the tree (size {tree.size})")
            if node in done:
                raise AssertionError(f"node {node} expanded twice")
            parent = tree.parents[node]
            if node != 0 and parent not in done:
                raise AssertionError(f"node {node} expanded before its parent {parent} (not level by level)")
        dists = []
        for node in nodes:
            path = tuple(tree.path_tokens(node))
            dist = self.dist_fn(path)
            tree.dists[node] = dist
            self.expanded_paths.append(path)
            dists.append(dist)
        done.update(nodes)
        self.tree = tree
        self.decodes += 1
        self.nodes_expanded += len(nodes)
        self.calls.append(nodes)
        return dists

    def parallel_dists(self, tree: TreeBuilder, k: int) -> list[SparseDist]:
        """ParallelSpec's one pass: the distribution after the root, then after the draft's own
        likeliest token at each of the k depths below (a parallel drafter's guess at what comes between)."""
        path = [int(tree.tokens[0])]
        dists = [self.dist_fn(tuple(path))]
        for _ in range(k):
            path.append(int(dists[-1].ids[0]))
            dists.append(self.dist_fn(tuple(path)))
        self.tree = tree
        self.decodes += 1
        self.nodes_expanded += k + 1
        return dists
