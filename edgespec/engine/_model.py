"""A loaded GGUF model: weights and vocabulary (llama-cpp-python 0.3.36 low-level API; contexts are
``_context.py``, the backend as a whole — start-up, build features, the AMX guard — ``_backend.py``).

Thin owning wrappers in the style of llama-cpp-python's own ``_internals``: each C resource has one
owner with ``close()``, and non-zero return codes become ``EngineError`` with what to do.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import llama_cpp as C

from ..errors import EngineError
from ._backend import _ensure_backend, amx_guard
from .gguf_header import n_layers
from .plain_text import as_text

if TYPE_CHECKING:
    from .rpc import Placement


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
        pre, suf, mid = (
            int(f(self.vocab)) for f in (C.llama_vocab_fim_pre, C.llama_vocab_fim_suf, C.llama_vocab_fim_mid)
        )
        return None if min(pre, suf, mid) < 0 else (pre, suf, mid)

    def meta(self, key: str) -> str | None:
        self._live()
        buf = ctypes.create_string_buffer(512)
        n = C.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    @property
    def n_layer(self) -> int:
        """Repeating layers (llama.cpp offloads these and then the output layer)."""
        return int(C.llama_model_n_layer(self.ptr))

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


def native(placement: Placement | None, fn, what: str):
    """``fn`` for a model on this machine; on RPC devices, ``fn`` under the link's watchdog (rpc.py)."""
    return fn if placement is None else placement.guard(fn, what)


def release(placement: Placement | None, fn, ptr) -> None:
    """Free ``ptr`` with ``fn`` (on RPC devices: unless a server was lost; then it leaks)."""
    if placement is None:
        fn(ptr)
    else:
        placement.release(fn, ptr)
