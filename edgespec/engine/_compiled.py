"""The compiled loops on a llama context: the draft's greedy chain (``_chain.c``), DySpec's greedy tree
(``_dyspec.c``), OPT-Tree's levels (``_opt_tree.c``), one draft level with its rows' top-k (``_level.c``) and
the target's greedy verification (``_verify.c``), each one call with the GIL released and no Python between
its decodes; their failures as ``EngineError`` with what to do.

``CompiledLoops`` is a part of ``_llama.Context`` (its ``ptr``, ``memory``, batch, settings and lock).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import EngineError
from . import _chain, _dyspec, _level, _opt_tree, _verify
from ._backend import address

if TYPE_CHECKING:
    from ..planner.opt_tree import OptTreeLevels


class CompiledLoops:
    """``Context``'s calls into the compiled loops (mixed into ``_llama.Context``)."""

    def greedy_chain(
        self,
        first_tokens: Sequence[int],
        first_position: int,
        first_seq_ids: Sequence[int],
        chain_seq: int,
        length: int,
        p_min: float,
        temperature: float,
        vocab_limit: int,
        banned: Sequence[int],
    ) -> tuple[int, list[int], list[float]]:
        """Draft a greedy chain in one compiled call (``engine/_chain.c``); returns the decodes made, the
        chain's tokens and their full-softmax probabilities.

        First ``first_tokens`` at ``first_position`` … in ``first_seq_ids`` (the root last: its row is
        the first level's), then each level's top allowed id (not in ``banned``, ascending; below
        ``vocab_limit``) is drafted and decoded into ``chain_seq`` at the next position — except the
        ``length``-th, and one whose probability is below ``p_min``: drafting stops after either."""
        return self._draft_in_c(
            len(first_tokens), 1,
            lambda ctx, batch: _chain.greedy_chain(
                ctx, batch, self.settings.n_batch, self.settings.n_seq_max, first_tokens, first_position,
                first_seq_ids, chain_seq, length, p_min, temperature, vocab_limit, banned,
                self.settings.row_helper,
            ),
        )  # fmt: skip

    def greedy_tree(
        self, first_tokens: Sequence[int], first_position: int, n_tagged: int, budget: int, max_passes: int,
        k: int, temperature: float, vocab_limit: int, banned: Sequence[int],
    ) -> tuple:  # fmt: skip
        """Draft DySpec's greedy tree in one compiled call (``engine/_dyspec.c``; its ``result`` lists what
        comes back after rc, decodes and seconds). First ``first_tokens`` at ``first_position`` … in
        sequences 0 … ``n_tagged`` − 1 (the root last), then the tree's levels."""
        return self._draft_in_c(
            len(first_tokens), budget,
            lambda ctx, batch: _dyspec.greedy_tree(
                ctx, address(self.memory), batch, self.settings.n_batch, self.settings.n_seq_max,
                first_tokens, first_position, n_tagged, budget, max_passes, k, temperature,
                vocab_limit, banned, self.settings.row_helper,
            ),
        )  # fmt: skip

    def opt_tree(
        self, first_tokens: Sequence[int], first_position: int, n_tagged: int, levels: OptTreeLevels, k: int,
        temperature: float, vocab_limit: int, banned: Sequence[int],
    ) -> tuple:  # fmt: skip
        """Draft OPT-Tree in one compiled call (``engine/_opt_tree.c``; a result shaped as ``greedy_tree``'s,
        holding the kept nodes only). First ``first_tokens`` at ``first_position`` … in sequences
        0 … ``n_tagged`` − 1 (the root last), then a level per decode as ``levels`` says, then step 4."""
        sizing = levels.sizing
        return self._draft_in_c(
            len(first_tokens), levels.n,
            lambda ctx, batch: _opt_tree.opt_tree(
                ctx, address(self.memory), batch, self.settings.n_batch, self.settings.n_seq_max,
                first_tokens, first_position, n_tagged, levels.n, levels.capacity, levels.max_depth,
                levels.threshold, levels.level_cost or (), sizing.level_seconds if sizing else (),
                sizing.overhead if sizing else 0.0, sizing.verify_seconds if sizing else (), k, temperature,
                vocab_limit, banned,
                self.settings.row_helper,
            ),
        )  # fmt: skip

    def greedy_verify(
        self, tokens: Sequence[int], parents: Sequence[int], child_rule: Sequence[int], first_position: int,
        seq_counts: Sequence[int], seq_ids: Sequence[int],
    ) -> tuple[list[int], int, list[float]]:  # fmt: skip
        """Decode a packed tree and walk it greedily in one compiled call (``engine/_verify.c``): node i
        at ``first_position`` + its depth in its ``seq_counts[i]`` ids of ``seq_ids``, every row asked
        for. Returns the accepted path (node indices, root first), the target's own next token, and its
        top-1 − top-2 margin at each path node. The rows are not kept: ``logits_rows`` still has them."""
        if len(tokens) > self.settings.n_batch:
            raise EngineError(f"a batch of {len(tokens)} tokens exceeds n_batch={self.settings.n_batch}")
        with self._owner:
            self._live()
            rc, seconds, path, next_token, margins = _verify.greedy_verify(
                address(self.ptr), ctypes.addressof(self._batch), self.settings.n_batch,
                self.settings.n_seq_max, self.n_vocab, tokens, parents, child_rule, first_position,
                seq_counts, seq_ids, self.settings.row_helper,
            )  # fmt: skip
        self.decode_seconds += seconds
        if rc == -4:
            raise ValueError("greedy_verify walks no LONGEST node (mcsd-target-init verifies in Python)")
        if rc == -2:
            raise EngineError("llama.cpp returned no logits row for a verified node (please report this)")
        if rc != 0:
            raise EngineError(_decode_failure(rc, len(tokens), self.n_ctx))
        return path, next_token, margins

    def decode_top_k(
        self, tokens: Sequence[int], positions: Sequence[int], seq_counts: Sequence[int],
        seq_ids: Sequence[int], n_rows: int, k: int, temperature: float, vocab_limit: int,
        banned: Sequence[int],
    ) -> tuple[list[int], bytes, bytes]:  # fmt: skip
        """One decode and its last ``n_rows`` rows' top-k in one compiled call (``engine/_level.c``): what
        ``decode`` + ``logits_rows`` + ``decoding.sampling.draft_dists`` compute, the same numbers. Token i
        at ``positions[i]`` in its ``seq_counts[i]`` ids of ``seq_ids``; ``banned`` ascending and unique.
        Returns each row's count of valid candidates, and the ids (int32) and probabilities (float64) as
        bytes, k per row."""
        if len(tokens) > self.settings.n_batch:
            raise EngineError(f"a batch of {len(tokens)} tokens exceeds n_batch={self.settings.n_batch}")
        with self._owner:
            self._live()
            rc, seconds, ids, probs, found = _level.decode_top_k(
                address(self.ptr), ctypes.addressof(self._batch), self.settings.n_batch,
                self.settings.n_seq_max, self.n_vocab, tokens, positions, seq_counts, seq_ids, n_rows, k,
                temperature, vocab_limit, banned, self.settings.row_helper,
            )  # fmt: skip
        self.decode_seconds += seconds
        if rc == -2:
            raise EngineError("llama.cpp returned no logits row for a drafted token (please report this)")
        if rc != 0:
            raise EngineError(_decode_failure(rc, len(tokens), self.n_ctx))
        return found, ids, probs

    def _draft_in_c(self, n_first: int, n_later: int, call) -> tuple:
        """Run a compiled drafting loop on this context: ``call(context address, batch address)`` returns
        (rc, decodes, seconds, *drafted); its decode time is added here, a failure becomes an error (-2:
        no logits row, -3: out of sequence ids, else llama_decode's code for the first batch of
        ``n_first`` tokens or a later one of at most ``n_later``; -5: a tree larger than its call allowed).
        Returns (decodes, *drafted)."""
        if n_first > self.settings.n_batch:
            raise EngineError(f"a batch of {n_first} tokens exceeds n_batch={self.settings.n_batch}")
        with self._owner:
            self._live()
            rc, decodes, seconds, *drafted = call(address(self.ptr), ctypes.addressof(self._batch))
        self.decode_seconds += seconds
        if rc == -3:
            n_seq = self.settings.n_seq_max
            raise ValueError(f"the tree needs more than {n_seq} draft sequences (planner exceeded max_nodes)")
        if rc == -5:
            raise ValueError("the compiled tree outgrew the room it was sized for (please report this)")
        if rc == -2:
            raise EngineError("llama.cpp returned no logits row for a drafted token (please report this)")
        if rc != 0:
            raise EngineError(_decode_failure(rc, n_first if decodes == 1 else n_later, self.n_ctx))
        return decodes, *drafted


def _decode_failure(rc: int, n_tokens: int, n_ctx: int) -> str:
    if rc == 1:
        return (
            f"no room in the KV cache for {n_tokens} more tokens (context {n_ctx}). Start a new chat, "
            "raise --ctx, or use a smaller draft budget."
        )
    if rc == 2:
        return "decoding was aborted."
    if rc == -1:
        return (
            f"llama.cpp rejected a batch of {n_tokens} tokens as invalid (sequence ids or positions). "
            "This is an edgespec bug: please report it with the command you ran."
        )
    return f"llama_decode failed with code {rc} (fatal backend error; set EDGESPEC_LLAMA_LOG=1 for details)."
