"""The target model and what both models share: their KV bookkeeping (the draft: ``engine/draft.py``).

Invariant for both caches: the committed tokens occupy positions [0, n) and every committed cell
carries the sequence ids 0 … w−1 (``tagged_seqs``; ids ≥ w are in no cell), so any id < w used by a
tree token sees the whole prefix. w grows on demand: before a tree first uses an id ≥ w, the
committed prefix is tagged with it once (one ``seq_cp`` of the prefix per new id, ever). Speculative
cells (positions ≥ n) carry only the ids of their own branch. After a step only the new positions are
touched: the accepted path's cells are re-tagged with the w ids, the rest removed — so a step costs
w − 1 ``seq_cp`` calls (w: the most ids any step has used: 1 for a chain), not n_seq_max − 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..planner.tree import DraftTree
from ._context import Context
from .interrupts import Cancelled
from .layout import tree_layout
from .ports import Joined, Pending, Prefilled, Sampling, Verified
from .samplers import Keep, kept_per_row

# Tokens a cancellable decode (a prompt a client may abandon) takes at a time: a client that leaves
# frees the model within one chunk's decode; 512 (n_batch) would be the whole of most prompts. Chunks
# of 128 cost no measurable prompt speed on a 2-core CPU (0.97x the time of 512s, within noise:
# lab/notebook/lean-step.md, lab/scripts/prefill_chunks.py).
CANCEL_CHUNK = 128


class CachedModel:
    """A model, its context, and the committed token sequence its KV cache holds."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.model = ctx.model
        self.n_seq = ctx.settings.n_seq_max
        self.tagged_seqs: tuple[int, ...] = (0,)  # the ids every committed cell carries: 0 … w−1
        self.committed: list[int] = []
        self.sizes_decoded: set[int] = set()  # batch sizes decoded (the target's: ``Prepaid.sizes``)

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def llama_seconds(self) -> float:
        """Time inside this model's decodes so far (a running total: take differences)."""
        return self.ctx.decode_seconds

    @property
    def remote(self) -> bool:
        """Whether its layers run on RPC servers (a decode waits on the network: work may overlap it)."""
        return self.ctx.remote

    def close(self) -> None:
        self.ctx.close()

    def sync(self, tokens: Sequence[int]) -> int:
        """Make the cache hold exactly ``tokens``, keeping the longest common prefix already there;
        returns how many tokens were kept (the rest were decoded)."""
        keep = self.keep_prefix(tokens)
        self.decode_committed(tokens[keep:], want_last=False)
        return keep

    def keep_prefix(self, tokens: Sequence[int]) -> int:
        """Drop what follows the longest common prefix of the cache and ``tokens``; returns its length."""
        keep = common_prefix(self.committed, tokens)
        self.ctx.seq_rm(-1, keep)  # also drops speculative cells a failed step may have left
        del self.committed[keep:]
        return keep

    def decode_committed(self, tokens: Sequence[int], want_last: bool, cancel=None) -> np.ndarray | None:
        """Decode a chain of tokens into the committed prefix (every tagged sequence id); returns the last
        token's logits row when asked (None under backend samplers). ``cancel`` (an event): checked before
        each chunk of ``CANCEL_CHUNK`` tokens; once set, what is decoded stays committed and ``Cancelled``
        is raised."""
        decoded = self.start_committed(tokens, want_last, cancel, overlap=False).result()
        return self.ctx.logits_rows(1)[0] if decoded and self.ctx.kept is None else None

    def start_committed(
        self, tokens: Sequence[int], want_last: bool, cancel=None, overlap: bool = True
    ) -> Pending[bool]:
        """``decode_committed`` with its last chunk begun (``Context.start_decode``), not waited for; its
        result: whether the last token's output was decoded (``want_last`` and a token to decode)."""
        step = self.ctx.settings.n_batch if cancel is None else min(CANCEL_CHUNK, self.ctx.settings.n_batch)
        if not tokens:
            return Pending.ready(False)
        for start in range(0, len(tokens), step):
            if cancel is not None and cancel.is_set():
                raise Cancelled
            chunk = [int(t) for t in tokens[start : start + step]]
            base = len(self.committed)
            final = start + step >= len(tokens)
            want = [want_last and final and i == len(chunk) - 1 for i in range(len(chunk))]
            positions, seqs = range(base, base + len(chunk)), [self.tagged_seqs] * len(chunk)
            pending = self.ctx.start_decode(chunk, positions, seqs, want, overlap and final)
            self.sizes_decoded.add(len(chunk))
            if not final:
                pending.result()
                self.committed.extend(chunk)
        return pending.then(lambda _: self._extend(chunk, want_last))

    def _extend(self, chunk: list[int], want_last: bool) -> bool:
        self.committed.extend(chunk)
        return want_last

    def _tag_prefix(self, n_ids: int, end: int) -> None:
        """Grow w to ``n_ids``: tag the committed cells [0, ``end``) with each new id (from id 0, which
        carries them; its speculative cells, at positions ≥ ``end``, are left alone)."""
        if n_ids > self.n_seq:
            raise ValueError(f"a tree needs {n_ids} sequence ids, the context has {self.n_seq}")
        for seq in range(len(self.tagged_seqs), n_ids):
            self.ctx.seq_cp(0, seq, 0, end)
        self.tagged_seqs = tuple(range(max(n_ids, len(self.tagged_seqs))))

    def _keep_branch(
        self, keep_seq: int, used_seqs: Sequence[int], start: int, end: int, keep_after: bool = False
    ) -> None:
        """Commit the cells of ``keep_seq`` in [start, end) and drop every other speculative cell.

        1. ``keep_seq`` leaves the cells after the accepted path (its rejected descendants), unless
           ``keep_after`` (the draft's look-ahead past them: ``Draft.commit``);
        2. every other used sequence leaves all speculative positions;
        3. the accepted cells are tagged with the w ids, joining the committed prefix.
        """
        if not keep_after:
            self.ctx.seq_rm(keep_seq, end)
        for seq in used_seqs:
            if seq != keep_seq:
                self.ctx.seq_rm(seq, start)
        if end > start:
            for seq in self.tagged_seqs:
                if seq != keep_seq:
                    self.ctx.seq_cp(keep_seq, seq, start, end)


