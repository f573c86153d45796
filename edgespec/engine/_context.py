"""A llama context over a loaded model (``_model.py``): batches, decodes, logits rows, the KV cache's
sequences (llama-cpp-python 0.3.36 low-level API; ``llama-cpp-tree-batching.md`` for the rules).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING

import llama_cpp as C
import numpy as np

from ..errors import EngineError
from . import samplers
from ._model import Model, _Exclusive, native, release
from .ports import Pending, Verified
from .rows import RowsVerified
from .sampled import SampledVerified

if TYPE_CHECKING:
    from ._lora import LoraAdapter

Ints = Sequence[int] | np.ndarray  # token ids or positions: a list, a range or an array

LLAMA_MAX_SEQ = 256  # llama.cpp's compile-time limit on sequence ids per context


@dataclass(frozen=True)
class ContextSettings:
    n_ctx: int = 4096
    n_batch: int = 512  # also the largest tree a single decode may hold
    n_seq_max: int = 65  # sequence ids: one per leaf of the largest tree (≤ 256)
    n_threads: int = 0  # 0 → all cores
    flash_attn: bool | None = None  # None: llama.cpp decides (EngineSettings: off on a CPU)
    # where output rows are reduced: "numpy" (whole logits rows), "backend" (llama.cpp's samplers,
    # ``samplers.py``), "auto" (the backend in a GPU build); numpy always for a model on RPC servers
    reductions: str = "numpy"


class Context:
    """A ``kv_unified`` llama context with one reusable batch (``kv_unified`` is required: without it every
    sequence gets its own KV stream and a batch whose tokens belong to several sequences is rejected)."""

    def __init__(self, model: Model, settings: ContextSettings):
        if not 1 <= settings.n_seq_max <= LLAMA_MAX_SEQ:
            raise EngineError(f"n_seq_max must be in 1..{LLAMA_MAX_SEQ}, got {settings.n_seq_max}")
        params, threads = C.llama_context_default_params(), settings.n_threads or os.cpu_count() or 1
        params.n_ctx = settings.n_ctx
        params.n_batch = settings.n_batch
        params.n_ubatch = settings.n_batch  # a tree must never be split across ubatches
        params.n_seq_max = settings.n_seq_max
        params.kv_unified = True
        params.n_threads = threads
        params.n_threads_batch = threads
        flash = settings.flash_attn  # llama.cpp's enum: AUTO −1, DISABLED 0, ENABLED 1
        params.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_AUTO if flash is None else int(flash)
        params.no_perf = True
        self.model = model
        self.settings = settings
        self.reductions = samplers.resolve(
            settings.reductions, model.placement is not None, bool(C.llama_supports_gpu_offload())
        )
        self._chains: samplers.Chains | None = None  # attached to every sequence id, or None
        self._backend_ready = self.reductions == "backend"  # made for backend samplers (``use_reductions``)
        if self.reductions == "backend":
            params.n_outputs_max_per_seq = 0  # a tree has many outputs per sequence (the default: 1)
            self._chains = samplers.Chains(settings.n_seq_max, samplers.Keep(samplers.GREEDY_K))
            configs = self._chains.configs()  # read by llama_init_from_model only
            params.samplers, params.n_samplers = configs, len(configs)
        self.ptr = native(model.placement, C.llama_init_from_model, "creating the context")(model.ptr, params)
        if not self.ptr:
            raise EngineError(
                f"llama.cpp could not create a context of {settings.n_ctx} tokens for {model.path}: "
                "probably out of memory. Lower --ctx, or offload fewer layers."
            )
        self.n_ctx = int(C.llama_n_ctx(self.ptr))
        self.memory = C.llama_get_memory(self.ptr)
        self.n_vocab = model.n_vocab
        self._batch = C.llama_batch_init(settings.n_batch, 0, settings.n_seq_max)
        self._logits_view, self._logits_address = np.empty((0, self.n_vocab), np.float32), 0
        self._owner = _Exclusive(f"the llama context of {os.path.basename(model.path)}")
        self.decode_seconds = 0.0  # running total of time inside llama_decode (callers take differences)
        self.last_decode = 0.0  # the last decode's seconds, from its start to its end
        self.remote = model.placement is not None  # layers on RPC servers: decodes on the link's worker
        self._decode = native(model.placement, _decode_and_wait, "decoding")
        self._clear = native(model.placement, C.llama_memory_clear, "clearing the cache")

    def close(self) -> None:
        with self._owner:
            if self.ptr:
                C.llama_batch_free(self._batch)
                release(self.model.placement, C.llama_free, self.ptr)
                self.ptr = None
            if self._chains is not None:  # the context never frees its samplers
                self._chains.free()
                self._chains = None

    def _live(self) -> None:
        if not self.ptr:  # a NULL context would crash in C: say what happened instead
            raise EngineError("the model pair was already closed; load it again to continue.")

    # -- decoding ---------------------------------------------------------------------------------
    def decode(
        self, tokens: Ints, positions: Ints, seq_ids: Sequence[Sequence[int]], want_logits: Sequence[bool]
    ) -> None:
        """One ``llama_decode`` of a batch given token by token (parents before children)."""
        self.start_decode(tokens, positions, seq_ids, want_logits, overlap=False).result()

    def start_decode(
        self,
        tokens: Ints,
        positions: Ints,
        seq_ids: Sequence[Sequence[int]],
        want_logits: Sequence[bool],
        overlap: bool = True,
    ) -> Pending[None]:
        """``decode`` begun: for a model on RPC servers (and ``overlap``) it runs on the link's worker
        thread (``rpc.py``) while the caller works (the draft looks ahead), else it is over on return.
        The context is this caller's until ``result()``. Not overlapped on this machine: work meanwhile
        would compete for the cores."""
        n = len(tokens)
        if n > self.settings.n_batch:
            raise EngineError(f"a batch of {n} tokens exceeds n_batch={self.settings.n_batch}")
        self._owner.__enter__()  # released by ``_finish``
        try:
            self._live()
            self._fill(tokens, positions, seq_ids, want_logits)
            start = perf_counter()
            placement = self.model.placement
            if not overlap or placement is None:
                rc = self._decode(self.ptr, self._batch)  # waits for a GPU's asynchronous work too
                self.last_decode = perf_counter() - start
            else:
                done, wait = placement.start(self._timed_decode, (start,), "decoding")
        except BaseException:
            self._owner.__exit__()
            raise
        if not overlap or placement is None:
            self._finish(rc, n, start)  # releases the context, then raises on a failed decode
            return Pending.ready(None)
        return Pending(done, lambda: self._finish(wait, n, start))

    def _finish(self, rc, n: int, start: float) -> None:
        """A decode's end, ``rc`` its return code (or the function waiting for it on the RPC worker): the
        time counted, the context released."""
        try:
            rc = rc() if callable(rc) else rc
        finally:
            self.decode_seconds += perf_counter() - start
            self._owner.__exit__()
        if rc != 0:
            raise EngineError(_decode_failure(rc, n, self.n_ctx))

    def _timed_decode(self, start: float) -> int:
        """The decode as the RPC worker runs it, its own duration kept (the caller's work may outlast it)."""
        rc = _decode_and_wait(self.ptr, self._batch)
        self.last_decode = perf_counter() - start
        return rc

    def _fill(self, tokens, positions, seq_ids, want_logits) -> None:
        batch = self._batch
        for i, (token, position, ids, want) in enumerate(zip(tokens, positions, seq_ids, want_logits)):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, position, len(ids), want
            row = batch.seq_id[i]
            for j, s in enumerate(ids):
                row[j] = s
        batch.n_tokens = len(tokens)

    # -- outputs ----------------------------------------------------------------------------------
    @property
    def kept(self) -> samplers.Keep | None:
        """What each output row keeps (the chains'), or None: whole logits rows."""
        return self._chains.keep if self._chains is not None else None

    def keep(self, keep: samplers.Keep | None) -> None:
        """Backend reductions from now on keep this of each row (None: whole logits rows, for a request
        that needs every logit). Fresh chains replace the old ones (a chain attaches once); each change
        re-reserves the graph at the next decode."""
        if self.reductions != "backend" or keep == self.kept:
            return
        with self._owner:
            self._live()
            old, self._chains = self._chains, None
            if keep is None:
                samplers.detach_all(self.ptr, self.settings.n_seq_max)
            else:
                self._chains = samplers.Chains(self.settings.n_seq_max, keep)
                self._chains.attach(self.ptr)
            if old is not None:  # no longer in the context's map: the next decode builds without them
                old.free()

    def use_reductions(self, mode: str) -> None:
        """Switch a context made for backend reductions between them and numpy (a paired measurement:
        lab/scripts/reductions_ab.py); the backend's chains attach again at the next ``keep``."""
        if mode not in ("numpy", "backend") or (mode == "backend" and not self._backend_ready):
            raise EngineError(
                f"this context cannot switch to {mode!r} reductions: create it with reductions='backend'."
            )
        if mode == "numpy":
            self.keep(None)
        self.reductions = mode

    def verified(self, n_rows: int) -> Verified:
        """The last decode's output rows as a ``ports.Verified``: sampled rows (copies) or logits rows
        (a view, valid until the next decode)."""
        if self._chains is None:
            return RowsVerified(self.logits_rows(n_rows))
        ids, logits, _ = self.sampled_rows(n_rows)
        return SampledVerified(ids, logits, self.n_vocab)

    def sampled_rows(self, n_rows: int) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """Per output row of the last decode (``n_rows``: all of them), its sampled ids (int32), their
        logits (float32) and their probabilities (float32; none unless the chains keep them), copied."""
        ids, logits, probs = [], [], []
        with self._owner:
            self._live()
            for i in range(-n_rows, 0):  # negative: counted back from the last output (batch order)
                n = int(C.llama_get_sampled_candidates_count_ith(self.ptr, i))
                if n == 0 or int(C.llama_get_sampled_logits_count_ith(self.ptr, i)) != n:
                    raise EngineError(f"llama.cpp's sampler gave no output {i} (an edgespec bug).")
                row_ids = C.llama_get_sampled_candidates_ith(self.ptr, i)
                row_logits = C.llama_get_sampled_logits_ith(self.ptr, i)
                ids.append(np.ctypeslib.as_array(row_ids, (n,)).astype(np.int32))  # copies
                logits.append(np.ctypeslib.as_array(row_logits, (n,)).copy())
                n_probs = int(C.llama_get_sampled_probs_count_ith(self.ptr, i))
                row_probs = C.llama_get_sampled_probs_ith(self.ptr, i) if n_probs else None
                probs.append(np.ctypeslib.as_array(row_probs, (n_probs,)).copy() if n_probs else np.zeros(0))
        return ids, logits, probs

    def logits_rows(self, n_rows: int) -> np.ndarray:
        """Zero-copy, read-only (n_rows, V) view of the last decode's output rows, in batch order.

        Valid only until this context's next ``decode`` (llama.cpp reuses, and may reallocate, the
        buffer) or ``close``: every row is reduced (argmax, top-K, dense p) before the next decode,
        except mcsd-target-init's target-root row, which the decoder copies."""
        if self._chains is not None:  # llama.cpp copies no logits rows while every sequence is sampled
            raise EngineError("this context reduces its rows with backend samplers: no logits rows to read "
                              "(edgespec bug; --reductions numpy avoids it).")
        with self._owner:
            self._live()
            ptr = C.llama_get_logits(self.ptr)
            address = ctypes.addressof(ptr.contents)
        # The buffer moves only when a decode needs more outputs than were reserved: keep the widest
        # view at this address (a new one costs ~2 µs warm, ~50 µs right after a CPU decode).
        view = self._logits_view
        if address != self._logits_address or view.shape[0] < n_rows:
            view = np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab))
            view.flags.writeable = False
            self._logits_view, self._logits_address = view, address
        return view[:n_rows]

    def use_adapter(self, adapter: LoraAdapter | None, scale: float = 1.0) -> None:
        """Apply ``adapter`` to this context's decodes from now on (None: no adapter). The KV cache is
        not recomputed: cells decoded before the change keep the old weights' values."""
        with self._owner:
            self._live()
            if adapter is not None:
                adapter._live()
            n = int(adapter is not None)  # llama.cpp takes arrays: one adapter, or none
            adapters = (C.llama_adapter_lora_p_ctypes * 1)(adapter.ptr) if adapter is not None else None
            C.llama_set_adapters_lora(self.ptr, adapters, n, (ctypes.c_float * 1)(scale) if n else None)

    # -- KV memory --------------------------------------------------------------------------------
    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        """Remove ``seq`` from the cells at positions [p0, p1) (seq < 0: every sequence)."""
        with self._owner:
            self._live()
            removed = C.llama_memory_seq_rm(self.memory, seq, p0, p1)
        if not removed:
            raise EngineError(f"llama.cpp refused to remove positions {p0}..{p1} of sequence {seq}")

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Tag the cells of ``src`` at positions [p0, p1) with ``dst`` too (no data is copied)."""
        with self._owner:
            self._live()
            C.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        with self._owner:
            self._live()
            return int(C.llama_memory_seq_pos_max(self.memory, seq))

    def seq_state_bytes(self, seq: int) -> int:
        """Size of ``seq``'s saved state: a header plus a fixed amount per cell tagged with ``seq``,
        so two caches agree on it exactly when they hold the same number of cells for ``seq`` (a
        numerics-free check of the KV bookkeeping)."""
        with self._owner:
            self._live()
            return int(C.llama_state_seq_get_size(self.ptr, seq))

    def seq_state(self, seq: int) -> ctypes.Array:
        """``seq``'s cells (positions and KV) copied off the context, as a byte array."""
        with self._owner:
            self._live()
            size = int(C.llama_state_seq_get_size(self.ptr, seq))
            state = (ctypes.c_uint8 * size)()
            save = native(self.model.placement, C.llama_state_seq_get_data, "saving the cache")
            written = int(save(self.ptr, state, size, seq))
        if written != size:
            raise EngineError(f"llama.cpp saved {written} of {size} bytes of a sequence's KV cache")
        return state

    def set_seq_state(self, state: ctypes.Array, seq: int) -> bool:
        """Put a ``seq_state`` back as ``seq`` (its cells removed first); False if llama.cpp refuses it
        (then the sequence holds nothing)."""
        with self._owner:
            self._live()
            load = native(self.model.placement, C.llama_state_seq_set_data, "restoring the cache")
            return int(load(self.ptr, state, len(state), seq)) == len(state)

    def clear(self) -> None:
        with self._owner:
            self._live()
            self._clear(self.memory, True)


def _decode_and_wait(ctx, batch) -> int:
    rc = C.llama_decode(ctx, batch)
    C.llama_synchronize(ctx)  # a GPU backend computes asynchronously: the wait is decode time
    return rc


def _decode_failure(rc: int, n_tokens: int, n_ctx: int) -> str:
    known = {
        1: f"no room in the KV cache for {n_tokens} more tokens (context {n_ctx}). Start a new chat, raise "
        "--ctx, or use a smaller draft budget.",
        2: "decoding was aborted.",
        -1: f"llama.cpp rejected a batch of {n_tokens} tokens as invalid (sequence ids or positions). This "
        "is an edgespec bug: please report it with the command you ran.",
    }
    return known.get(rc, f"llama_decode failed with code {rc} (fatal backend error; set EDGESPEC_LLAMA_LOG=1 "
                     "for details).")
