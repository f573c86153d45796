"""How a draft tree becomes one llama.cpp batch. Pure numpy: no llama_cpp here.

llama.cpp has no custom attention mask; a token attends to a KV cell when the cell holds the
token's (first) sequence id and the cell's position is not after the token's. So: one sequence id
per **leaf**, every node tagged with the ids of all leaves below it, position = committed length +
depth. A node then sees exactly its ancestors (the cells of any leaf below it that are not after
it), whichever of its ids llama.cpp picks. The committed prefix carries every id, so all see it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class TreeLayout:
    depth: np.ndarray  # (n,) position offset of each node from the root
    seq_ids: tuple[tuple[int, ...], ...]  # per node: the leaf ids below it (its sequence ids)
    leaf_below: tuple[int, ...]  # one leaf id below each node: the sequence kept when it is accepted
    n_leaves: int


def tree_layout(parents: Sequence[int]) -> TreeLayout:
    """Layout of a tree given parent indices (parents[0] == -1, parents[i] < i): a tuple of ints
    (``DraftTree.parent_ids``), or an array (converted in one C call: a loop over numpy ints costs ~20×
    more)."""
    return _layout_cached(tuple(parents.tolist()) if isinstance(parents, np.ndarray) else tuple(parents))


@lru_cache(maxsize=256)
def _layout_cached(parents: tuple[int, ...]) -> TreeLayout:
    # Static shapes (chains, MCSD k-configurations) recur step after step: the layout is built once
    # per shape and reused — the "sliced topology-aware mask" idea of the MCSD paper.
    # Plain lists while building (a numpy element costs ~10× a list's from Python), arrays at the end.
    n = len(parents)
    depth, has_child = [0] * n, [False] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
        has_child[parents[i]] = True
    leaves = [node for node in range(n) if not has_child[node]]
    ids: list[list[int]] = [[] for _ in range(n)]
    leaf_below = [-1] * n
    for leaf_id, leaf in enumerate(leaves):
        node = leaf
        while node >= 0:  # tag the leaf's whole root path
            ids[node].append(leaf_id)
            if leaf_below[node] < 0:
                leaf_below[node] = leaf_id
            node = parents[node]
    return TreeLayout(
        np.array(depth, dtype=np.int32),
        tuple(tuple(x) for x in ids),
        tuple(leaf_below),
        len(leaves),
    )
