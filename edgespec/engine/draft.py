"""The draft model: expands a tree level by level, one batched decode per level (the planners'
``Drafter``), or — ParallelSpec — drafts every depth at once; and its KV bookkeeping
(``runners.CachedModel``).

While a target on RPC servers verifies a tree, the draft looks ahead past it (``look_ahead.LookAhead``,
which it owns): when the target's answer is one of the paths decoded then, ``commit`` keeps those cells
and ``expand`` answers the next step's nodes on them from what was decoded already."""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter

from ..planner.tree import DraftTree, SparseDist, TreeBuilder
from ._context import Context
from .look_ahead import LookAhead, Path
from .ports import Done, DraftWork, Pending
from .rows import draft_dists
from .runners import CachedModel, Target
from .sampled import sampled_dists
from .samplers import Keep


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
        self.reused = 0  # nodes this step whose distribution came from the look-ahead
        self.ahead = LookAhead(self)  # while a target on RPC servers verifies (``look_ahead``)

    @property
    def ahead_seconds(self) -> float:
        """Time the look-ahead decoded this step (overlapping the verify)."""
        return self.ahead.seconds

    @property
    def guess(self) -> SparseDist | None:
        """A step that drafted nothing: the draft's distribution at its root (``LookAhead.guess``)."""
        return self.ahead.guess

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
        self.ahead.forget()  # its cells are past the committed prefix: removed with everything there
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
        self.ahead.begin_step()

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

    @property
    def work(self) -> DraftWork:
        return DraftWork(self.decode_seconds, self.decodes, self.reused, self.ahead_seconds, self.guess)

    def piece(self, token: int) -> bytes:
        return self.model.piece(token)

    def known(self, path: Sequence[int]) -> bool:
        return not self.pending and tuple(int(t) for t in path) in self.ahead.left

    def _expand_root(self, tree: TreeBuilder) -> list[SparseDist]:
        """The root: catch up on what the target committed last step (accepted tokens the draft never
        decoded, then the new root), straight into the committed prefix (every tagged id) — or nothing,
        when the look-ahead decoded the root already."""
        root = (int(tree.tokens[0]),)
        if root in self.ahead.left and not self.pending:
            self._used_seqs.append(self.ahead.seq)  # its cells past the root go at commit unless kept
            self.reused += 1
            dists = [self.ahead.left[root]]
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
        k = min(self.top_k, self.vocab_limit)
        if self.ctx.reductions == "backend":  # TopKSoftmax in the graph, widened by the masks it may meet
            pool = min(k + len(self.mask_ids), self.vocab_limit, self.ctx.n_vocab)
            self.ctx.keep(Keep(pool, self.temperature, self.vocab_limit))
        self.ctx.decode(tokens, positions, seq_ids, [i >= n - n_rows for i in range(n)])
        if self.ctx.kept is not None:
            return sampled_dists(*self.ctx.sampled_rows(n_rows), k, self.mask_ids)
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
            dist = self._reuse(node, parent, path)
            if dist is not None:
                dists[node] = dist
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

    def _reuse(self, node: int, parent: int, path: tuple[int, ...]) -> SparseDist | None:
        """Where the last look-ahead decoded this node, in the sequence its parent is in (or below the
        root), take it: its cell (in its sequence) and distribution (None: it did not)."""
        left = self.ahead.left
        if path not in left or self._node_seq[parent] not in (None, self.ahead.seq):
            return None
        self._assign(node, path, self.ahead.seq)
        self._seq_taken.add(parent)  # the node continues its parent's sequence
        if any(len(other) > len(path) for other in left):
            self._seq_taken.add(node)  # that sequence holds a deeper cell: the node's children need new ids
        self._path_dist[path] = left[path]
        return left[path]

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

    # -- looking ahead while the target verifies (``look_ahead.LookAhead``, through ``Drafting``) ------
    def look_ahead(self, tree: DraftTree, done: Done, expected: float = 0.0) -> None:
        """While the target verifies ``tree`` (``done`` is set when it has): ``LookAhead.run``."""
        if not self.mask_ids:  # ParallelSpec's masks: its trees are drafted in one pass, nothing to extend
            self.ahead.run(tree, done, expected)

    @property
    def root_decoded(self) -> bool:
        """This step decoded its root already (it drafted, or the look-ahead caught up)."""
        return bool(self._path_seq)

    def catch_up(self, root: int) -> SparseDist:
        """Catch up and decode ``root`` now, as ``expand`` would; its distribution."""
        decodes = self.decodes  # overlapping the target's decode, like every look-ahead decode: not counted
        dist = self._expand_root(TreeBuilder(root))[0]
        self.decodes = decodes
        return dist

    def decoded(self, path: Path) -> SparseDist | None:
        """The distribution after ``path``, where this step decoded it (a tree's node or the look-ahead's)."""
        return self._path_dist.get(path)

    def reuse(self, path: Path) -> SparseDist | None:
        """The look-ahead's node at ``path``, where the last look-ahead left it (``_reuse``): its
        distribution (None: it did not)."""
        return self._reuse(-1 - len(self._path_node), self._path_node[path[:-1]], path)  # negative keys

    def room_for(self, path: Path) -> bool:
        """A cell at ``path``'s position fits: within the context, with a sequence id to spare."""
        return self._root_pos + len(path) - 1 < self.n_ctx and len(self._used_seqs) < self.n_seq

    def extend(self, path: Path) -> SparseDist | None:
        """Decode the look-ahead's node at ``path``, below its parent's: its distribution (None: not
        decoded)."""
        position = self._root_pos + len(path) - 1
        seq = self._seq_below(self._path_node[path[:-1]], len(path) - 1)
        if self.ctx.seq_pos_max(seq) != position - 1:
            return None  # a cell past the parent in its sequence (seen over RPC with bushy trees)
        self._assign(-1 - len(self._path_node), path, seq)  # look-ahead nodes: negative keys
        dist = self._path_dist[path] = self._decode_top_k([path[-1]], [position], [(seq,)], 1)[0]
        return dist

    def drop_ahead(self) -> None:
        """Forget the look-ahead (a reply's end): its cells, past the committed prefix, go."""
        if self.ahead.left:
            self.ctx.seq_rm(self.ahead.seq, len(self.committed))
            self.ahead.forget()

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
        keep = self._path_seq[tuple(written[: decoded + 1])]  # None: the root alone (committed)
        if keep is None:
            for seq in self._used_seqs:
                self.ctx.seq_rm(seq, start)
        else:
            self._keep_branch(keep, self._used_seqs, start, start + decoded, keep_after=ahead)
        self.committed.extend(written[1 : decoded + 1])
        self.pending = written[decoded + 1 :]
        self.ahead.forget()
        n = len(written)
        if ahead and keep is not None:  # the paths below the new root still in ``keep``, keyed from it
            below = (p for p, seq in self._path_seq.items() if seq == keep and p[:n] == tuple(written))
            self.ahead.leave({p[n - 1 :]: self._path_dist[p] for p in below}, keep)
            # cells of ``keep`` deeper than what is known of them (an older look-ahead's) go
            self.ctx.seq_rm(keep, len(self.committed) - 1 + max(map(len, self.ahead.left)))


def look_ahead_during(target: Target, draft: Draft | None, tree: DraftTree, pending: Pending) -> None:
    """While a target on RPC servers decodes ``tree``, the draft looks ahead along its likeliest paths
    (``Draft.look_ahead``), hiding the next step's drafting when the target accepts one — after catching
    up, when the step drafted nothing. Nothing for a target on this machine (its decode is over already:
    work meanwhile would compete for the cores)."""
    if draft is None or not target.remote:
        return
    # the last decode of the same kind: the next tree is usually of the same size
    expected = target.verify_seconds if tree.size > 1 else target.plain_seconds
    draft.look_ahead(tree, pending.done, expected)
