"""The draft's look-ahead while a target on RPC servers verifies a tree (``LookAhead``, owned by
``draft.Draft``).

It decodes the likeliest ways the text may go on past the tree — the tree's likeliest paths extended
by the draft's own top-1 tokens, and where the target may reject a node's children, its likeliest other
token. When the target's answer is one of them, ``Draft.commit`` keeps those cells and ``Draft.expand``
answers the next step's nodes on them from what was decoded already: that drafting was hidden behind
the verify. A step that drafted nothing (``auto`` decoding plainly, or verifying copies) has the draft
catch up meanwhile and guess from the root, so it stays current and the next tree may start decoded.
Every reused distribution is the one the draft would compute for the same tokens, so the planners —
and the output — are unchanged; only when the draft work happens moves."""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from time import perf_counter
from typing import Protocol

from ..planner.tree import DraftTree, SparseDist
from .ports import Done, Vocab

AHEAD_TOKENS = 8  # most tokens a look-ahead path goes past the tree's height

Path = tuple[int, ...]  # a node's tokens, the root first


class Drafting(Protocol):
    """What the look-ahead asks of the draft (``draft.Draft``, which keeps this step's nodes, their
    sequence ids and cells): see ``LookAhead``. A path: a node's tokens, root first."""

    pending: list[int]  # tokens the target committed that the draft has not decoded

    @property
    def model(self) -> Vocab: ...
    def absorb(self, limit: int) -> bool: ...
    @property
    def root_decoded(self) -> bool: ...
    def catch_up(self, root: int) -> SparseDist: ...
    def decoded(self, path: Path) -> SparseDist | None: ...
    def reuse(self, path: Path) -> SparseDist | None: ...
    def room_for(self, path: Path) -> bool: ...
    def extend(self, path: Path) -> SparseDist | None: ...