def _last_output(ctx: Context, decoded: bool) -> Verified:
    """The output of a chain's last token (a chain of at least one token, decoded with ``want_last``)."""
    if not decoded:
        raise ValueError("no token was decoded (engine bug)")
    return ctx.verified(1)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Target(CachedModel):
    """The target: verifies a whole tree in one decode."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        # end-of-turn and chat-template tokens (copies stop before them); read at load, not on a first step
        self.turn_tokens = self.model.turn_tokens()
        self.verify_seconds = 0.0  # the last tree's verify (what a look-ahead may overlap)
        self.plain_seconds = 0.0  # the last plain decode's (``decode_root``)
        self._layout = tree_layout((-1,))  # the last verified tree's (``commit`` keeps a path of it)

    def use_sampling(self, sampling: Sampling) -> None:
        """The sampling rule the next decodes' outputs are read under (``ports.Target.use_sampling``):
        what backend reductions keep per row (``samplers.kept_per_row``)."""
        k = kept_per_row(sampling)
        self.ctx.keep(Keep(k) if k is not None else None)

    def start_prefill(self, prompt: Sequence[int], cancel=None) -> Pending[Prefilled]:
        """Hold ``prompt``, keeping the longest prefix of ``prompt[:-1]`` already held and decoding the
        rest, its last token with logits (the distribution of the reply's first token; valid until the
        next decode); ``cancel``: as ``decode_committed``'s."""
        keep = self.keep_prefix(prompt[:-1])
        pending = self.start_committed(prompt[keep:], want_last=True, cancel=cancel)
        return pending.then(lambda decoded: Prefilled(_last_output(self.ctx, decoded), keep))

    def decode_root(self, root: int) -> Verified:
        """Plain decoding: the root alone, straight into the committed prefix."""
        return self._start_root(root, overlap=False).result()

    def _start_root(self, root: int, overlap: bool) -> Pending[Verified]:
        def done(decoded: bool) -> Verified:
            self.plain_seconds = self.ctx.last_decode
            return _last_output(self.ctx, decoded)

        return self.start_committed([root], want_last=True, overlap=overlap).then(done)

    def start_verify(self, tree: DraftTree, root: Verified | None = None) -> Pending[Verified]:
        """Decode the packed tree: one output per node (``ports.Target.start_verify``). Over RPC the
        decode runs while the caller works (the draft's look-ahead, ``ModelPair.overlap``)."""
        layout = self._layout = tree_layout(tree.parent_ids)
        self._tag_prefix(layout.n_leaves, len(self.committed))  # every leaf id sees the prefix
        if root is not None:  # the root is committed (mcsd-target-init): only the drafted nodes
            root = root.detach()  # kept past this decode
            if tree.size == 1:
                return Pending.ready(root)
            n, base = tree.size - 1, len(self.committed) - 1  # base: the committed root's position
            self.ctx.decode(tree.tokens[1:], base + layout.depth[1:], layout.seq_ids[1:], [True] * n)
            self.sizes_decoded.add(n)
            return Pending.ready(Joined(root, self.ctx.verified(n)))
        if tree.size == 1:  # nothing drafted: plain decoding, committed at once
            return self._start_root(tree.token_ids[0], overlap=True)
        positions = len(self.committed) + layout.depth
        pending = self.ctx.start_decode(tree.tokens, positions, layout.seq_ids, [True] * tree.size)
        self.sizes_decoded.add(tree.size)

        def done(_) -> Verified:
            self.verify_seconds = self.ctx.last_decode
            return self.ctx.verified(tree.size)

        return pending.then(done)

    def commit(self, tree: DraftTree, path: Sequence[int], root_committed: bool = False) -> None:
        """Keep exactly the accepted path (root first) of the tree verified last in the cache (the root
        is already there when ``root_committed``)."""
        if tree.size == 1:  # start_verify() or decode_root() already committed the root
            return
        skip = int(root_committed)
        base = len(self.committed) - skip  # the root's position
        leaf = self._layout.leaf_below[path[-1]]
        self._keep_branch(leaf, range(self._layout.n_leaves), base + skip, base + len(path))
        self.committed.extend(tree.token_ids[node] for node in path[skip:])
