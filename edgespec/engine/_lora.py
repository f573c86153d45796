"""GGUF LoRA adapters (llama-cpp-python 0.3.36: ``llama_adapter_lora_init`` / ``_free``; a context
applies one with ``Context.use_adapter``, i.e. ``llama_set_adapters_lora``)."""

from __future__ import annotations

import ctypes

import llama_cpp as C

from ..errors import EngineError
from ._model import Model


class LoraAdapter:
    """A GGUF LoRA adapter loaded for ``model`` (weights only: a context uses it after ``use_adapter``).

    llama.cpp registers the adapter with its model and deletes whatever is still registered when the
    model is freed, so ``close`` must run before the model's (``ModelPair.close`` keeps that order).
    """

    def __init__(self, model: Model, path: str):
        model._live()
        self.model = model
        self.path = path
        with model._owner:
            self.ptr = C.llama_adapter_lora_init(model.ptr, path.encode("utf-8"))
        if not self.ptr:
            raise EngineError(
                f"llama.cpp could not load the LoRA adapter {path} for {model.path}: it must be a GGUF "
                "adapter (general.type = adapter, adapter.type = lora) made for this model's architecture "
                "and shapes. Set EDGESPEC_LLAMA_LOG=1 to see llama.cpp's reason."
            )

    def meta(self, key: str) -> str | None:
        """A scalar metadata value as text (llama.cpp keeps no arrays: read those from the file)."""
        buf = ctypes.create_string_buffer(512)
        with self.model._owner:
            self._live()
            n = C.llama_adapter_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def _live(self) -> None:
        if not self.ptr or not self.model.ptr:
            raise EngineError(f"the LoRA adapter {self.path} was already closed; load it again to continue.")

    def close(self) -> None:
        with self.model._owner:
            if self.ptr and self.model.ptr:  # a freed model has deleted it already
                C.llama_adapter_lora_free(self.ptr)
            self.ptr = None