class LookAhead:
    """The look-ahead's state and its search (``run``, once a step while the target verifies).

    What it asks of the draft (``Drafting``; ``Draft``'s methods of the same names):

    - ``root_decoded``: whether this step decoded its root already (it drafted; else ``run`` catches up);
    - ``catch_up(root)``: decode the pending tokens and the root now; the root's distribution;
    - ``absorb(limit)``, ``pending``: decode that many pending tokens into the committed prefix;
    - ``decoded(path)``: the distribution after ``path`` if this step decoded it (tree or look-ahead);
    - ``reuse(path)``: take the cell the last look-ahead decoded there, where the parent's sequence
      leads to it, as this step's node (no decode); its distribution, or None if there is none;
    - ``room_for(path)``: a cell at ``path``'s position fits (in the context, a sequence id free);
    - ``extend(path)``: decode ``path``'s last token in a sequence continuing its parent's; its
      distribution, or None (nothing decoded) when that sequence holds a cell past the parent already.

    What the draft reads of it: ``left`` (what the last look-ahead decoded past the root, in the
    sequence ``seq``), ``seconds`` and ``guess`` (this step's); ``leave`` and ``forget`` set ``left``.
    """

    def __init__(self, draft: Drafting):
        self._draft = draft
        # What the last look-ahead left past the root (whose path starts the keys): distributions of
        # nodes already decoded in the sequence ``seq``; reused by the next step's ``expand``.
        self._left: dict[Path, SparseDist] = {}
        self.seq = 0
        self.seconds = 0.0  # time the look-ahead decoded this step (overlapping the verify)
        # A step that drafted nothing: the draft's distribution at its root, decoded by the look-ahead
        # while the target decoded (None: not decoded) — how auto learns the draft's accuracy meanwhile.
        self.guess: SparseDist | None = None

    @property
    def left(self) -> Mapping[Path, SparseDist]:
        return self._left

    def leave(self, dists: dict[Path, SparseDist], seq: int) -> None:
        """What this step's look-ahead leaves the next: ``dists`` (keyed from the new root), in ``seq``."""
        self._left, self.seq = dists, seq

    def forget(self) -> None:
        """Nothing is left (its cells: the draft's to remove)."""
        self._left = {}

    def begin_step(self) -> None:
        self.seconds = 0.0
        self.guess = None

    def run(self, tree: DraftTree, done: Done, expected: float = 0.0) -> None:
        """While the target verifies ``tree`` (``done`` is set when it has): decode, one token a decode,
        the likeliest ways the text may go on past the tree — best first, the draft's probabilities
        standing in for the target's (a step that drafted nothing catches up first:
        ``_catch_up_meanwhile``):

        - a drafted node not decoded yet: the target accepts the path to it (chance p̂);
        - past a decoded path, the tree's or the look-ahead's, reached with chance c: the target
          rejects what was drafted there (if anything) and writes the draft's likeliest other token t
          (past a leaf: its top-1 guess), chance c · q(t).

        Paths stop ``AHEAD_TOKENS`` past the tree's height. ``expected``: how long the verify should
        take (0: unknown); a token is begun only while more than half a decode of it is likely left,
        so the step rarely waits for the draft.
        """
        draft = self._draft
        start = perf_counter()
        if not draft.root_decoded and not self._catch_up_meanwhile(tree, done):
            self.seconds += perf_counter() - start
            return
        in_tree = {tuple(tree.path_tokens(node)): node for node in range(tree.size)}
        frontier: list[tuple[float, int, Path]] = []  # a heap of (−chance, tie-break, path)
        for path, node in in_tree.items():
            if (dist := draft.decoded(path)) is not None:
                self._push_next(frontier, tree, in_tree, path, dist, tree.path_probs[node])
        longest = tree.height + 1 + AHEAD_TOKENS  # tokens in a path, the root included
        level = 0.0  # the last look-ahead decode's seconds
        while frontier and not done.is_set():
            minus_chance, _, path = heapq.heappop(frontier)
            dist = draft.reuse(path)  # decoded by the last look-ahead
            if dist is None:
                late = expected and perf_counter() - start + level / 2 > expected
                if late or not draft.room_for(path):
                    break
                if draft.model.is_eog(path[-1]):
                    continue
                began = perf_counter()
                dist = draft.extend(path)
                if dist is None:
                    continue
                level = perf_counter() - began
            if len(path) < longest:
                self._push_next(frontier, tree, in_tree, path, dist, -minus_chance)
        self.seconds += perf_counter() - start

    def _push_next(
        self, frontier: list, tree: DraftTree, in_tree: dict, path: Path, dist: SparseDist, chance: float
    ) -> None:
        """What may follow the decoded ``path`` (reached with ``chance``, ``dist`` after it): its children in
        the tree, not decoded, each at its p̂; and the draft's likeliest token outside them, at
        chance · q(token)."""
        node = in_tree.get(path)
        children = tree.children(node) if node is not None else ()
        for child in children:
            child_path = path + (tree.token_ids[child],)
            if self._draft.decoded(child_path) is None:
                heapq.heappush(frontier, (-tree.path_probs[child], len(frontier), child_path))
        drafted = {tree.token_ids[child] for child in children}
        other = next((i for i, token in enumerate(dist.ids.tolist()) if token not in drafted), None)
        if other is not None:
            guess = chance * float(dist.probs[other])
            heapq.heappush(frontier, (-guess, len(frontier), path + (int(dist.ids[other]),)))

    def _catch_up_meanwhile(self, tree: DraftTree, done: Done) -> bool:
        """A step that drafted nothing (auto's plain and copy steps): the draft catches up on what the
        target committed, hidden behind its decode — ``AHEAD_TOKENS`` at a time while more are pending,
        then the rest and the root, so the look-ahead goes on from the root (its distribution is the
        step's ``guess``). True when the root is decoded."""
        if done.is_set():
            return False
        if len(self._draft.pending) > AHEAD_TOKENS:
            self._draft.absorb(AHEAD_TOKENS)
            return False
        self.guess = self._draft.catch_up(tree.token_ids[0])
        return True
