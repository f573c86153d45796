"""Models and contexts: every call into a loaded model lives here (llama-cpp-python 0.3.36 low-level API;
the backend as a whole — start-up, build features, the AMX guard — is ``_backend.py``).

Thin owning wrappers in the style of llama-cpp-python's own ``_internals``: each C resource has one
owner with ``close()``, and non-zero return codes become ``EngineError`` with what to do.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING

import llama_cpp as C
import numpy as np

from ..errors import EngineError
from ._backend import _ensure_backend, amx_guard
from .gguf_header import n_layers
from .plain_text import as_text

if TYPE_CHECKING:
    from ._lora import LoraAdapter
    from .rpc import Placement

LLAMA_MAX_SEQ = 256  # llama.cpp's compile-time limit on sequence ids per context


class _Exclusive:
    """One caller at a time. llama.cpp's model and context objects are not thread-safe: two threads
    decoding (or one decoding while another frees) corrupt memory. A second caller gets an
    ``EngineError`` at once instead — a misuse becomes a message, not a segfault."""

    def __init__(self, what: str):
        self.what = what
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise EngineError(
                f"{self.what} is already in use by another thread: one model pair serves one generation at "
                "a time. This is an edgespec bug: please report it with what you were doing."
            )

    def __exit__(self, *exc) -> None:
        self._lock.release()


class Model:
    """A loaded GGUF (weights + vocabulary)."""

    def __init__(
        self, path: str, n_gpu_layers: int = 0, repack: bool = True, placement: Placement | None = None
    ):
        """``placement``: the RPC servers' devices and this machine's (engine/rpc.py); None: here only."""
        _ensure_backend()
        params = C.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        # Extra buffer types are the repacked CPU kernels and, in an AMX build on an AMX CPU, the
        # crashing AMX ones: off there (see amx_guard), on elsewhere unless asked otherwise.
        self.repack = repack and not amx_guard()
        params.use_extra_bufts = self.repack
        self.path = path
        self.placement = placement
        self._owner = _Exclusive(f"the model {os.path.basename(path)}")
        if placement is not None:
            placement.check_fit(path)
            placement.apply(params, n_layers(path))
        load = native(placement, C.llama_model_load_from_file, "loading the target")
        self.ptr = load(path.encode("utf-8"), params)
        if not self.ptr and placement is not None:
            raise EngineError(placement.load_failed(path))
        if not self.ptr:
            raise EngineError(
                f"llama.cpp could not load {path}. Check that the file is a complete GGUF "
                "(`edgespec models verify`) and that this llama-cpp-python build supports its architecture; "
                "set EDGESPEC_LLAMA_LOG=1 to see llama.cpp's own messages."
            )
        self.vocab = C.llama_model_get_vocab(self.ptr)
        self.n_vocab = int(C.llama_vocab_n_tokens(self.vocab))

    def close(self) -> None:
        with self._owner:
            if self.ptr:
                release(self.placement, C.llama_model_free, self.ptr)
                self.ptr = None

    def _live(self) -> None:
        # Vocabulary reads are thread-safe in llama.cpp (immutable after load); use after free is not.
        if not self.ptr:
            raise EngineError(f"the model {self.path} was already closed; load it again to continue.")

    # -- vocabulary -------------------------------------------------------------------------------
    @property
    def vocab_type(self) -> int:
        return int(C.llama_vocab_type(self.vocab))

    def token_text(self, token: int) -> bytes:
        self._live()
        return C.llama_vocab_get_text(self.vocab, token) or b""

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self.vocab, token))

    def turn_tokens(self) -> frozenset[int]:
        """End-of-generation and control tokens (``<|im_end|>``, ``<|im_start|>``, …): where a turn of
        the conversation ends or the chat template speaks. A pass over the vocabulary (~0.1 s for 152k
        ids): the target reads it once, at load."""
        self._live()
        vocab, control, eog = self.vocab, C.llama_vocab_is_control, C.llama_vocab_is_eog
        return frozenset(t for t in range(self.n_vocab) if control(vocab, t) or eog(vocab, t))

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """Fill-in-the-middle's prefix, suffix and middle tokens (``<|fim_prefix|>`` …), or None when
        the vocabulary has none."""
        ids = tuple(
            int(f(self.vocab)) for f in (C.llama_vocab_fim_pre, C.llama_vocab_fim_suf, C.llama_vocab_fim_mid)
        )
        return None if min(ids) < 0 else ids

    def meta(self, key: str) -> str | None:
        self._live()
        buf = ctypes.create_string_buffer(512)
        n = C.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def n_ctx_train(self) -> int:
        return int(C.llama_model_n_ctx_train(self.ptr))

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        self._live()
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        # without special-token parsing, text is text: even the added tokens it spells (plain_text.py)
        return list(buf[:n]) if parse_special else as_text(self, text, list(buf[:n]), add_special)

    def piece(self, token: int, special: bool = False) -> bytes:
        self._live()
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def chat_template(self) -> str | None:
        self._live()
        tmpl = C.llama_model_chat_template(self.ptr, None)
        return tmpl.decode("utf-8") if tmpl else None

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_assistant: bool = True) -> str:
        self._live()
        tmpl = C.llama_model_chat_template(self.ptr, None)
        if not tmpl:
            raise EngineError(
                f"{self.path} has no chat template; use `edgespec generate --raw` for plain text."
            )
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        chat = (C.llama_chat_message * len(keep))(*[C.llama_chat_message(r, c) for r, c in keep])
        cap = sum(len(c) for _, c in keep) * 2 + 1024
        buf = ctypes.create_string_buffer(cap)
        n = C.llama_chat_apply_template(tmpl, chat, len(keep), add_assistant, buf, cap)
        if n > cap:
            buf = ctypes.create_string_buffer(n + 1)
            n = C.llama_chat_apply_template(tmpl, chat, len(keep), add_assistant, buf, n + 1)
        if n < 0:
            raise EngineError(f"llama.cpp does not know the chat template of {self.path}.")
        return buf.raw[:n].decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ContextSettings:
    n_ctx: int = 4096
    n_batch: int = 512  # also the largest tree a single decode may hold
    n_seq_max: int = 65  # sequence ids: one per leaf of the largest tree (≤ 256)
    n_threads: int = 0  # 0 → all cores
    flash_attn: bool | None = None  # None: llama.cpp decides (EngineSettings: off on a CPU)


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

    def _live(self) -> None:
        if not self.ptr:  # a NULL context would crash in C: say what happened instead
            raise EngineError("the model pair was already closed; load it again to continue.")

    # -- decoding ---------------------------------------------------------------------------------
    def decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        seq_ids: Sequence[Sequence[int]],
        want_logits: Sequence[bool],
        meanwhile: Callable[[threading.Event], None] | None = None,
    ) -> None:
        """One ``llama_decode`` of a batch given token by token (parents before children).

        ``meanwhile(done)``: work to do while a model on RPC servers decodes — the decode runs on the
        link's worker thread (``rpc.py``) and ``done`` is set when it is over; the decode's result is
        waited for after it. Not called for a model on this machine (it would compete for the cores)."""
        n = len(tokens)
        if n > self.settings.n_batch:
            raise EngineError(f"a batch of {n} tokens exceeds n_batch={self.settings.n_batch}")
        with self._owner:
            self._live()
            self._fill(tokens, positions, seq_ids, want_logits)
            start = perf_counter()
            placement = self.model.placement
            if meanwhile is None or placement is None:
                rc = self._decode(self.ptr, self._batch)  # waits for a GPU's asynchronous work too
                self.last_decode = perf_counter() - start
            else:
                done, wait = placement.start(self._timed_decode, (start,), "decoding")
                try:
                    meanwhile(done)
                finally:
                    rc = wait()
            self.decode_seconds += perf_counter() - start
        if rc != 0:
            raise EngineError(_decode_failure(rc, n, self.n_ctx))

    def _timed_decode(self, start: float) -> int:
        """The decode as the RPC worker runs it, its own duration kept (``meanwhile`` may outlast it)."""
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

    def logits_rows(self, n_rows: int) -> np.ndarray:
        """Zero-copy, read-only (n_rows, V) view of the last decode's output rows, in batch order.

        Valid only until this context's next ``decode`` (llama.cpp reuses, and may reallocate, the
        buffer) or ``close``: every row is reduced (argmax, top-K, dense p) before the next decode,
        except mcsd-target-init's target-root row, which the decoder copies."""
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
            adapters = (C.llama_adapter_lora_p_ctypes * 1)(adapter.ptr) if n else None
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


def native(placement: Placement | None, fn, what: str):
    """``fn`` for a model on this machine; on RPC devices, ``fn`` under the link's watchdog (rpc.py)."""
    return fn if placement is None else placement.guard(fn, what)


def release(placement: Placement | None, fn, ptr) -> None:
    """Free ``ptr`` with ``fn`` (on RPC devices: unless a server was lost; then it leaks)."""
    if placement is None:
        fn(ptr)
    else:
        placement.release(fn, ptr)


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
