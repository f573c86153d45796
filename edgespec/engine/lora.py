"""LoRA adapters (GGUF) on a loaded model: load, read metadata, attach to a context, free."""

from __future__ import annotations

import ctypes

import llama_cpp as C

from ..errors import EngineError
from ._llama import Context, Model


class LoraAdapter:
    """One ``llama_adapter_lora`` for ``model``; owned here, freed by ``close()`` (before the model)."""

    def __init__(self, model: Model, path: str):
        model._live()
        self.path = str(path)
        self.ptr = C.llama_adapter_lora_init(model.ptr, self.path.encode("utf-8"))
        if not self.ptr:
            raise EngineError(
                f"llama.cpp could not load the LoRA adapter {self.path} on {model.path}: wrong base model or "
                "not a GGUF LoRA adapter. Set EDGESPEC_LLAMA_LOG=1 to see llama.cpp's reason."
            )

    def meta(self, key: str) -> str | None:
        """A metadata value as text (arrays as llama.cpp prints them), or None when absent."""
        buf = ctypes.create_string_buffer(1024)
        n = C.llama_adapter_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def close(self) -> None:
        if self.ptr:
            C.llama_adapter_lora_free(self.ptr)
            self.ptr = None

    def __enter__(self) -> LoraAdapter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def set_adapters(ctx: Context, adapters: list[LoraAdapter], scale: float = 1.0) -> None:
    """Make ``adapters`` the context's LoRA set (an empty list removes them all)."""
    ctx._live()
    n = len(adapters)
    ptrs = (C.llama_adapter_lora_p_ctypes * max(n, 1))(*[a.ptr for a in adapters])
    scales = (ctypes.c_float * max(n, 1))(*([scale] * n))
    rc = C.llama_set_adapters_lora(ctx.ptr, ptrs if n else None, n, scales if n else None)
    if rc != 0:
        raise EngineError(
            f"llama.cpp refused the LoRA adapters (code {rc}); were they loaded for this context's model?"
        )
