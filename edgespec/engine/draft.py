"""The draft model: expands a tree level by level, one batched decode per level (the planners'
``Drafter``), or — ParallelSpec — drafts every depth at once; and its KV bookkeeping
(``runners.CachedModel``)."""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter

from ..planner.tree import DraftTree, SparseDist, TreeBuilder
from ._llama import Context
from .rows import draft_dists
from .runners import CachedModel


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

    def absorb(self, limit: int) -> bool:
        """Between replies: decode up to ``limit`` pending tokens into the committed prefix (never the
        last, the root: the next prompt decides what follows it). True while more are left to absorb."""
        todo = self.pending[: max(0, min(limit, len(self.pending) - 1))]
        if todo:
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

    def expand(self, tree: TreeBuilder, nodes: Sequence[int]) -> list[SparseDist]:
        start = perf_counter()
        if list(nodes) == [0]:
            # The root: catch up on what the target committed last step (accepted tokens the draft never
            # decoded, then the new root), straight into the committed prefix (every tagged id).
            pending = self._catch_up(room=self.ctx.settings.n_batch)
            base, tagged = len(self.committed), self.tagged_seqs
            positions = range(base, base + len(pending))
            dists = self._decode_top_k(pending, positions, [tagged] * len(pending), 1)  # in every tagged id
            self.committed.extend(pending)
            self._root_committed(tree)
        else:
            dists = self._decode_level(tree, nodes)
        self.decode_seconds += perf_counter() - start
        self.decodes += 1
        for node, dist in zip(nodes, dists):
            tree.dists[node] = dist
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
        self._node_seq[0] = None
        self._path_seq[(int(tree.tokens[0]),)] = None

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
        seqs = []
        for node in nodes:
            parent = tree.parents[node]
            if parent not in self._node_seq:
                raise ValueError(f"node {node} expanded before its parent {parent} (planner bug)")
            parent_seq = self._node_seq[parent]
            if parent_seq is not None and parent not in self._seq_taken:
                seq = parent_seq  # the first child continues its parent's sequence: no copy needed
                self._seq_taken.add(parent)
            else:
                seq = self._fresh_seq()
                if parent_seq is not None:  # see the parent's path: tag it with the new id
                    self.ctx.seq_cp(
                        parent_seq, seq, self._root_pos + 1, self._root_pos + tree.depth[parent] + 1
                    )
            self._node_seq[node] = seq
            self._path_seq[tuple(tree.path_tokens(node))] = seq
            seqs.append(seq)
        positions = [self._root_pos + tree.depth[node] for node in nodes]
        tokens = [tree.tokens[node] for node in nodes]
        return self._decode_top_k(tokens, positions, [(seq,) for seq in seqs], len(nodes))

    def _fresh_seq(self) -> int:
        seq = len(self._used_seqs)
        if seq >= self.n_seq:
            raise ValueError(
                f"the tree needs more than {self.n_seq} draft sequences (planner exceeded max_nodes)"
            )
        self._tag_prefix(seq + 1, self._root_pos + 1)  # the committed prefix ends at the root
        self._used_seqs.append(seq)
        return seq

    def commit(self, tree: DraftTree, path: Sequence[int], next_token: int) -> None:
        """Keep the decoded part of the accepted path; queue the rest and the new root."""
        path_tokens = [tree.token_ids[node] for node in path]
        accepted_tokens = path_tokens[1:]
        if not self._path_seq:  # nothing was drafted: the old root is still pending too
            self.pending.extend(accepted_tokens + [int(next_token)])
            return
        # The decoded part of the accepted path is a prefix of it (a node is decoded after its parent).
        decoded = 0
        while decoded < len(accepted_tokens) and tuple(path_tokens[: decoded + 2]) in self._path_seq:
            decoded += 1
        start = self._root_pos + 1
        if decoded:
            end = start + decoded
            self._keep_branch(self._path_seq[tuple(path_tokens[: decoded + 1])], self._used_seqs, start, end)
        else:
            for seq in self._used_seqs:
                self.ctx.seq_rm(seq, start)
        self.committed.extend(accepted_tokens[:decoded])
        self.pending = accepted_tokens[decoded:] + [int(next_token)]
