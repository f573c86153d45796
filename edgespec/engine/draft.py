"""The draft model: expands a tree level by level, one batched decode per level (the planners'
``Drafter``), or — ParallelSpec — drafts every depth at once; and its KV bookkeeping
(``runners.CachedModel``).

While a target on RPC servers verifies a tree, the draft looks ahead (``look_ahead``): it decodes the
likeliest ways the text may go on past the tree — the tree's likeliest paths extended by its own top-1
tokens, and where the target may reject a node's children, its likeliest other token. When the
target's answer is one of them, ``commit`` keeps those cells and ``expand`` answers the next step's
nodes on them from what was decoded already: that drafting was hidden behind the verify. A step that
drafted nothing (``auto`` decoding plainly, or verifying copies) has the draft catch up meanwhile and
guess from the root, so it stays current and the next tree may start decoded. Every reused distribution
is the one the draft would compute for the same tokens, so the planners — and the output — are
unchanged; only when the draft work happens moves."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence
from time import perf_counter

from ..planner.tree import DraftTree, SparseDist, TreeBuilder
from ._llama import Context
from .rows import draft_dists
from .runners import CachedModel

AHEAD_TOKENS = 8  # most tokens a look-ahead path goes past the tree's height


class Draft(CachedModel):
    """The draft: expands a tree level by level, one batched decode per level (the planners' Drafter),
    or — ParallelSpec — drafts every depth at once from [MASK] tokens (``parallel_dists``)."""

    def __init__(self, ctx: Context, top_k: int = 32, vocab_limit: int | None = None):
        super().__init__(ctx)
        self.top_k = top_k  # candidates kept per distribution (q is this top-k, renormalised)
        # never propose ids the target lacks, nor read past the draft's own rows
        self.vocab_limit = min(vocab_limit or ctx.n_vocab, ctx.n_vocab)
        self.temperature = 1.0
        self.mask_ids: tuple[int, ...] = ()  # ParallelSpec's [MASK]_1 … [MASK]_K: never proposed
        self.pending: list[int] = []  # tokens the target committed that the draft has not decoded
        self.decode_seconds = 0.0  # time inside llama_decode this step (the rest is planner work)
        self.decodes = 0
        self._node_seq: dict[int, int | None] = {}  # decoded node → its sequence id (None: committed)
        # The same, keyed by the node's token path: planners may prune and renumber the tree they
        # return (OPT-Tree keeps the top n), so commit finds decoded nodes by path, not index.
        self._path_seq: dict[tuple[int, ...], int | None] = {}
        self._seq_taken: set[int] = set()  # nodes whose sequence a child already reused
        self._used_seqs: list[int] = []
        self._root_pos = 0
        self._path_dist: dict[tuple[int, ...], SparseDist] = {}  # decoded node's path → its distribution
        self._path_node: dict[tuple[int, ...], int] = {}  # … → its node (the look-ahead's: negative)
        # What the last look-ahead left past the root (whose path starts the keys): distributions of
        # nodes already decoded in the sequence ``_ahead_seq``; reused by the next step's ``expand``.
        self._ahead: dict[tuple[int, ...], SparseDist] = {}
        self._ahead_seq = 0
        self.reused = 0  # nodes this step whose distribution came from the look-ahead
        self.ahead_seconds = 0.0  # time the look-ahead decoded this step (overlapping the verify)
        # A step that drafted nothing: the draft's distribution at its root, decoded by the look-ahead
        # while the target decoded (None: not decoded) — how auto learns the draft's accuracy meanwhile.
        self.guess: SparseDist | None = None

    def sync(self, tokens: Sequence[int]) -> int:
        """Hold ``tokens[:-1]``; the last token is the pending root, decoded with the first level."""
        kept = super().sync(tokens[:-1])
        self.pending = [int(tokens[-1])]
        return kept

    def defer(self, tokens: Sequence[int]) -> int:
        """Like ``sync``, but decode nothing now: keep the longest prefix of ``tokens[:-1]`` already
        held; the rest (the root last) is pending, read with the first level the draft is asked for.
        A reply's first token then waits for the target alone (``decoder.generate``)."""
        keep = self.keep_prefix(tokens[:-1])
        self.pending = [int(t) for t in tokens[keep:]]
        return keep

    def keep_prefix(self, tokens: Sequence[int]) -> int:
        self._ahead = {}  # its cells are past the committed prefix: removed with everything there
        return super().keep_prefix(tokens)

    def absorb(self, limit: int) -> bool:
        """Between replies: decode up to ``limit`` pending tokens into the committed prefix (never the
        last, the root: the next prompt decides what follows it). True while more are left to absorb."""
        todo = self.pending[: max(0, min(limit, len(self.pending) - 1))]
        if todo:
            self.drop_ahead()
            self.decode_committed(todo, want_last=False)
            del self.pending[: len(todo)]
        return len(self.pending) > 1

    def begin_step(self, temperature: float) -> None:
        self.temperature = temperature if temperature > 0 else 1.0
        self.decode_seconds = 0.0
        self.decodes = 0
        self._node_seq.clear()
        self._path_seq.clear()
        self._seq_taken.clear()
        self._used_seqs = []
        self._path_dist.clear()
        self._path_node.clear()
        self.reused = 0
        self.ahead_seconds = 0.0
        self.guess = None

    def expand(self, tree: TreeBuilder, nodes: Sequence[int]) -> list[SparseDist]:
        start = perf_counter()
        if list(nodes) == [0]:
            dists = self._expand_root(tree)
        else:
            dists = self._decode_level(tree, nodes)
        self.decode_seconds += perf_counter() - start
        for node, dist in zip(nodes, dists):
            tree.dists[node] = dist
        return dists

    def known(self, path: Sequence[int]) -> bool:
        return not self.pending and tuple(int(t) for t in path) in self._ahead

    def _expand_root(self, tree: TreeBuilder) -> list[SparseDist]:
        """The root: catch up on what the target committed last step (accepted tokens the draft never
        decoded, then the new root), straight into the committed prefix (every tagged id) — or nothing,
        when the look-ahead decoded the root already."""
        root = (int(tree.tokens[0]),)
        if root in self._ahead and not self.pending:
            self._used_seqs.append(self._ahead_seq)  # its cells past the root go at commit unless kept
            self.reused += 1
            dists = [self._ahead[root]]
        else:
            self.drop_ahead()
            pending = self._catch_up(room=self.ctx.settings.n_batch)
            base, tagged = len(self.committed), self.tagged_seqs
            positions = range(base, base + len(pending))
            dists = self._decode_top_k(pending, positions, [tagged] * len(pending), 1)  # in every tagged id
            self.decodes += 1
            self.committed.extend(pending)
        self._root_committed(tree)
        self._path_dist[root] = dists[0]
        return dists

    def _decode_top_k(self, tokens, positions, seq_ids, n_rows: int) -> list[SparseDist]:
        """One decode (token i at ``positions[i]`` in the sequences ``seq_ids[i]``) and the top-k of its
        last ``n_rows`` rows: the rows' distributions."""
        n = len(tokens)
        self.ctx.decode(tokens, positions, seq_ids, [i >= n - n_rows for i in range(n)])
        k = min(self.top_k, self.vocab_limit)
        return draft_dists(self.ctx.logits_rows(n_rows), k, self.temperature, self.vocab_limit, self.mask_ids)

    def parallel_dists(self, tree: TreeBuilder, k: int) -> list[SparseDist]:
        """ParallelSpec's draft pass: the pending tokens (ending with the root) and [MASK]_1 … [MASK]_k
        in one decode; returns the k + 1 distributions of depths 1 … k + 1 (the root's row, then each
        mask's). Afterwards the pending tokens are committed and the mask cells are gone: the cache is
        exactly as if only the pending tokens had been decoded.

        The masks carry sequence id 0 only: they see the committed prefix (every committed cell carries
        id 0) and each other, and removing positions past the root from every sequence removes them and
        nothing else (no speculative cell outlives a step). Counts as one draft decode.
        """
        if tree.size != 1:
            raise ValueError("parallel_dists drafts from the root alone (planner bug)")
        if not 0 <= k <= len(self.mask_ids):
            have = len(self.mask_ids)
            raise ValueError(f"{k} masks asked, the draft has {have} (see ModelPair.set_up_draft)")
        start = perf_counter()
        masks = list(self.mask_ids[:k])
        pending = self._catch_up(room=self.ctx.settings.n_batch - k)
        base = len(self.committed)
        n, tagged = len(pending), self.tagged_seqs
        seq_ids = [tagged] * n + [(0,)] * k  # pending: every tagged id; the masks: id 0
        # the rows of the root and of every mask: the last k + 1 tokens
        dists = self._decode_top_k(pending + masks, range(base, base + n + k), seq_ids, k + 1)
        self.ctx.seq_rm(-1, base + n)  # the mask cells: the only cells past the root
        self.committed.extend(int(t) for t in pending)
        self._root_committed(tree)  # nothing else was decoded
        self.decode_seconds += perf_counter() - start
        self.decodes += 1
        return dists

    def _root_committed(self, tree: TreeBuilder) -> None:
        """The pending tokens, the root last, are now the committed prefix's end: the root is decoded
        (in every tagged sequence) and nothing is left to catch up on."""
        self.pending = []
        self._root_pos = len(self.committed) - 1
        self._assign(0, (int(tree.tokens[0]),), None)

    def _catch_up(self, room: int) -> list[int]:
        """The pending tokens that fit in ``room`` of the next batch (the root last); a longer catch-up
        (rare) decodes all but those into the committed prefix first, as one more draft decode."""
        pending = self.pending
        if len(pending) > room:
            self.decode_committed(pending[:-room], want_last=False)
            self.decodes += 1
            pending = pending[-room:]
        return pending

    def _decode_level(self, tree: TreeBuilder, nodes: Sequence[int]) -> list[SparseDist]:
        """One level: nodes the look-ahead decoded already keep its sequence and distribution (first,
        so that they, not a sibling, continue it); the others are decoded in one batch."""
        dists: dict[int, SparseDist] = {}
        paths = {node: tuple(tree.path_tokens(node)) for node in nodes}
        for node, path in paths.items():
            parent = tree.parents[node]
            if parent not in self._node_seq:
                raise ValueError(f"node {node} expanded before its parent {parent} (planner bug)")
            if self._reusable(parent, path):
                dists[node] = self._reuse(node, parent, path)
                self.reused += 1
        todo = [node for node in nodes if node not in dists]
        if todo:
            seqs = [self._seq_below(tree.parents[node], tree.depth[node]) for node in todo]
            for node, seq in zip(todo, seqs):
                self._assign(node, paths[node], seq)
            positions = [self._root_pos + tree.depth[node] for node in todo]
            tokens = [tree.tokens[node] for node in todo]
            decoded = self._decode_top_k(tokens, positions, [(seq,) for seq in seqs], len(todo))
            dists.update(zip(todo, decoded))
            self._path_dist.update(zip((paths[node] for node in todo), decoded))
            self.decodes += 1
        return [dists[node] for node in nodes]

    def _reusable(self, parent: int, path: tuple[int, ...]) -> bool:
        """The last look-ahead decoded this node, in the sequence its parent is in (or below the root)."""
        return path in self._ahead and self._node_seq[parent] in (None, self._ahead_seq)

    def _reuse(self, node: int, parent: int, path: tuple[int, ...]) -> SparseDist:
        """Take a node the last look-ahead decoded: its cell (in its sequence) and distribution."""
        self._assign(node, path, self._ahead_seq)
        self._seq_taken.add(parent)  # the node continues its parent's sequence
        if any(len(other) > len(path) for other in self._ahead):
            self._seq_taken.add(node)  # that sequence holds a deeper cell: the node's children need new ids
        self._path_dist[path] = self._ahead[path]
        return self._ahead[path]

    def _assign(self, node: int, path: tuple[int, ...], seq: int | None) -> None:
        self._node_seq[node], self._path_seq[path], self._path_node[path] = seq, seq, node

    def _seq_below(self, parent: int, depth: int) -> int:
        """The sequence id of a new node at ``depth`` below ``parent``: the parent's own for its first
        child (no copy needed), else a fresh one tagged on the parent's path."""
        parent_seq = self._node_seq[parent]
        if parent_seq is not None and parent not in self._seq_taken:
            self._seq_taken.add(parent)
            return parent_seq
        seq = self._fresh_seq()
        if parent_seq is not None:  # see the parent's path: tag it with the new id
            self.ctx.seq_cp(parent_seq, seq, self._root_pos + 1, self._root_pos + depth)
        return seq

    def _fresh_seq(self) -> int:
        seq = next((s for s in range(self.n_seq) if s not in self._used_seqs), None)
        if seq is None:
            raise ValueError(
                f"the tree needs more than {self.n_seq} draft sequences (planner exceeded max_nodes)"
            )
        self._tag_prefix(seq + 1, self._root_pos + 1)  # the committed prefix ends at the root
        self._used_seqs.append(seq)
        return seq

    # -- looking ahead while the target verifies -----------------------------------------------------
    def look_ahead(self, tree: DraftTree, done: threading.Event, expected: float = 0.0) -> None:
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
        if self.mask_ids:
            return  # ParallelSpec's masks: its trees are drafted in one pass, nothing to extend
        start = perf_counter()
        if not self._path_seq and not self._catch_up_meanwhile(tree, done):
            self.ahead_seconds += perf_counter() - start
            return
        in_tree = {tuple(tree.path_tokens(node)): node for node in range(tree.size)}
        frontier: list[tuple[float, int, tuple[int, ...]]] = []  # a heap of (−chance, tie-break, path)
        for path, node in in_tree.items():
            if path in self._path_dist:
                self._push_next(frontier, tree, in_tree, path, tree.path_probs[node])
        longest = tree.height + 1 + AHEAD_TOKENS  # tokens in a path, the root included
        level = 0.0  # the last look-ahead decode's seconds
        while frontier and not done.is_set():
            minus_chance, _, path = heapq.heappop(frontier)
            parent = self._path_node[path[:-1]]
            if self._reusable(parent, path):
                self._reuse(-1 - len(self._path_node), parent, path)  # decoded by the last look-ahead
            else:
                position = self._root_pos + len(path) - 1
                late = expected and perf_counter() - start + level / 2 > expected
                if late or position >= self.n_ctx or len(self._used_seqs) >= self.n_seq:
                    break
                if self.model.is_eog(path[-1]):
                    continue
                began = perf_counter()
                seq = self._seq_below(parent, len(path) - 1)
                if self.ctx.seq_pos_max(seq) != position - 1:
                    continue  # a cell past the parent in its sequence (seen over RPC with bushy trees)
                self._assign(-1 - len(self._path_node), path, seq)  # look-ahead nodes: negative keys
                self._path_dist[path] = self._decode_top_k([path[-1]], [position], [(seq,)], 1)[0]
                level = perf_counter() - began
            if len(path) < longest:
                self._push_next(frontier, tree, in_tree, path, -minus_chance)
        self.ahead_seconds += perf_counter() - start

    def _push_next(self, frontier: list, tree: DraftTree, in_tree: dict, path: tuple, chance: float) -> None:
        """What may follow the decoded ``path`` (reached with ``chance``): its children in the tree, not
        decoded, each at its p̂; and the draft's likeliest token outside them, at chance · q(token)."""
        node = in_tree.get(path)
        children = tree.children(node) if node is not None else ()
        for child in children:
            child_path = path + (tree.token_ids[child],)
            if child_path not in self._path_dist:
                heapq.heappush(frontier, (-tree.path_probs[child], len(frontier), child_path))
        drafted = {tree.token_ids[child] for child in children}
        dist = self._path_dist[path]
        other = next((i for i, token in enumerate(dist.ids.tolist()) if token not in drafted), None)
        if other is not None:
            guess = chance * float(dist.probs[other])
            heapq.heappush(frontier, (-guess, len(frontier), path + (int(dist.ids[other]),)))

    def _catch_up_meanwhile(self, tree: DraftTree, done: threading.Event) -> bool:
        """A step that drafted nothing (auto's plain and copy steps): the draft catches up on what the
        target committed, hidden behind its decode — ``AHEAD_TOKENS`` at a time while more are pending,
        then the rest and the root, so the look-ahead goes on from the root (its distribution is the
        step's ``guess``). True when the root is decoded."""
        if done.is_set():
            return False
        if len(self.pending) > AHEAD_TOKENS:
            self.absorb(AHEAD_TOKENS)
            return False
        decodes = self.decodes  # overlapping the target's decode, like every look-ahead decode: not counted
        self.guess = self._expand_root(TreeBuilder(tree.token_ids[0]))[0]
        self.decodes = decodes
        return True

    def drop_ahead(self) -> None:
        """Forget the look-ahead (a reply's end): its cells, past the committed prefix, go."""
        if self._ahead:
            self.ctx.seq_rm(self._ahead_seq, len(self.committed))
            self._ahead = {}

    def commit(self, tree: DraftTree, path: Sequence[int], next_token: int) -> None:
        """Keep the decoded part of the accepted path; queue the rest and the new root. When the draft
        decoded the new root too (it looked ahead and guessed the target's token), keep that root and
        what was decoded below it in the same sequence: the next step's ``expand`` reuses them."""
        written = [tree.token_ids[node] for node in path] + [int(next_token)]  # the old root first
        if not self._path_seq:  # nothing was drafted: the old root is still pending too
            self.drop_ahead()
            self.pending.extend(written[1:])
            return
        # The decoded part of what was written is a prefix of it (a node is decoded after its parent).
        decoded = 0
        while decoded < len(written) - 1 and tuple(written[: decoded + 2]) in self._path_seq:
            decoded += 1
        start, ahead = self._root_pos + 1, decoded == len(written) - 1
        keep = self._path_seq[tuple(written[: decoded + 1])]
        if decoded:
            self._keep_branch(keep, self._used_seqs, start, start + decoded, keep_after=ahead)
        else:
            for seq in self._used_seqs:
                self.ctx.seq_rm(seq, start)
        self.committed.extend(written[1 : decoded + 1])
        self.pending = written[decoded + 1 :]
        self._ahead, self._ahead_seq, n = {}, keep, len(written)
        if ahead:  # the paths below the new root still in ``keep``, keyed from the new root
            below = (p for p, seq in self._path_seq.items() if seq == keep and p[:n] == tuple(written))
            self._ahead = {p[n - 1 :]: self._path_dist[p] for p in below}
            # cells of ``keep`` deeper than what is known of them (an older look-ahead's) go
            self.ctx.seq_rm(keep, len(self.committed) - 1 + max(map(len, self._ahead)))
