"""The draft model: expands a tree level by level, one batched decode per level (the planners'
``Drafter``), or in one compiled call (the greedy chain, DySpec's greedy tree, OPT-Tree's levels), or —
ParallelSpec — drafts every depth at once; and its KV bookkeeping (``runners.CachedModel``)."""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import TYPE_CHECKING

from ..planner.tree import ChildRule, DraftTree, SparseDist, TreeBuilder
from ._llama import Context
from .runners import CachedModel

if TYPE_CHECKING:
    from ..planner.opt_tree import OptTreeLevels


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

    def sync(self, tokens: Sequence[int]) -> None:
        """Hold ``tokens[:-1]``; the last token is the pending root, decoded with the first level."""
        super().sync(tokens[:-1])
        self.pending = [int(tokens[-1])]

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
            counts, ids = [len(tagged)] * len(pending), tagged * len(pending)  # each token in every tagged id
            dists = self._decode_top_k(pending, positions, counts, ids, 1)
            self.committed.extend(pending)
            self._root_committed(tree)
        else:
            dists = self._decode_level(tree, nodes)
        self.decode_seconds += perf_counter() - start
        self.decodes += 1
        for node, dist in zip(nodes, dists):
            tree.dists[node] = dist
        return dists

    def _decode_top_k(self, tokens, positions, seq_counts, seq_ids, n_rows: int) -> list[SparseDist]:
        """One decode and its last ``n_rows`` rows' top-k in one compiled call (``Context.decode_top_k``:
        the numbers of ``draft_dists`` on its rows), as the rows' distributions."""
        k = min(self.top_k, self.vocab_limit)
        found, ids, probs = self.ctx.decode_top_k(
            tokens, positions, seq_counts, seq_ids, n_rows, k, self.temperature, self.vocab_limit,
            sorted(set(self.mask_ids)),
        )  # fmt: skip
        return SparseDist.from_rows(ids, probs, k, found)

    def greedy_chain(self, tree: TreeBuilder, length: int, p_min: float = 0.0) -> int:
        """The chain of the draft's top tokens below the root, drafted in one compiled call (no Python
        between its decodes); the same tokens, probabilities and KV cells as ``expand`` level by level.
        See ``Drafter.greedy_chain``."""
        if tree.size != 1:
            raise ValueError("greedy_chain drafts from the root alone (planner bug)")
        start = perf_counter()
        pending = self._catch_up(room=self.ctx.settings.n_batch)
        base = len(self.committed)
        chain_seq = len(self._used_seqs)  # the sequence _fresh_seq gives the root's first child
        decodes, tokens, probs = self.ctx.greedy_chain(
            pending, base, self.tagged_seqs, chain_seq, length, p_min, self.temperature, self.vocab_limit,
            sorted(set(self.mask_ids)),
        )  # fmt: skip
        # The bookkeeping of expand([0]), expand([1]), …: the root committed, nodes 1 … decodes − 1
        # decoded into chain_seq (each continuing its parent's), the last drafted token not decoded.
        self.committed.extend(pending)
        self._root_committed(tree)
        tree.graft(list(range(len(tokens))), tokens, probs, ChildRule.TOP)  # node d below node d − 1
        path = (int(tree.tokens[0]),)
        for node in range(1, min(decodes, len(tokens) + 1)):
            path = (*path, tokens[node - 1])
            self._node_seq[node] = chain_seq
            self._path_seq[path] = chain_seq
            if node > 1:
                self._seq_taken.add(node - 1)
        if decodes > 1:
            self._used_seqs.append(chain_seq)
        self.decode_seconds += perf_counter() - start
        self.decodes += decodes
        return decodes

    def greedy_dyspec(self, tree: TreeBuilder, budget: int, max_passes: int = 0) -> tuple[int, int]:
        """DySpec's greedy tree drafted in one compiled call (no Python between its decodes); the same
        nodes, distributions and KV cells as ``dyspec_by_levels`` through ``expand``. See
        ``Drafter.greedy_dyspec``."""
        if tree.size != 1:
            raise ValueError("greedy_dyspec drafts from the root alone (planner bug)")
        if budget < 1:
            return 0, 0
        banned = sorted(set(self.mask_ids))
        decodes, sizes = self._tree_in_c(
            tree,
            lambda pending, base, n_tagged, k: self.ctx.greedy_tree(
                pending, base, n_tagged, budget, max_passes, k, self.temperature, self.vocab_limit, banned
            ),
        )
        return decodes, sum(sizes)

    def grow_opt_tree(self, tree: TreeBuilder, levels: OptTreeLevels) -> list[int]:
        """OPT-Tree drafted in one compiled call (no Python between its decodes): the same kept nodes,
        distributions and KV cells as ``opt_tree_by_levels`` through ``expand``, and the same bookkeeping
        for the kept nodes (only they come back). See ``Drafter.grow_opt_tree``."""
        if tree.size != 1:
            raise ValueError("grow_opt_tree drafts from the root alone (planner bug)")
        banned = sorted(set(self.mask_ids))
        return self._tree_in_c(
            tree,
            lambda pending, base, n_tagged, k: self.ctx.opt_tree(
                pending, base, n_tagged, levels, k, self.temperature, self.vocab_limit, banned
            ),
        )[1]

    def _tree_in_c(self, tree: TreeBuilder, call) -> tuple[int, list[int]]:
        """A tree grown from the root by a compiled call — ``call(pending, committed length, tagged ids,
        k)`` returns (decodes, each decode's evaluated nodes, *the tree as ``_adopt`` takes it) — with
        ``expand``'s bookkeeping; returns (decodes, the nodes each decode evaluated)."""
        start = perf_counter()
        pending = self._catch_up(room=self.ctx.settings.n_batch)
        k = min(self.top_k, self.vocab_limit)
        decodes, sizes, *grown = call(pending, len(self.committed), len(self.tagged_seqs), k)
        self._adopt(tree, pending, k, *grown)
        self.decode_seconds += perf_counter() - start
        self.decodes += decodes
        return decodes, sizes

    def _adopt(
        self, tree: TreeBuilder, pending: list[int], k: int, parents: list[int], tokens: list[int],
        probs: list[float], evaluated: list[int], seqs: list[int], ids: bytes, top_probs: bytes,
        found: list[int], taken: list[int], n_used: int, n_tagged: int,
    ) -> None:  # fmt: skip
        """Take a tree a compiled call drafted (``engine/_tree_draft.h``'s result) with the bookkeeping of
        ``expand`` level by level: the root committed, each evaluated node decoded in its sequence (the
        root: the committed prefix) with its top-k in ``tree.dists``, the fresh ids used, the prefix
        tagged with them."""
        self.committed.extend(pending)
        self._root_committed(tree)
        tree.graft(parents, tokens, probs, ChildRule.TOP)
        paths = {0: (int(tree.tokens[0]),)}  # each evaluated node's token path (its parent came first)
        dists = SparseDist.from_rows(ids, top_probs, k, found)
        for node, seq, dist in zip(evaluated, seqs, dists):
            tree.dists[node] = dist
            if node:
                paths[node] = (*paths[tree.parents[node]], tree.tokens[node])
            self._node_seq[node] = seq if seq >= 0 else None
            self._path_seq[paths[node]] = self._node_seq[node]
        self._seq_taken.update(taken)
        self._used_seqs = list(range(n_used))
        self.tagged_seqs = tuple(range(n_tagged))

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
        counts, ids = [len(tagged)] * n + [1] * k, [*tagged * n, *[0] * k]  # pending: every tagged id
        # the rows of the root and of every mask: the last k + 1 tokens
        dists = self._decode_top_k(pending + masks, range(base, base + n + k), counts, ids, k + 1)
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
        return self._decode_top_k(tokens, positions, [1] * len(nodes), seqs, len(nodes))

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
