"""Best-first growth of a draft tree, one batched draft decode per level: the routine OPT-Tree,
``hybrid`` and ``auto`` share, each with its own policy.

A growth keeps every node the draft evaluated and every candidate child it admitted in one **work
tree** (the node indices the draft sees), each with its acceptance estimate p̂ = Π q along its path
(OPT-Tree's: a tree T is expected to yield E(A) = Σ_{v ∈ T} p̂(v) accepted tokens). ``grow`` runs

1. ``policy.next_level(growth)``: the nodes to expand now — their parents expanded earlier, chosen
   by the policy from the best candidates by p̂ (none: stop, the next level would not pay);
2. one batched draft decode of them (``Drafter.expand``);
3. ``policy.admit(growth, nodes, dists)``: which of their children become candidates (``admit_top``:
   each node's k likeliest; OPT-Tree prunes against its running top n);

until the policy stops; then ``policy.keep(growth)`` names the final tree, usually the m nodes of
largest p̂ (``Growth.ranked``), which form a subtree (a child's p̂ = p̂(parent) · q ≤ p̂(parent), and
ties go to the older node, so every parent ranks above its children — OPT-Tree's Theorem 3.1), m
sized by the cost curves (``costmodel.best_size``). ``Growth.copy_into`` writes those nodes into the
step's tree, renumbered parents first: nodes the draft evaluated may be dropped, so the engine
matches decoded nodes by token path, not index.

Children are the draft's most likely tokens, or copies from the conversation: deterministic
candidates, verified by the one-hot rule (``ChildRule.TOP``) greedy or sampling.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .inputs import Drafter
from .tree import ChildRule, SparseDist, TreeBuilder


@dataclass
class Growth:
    """A growth in progress: the work tree and what the draft has done to it."""

    tree: TreeBuilder  # every evaluated node and every admitted candidate
    levels: list[int] = field(default_factory=list)  # nodes per draft decode, the root's level first
    expanded: dict[int, None] = field(default_factory=dict)  # nodes the draft evaluated, in order
    added: list[int] = field(default_factory=list)  # the candidates the last level admitted
    kids: dict[int, dict[int, int]] = field(default_factory=dict)  # parent → token → child

    @classmethod
    def from_root(cls, root_token: int) -> Growth:
        return cls(TreeBuilder(int(root_token)))

    @property
    def evaluated(self) -> int:
        """Nodes the draft evaluated besides the root (what its sequences must hold)."""
        return len(self.expanded) - (0 in self.expanded)

    def child(self, parent: int, token: int) -> int | None:
        """The node for ``token`` below ``parent``, if there is one."""
        return self.kids.get(parent, {}).get(token)

    def add(self, parent: int, token: int, q: float, copied: bool = False) -> int:
        """A new candidate below ``parent`` with acceptance ``q`` given its parent: p̂ = p̂(parent) · q."""
        node = self.tree.add(parent, token, q, copied=copied)
        self.tree.set_children_rule(parent, ChildRule.TOP)  # deterministic candidates: one-hot rule
        self.kids.setdefault(parent, {})[token] = node
        self.added.append(node)
        return node

    def set_q(self, node: int, q: float) -> None:
        """A new q for ``node``: its p̂ and every descendant's follow (nodes come after their parents,
        so one pass from ``node`` on recomputes p̂ = p̂(parent) · q in order)."""
        t = self.tree
        t.draft_prob[node] = q
        below = {node}
        for i in range(node, t.size):
            if i == node or t.parents[i] in below:
                below.add(i)
                t.path_prob[i] = t.path_prob[t.parents[i]] * t.draft_prob[i]

    def ranked(
        self, nodes: Sequence[int] | None = None, phat: Mapping[int, float] | None = None
    ) -> list[int]:
        """``nodes`` (default: every non-root node) by p̂, largest first; ties: the older node. ``phat``:
        a policy's own estimate per node (``auto``'s, through its acceptance curve), else Π q."""
        nodes = range(1, self.tree.size) if nodes is None else nodes
        p = self.tree.path_prob if phat is None else phat
        return sorted(nodes, key=lambda u: (-p[u], u))

    def candidates(self, phat: Mapping[int, float] | None = None) -> list[int]:
        """The nodes not evaluated yet, best p̂ first (``ranked``)."""
        return self.ranked([u for u in range(1, self.tree.size) if u not in self.expanded], phat)

    def expected(self, nodes: Sequence[int]) -> float:
        """E(A) of a tree holding ``nodes``: Σ p̂."""
        return float(sum(self.tree.path_prob[u] for u in nodes))

    def copy_into(self, keep: Sequence[int], out: TreeBuilder) -> dict[int, int]:
        """Into ``out`` (the root alone): the work tree restricted to the root and ``keep`` (closed
        under parents), renumbered in index order; with the rules of the nodes that keep a child and the
        distributions of every kept node the draft evaluated. Returns work node → ``out`` node."""
        t, at = self.tree, {0: 0}
        for node in sorted(keep):
            parent, token, q = at[t.parents[node]], t.tokens[node], t.draft_prob[node]
            at[node] = out.add(parent, token, q, merged=t.merged[node], copied=t.copied[node])
        has_child = set(out.parents[1:])
        for old, new in at.items():
            if new in has_child:
                out.set_children_rule(new, ChildRule(t.child_rule[old]))
            if old in t.dists:
                out.dists[new] = t.dists[old]
        return at


class Policy(Protocol):
    """What makes a growth one paper's algorithm (OPT-Tree), or ``hybrid``'s, or ``auto``'s."""

    def next_level(self, growth: Growth) -> list[int]:
        """The nodes the next draft decode evaluates (parents evaluated already); [] stops."""
        ...

    def admit(self, growth: Growth, nodes: list[int], dists: list[SparseDist]) -> None:
        """Add the children of the just-evaluated ``nodes`` that may enter the tree (``growth.add``)."""
        ...

    def keep(self, growth: Growth) -> list[int]:
        """The final tree's nodes (closed under parents)."""
        ...


def grow(drafter: Drafter, growth: Growth, policy: Policy) -> list[int]:
    """Draft level by level while the policy names nodes, one batched decode each; returns the kept
    nodes (``policy.keep``). ``growth.levels`` holds the levels' sizes."""
    while frontier := policy.next_level(growth):
        dists = drafter.expand(growth.tree, frontier)  # one draft decode: q(· | path) for each node
        growth.levels.append(len(frontier))
        growth.expanded.update(dict.fromkeys(frontier))
        growth.added = []
        policy.admit(growth, frontier, dists)
    return policy.keep(growth)


def admit_top(growth: Growth, nodes: Sequence[int], dists: Sequence[SparseDist], k: int) -> None:
    """Each node's k likeliest next tokens with q > 0, in rank order (the order the one-hot rule
    tries siblings)."""
    for node, dist in zip(nodes, dists):
        for token, q in zip(dist.ids[:k].tolist(), dist.probs[:k].tolist()):
            if q > 0.0:
                growth.add(node, token, q)

