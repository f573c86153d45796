"""Shared helpers for tests on the real bundled GGUF pair (marked ``model``)."""

from __future__ import annotations

import pytest

BUNDLED_PAIR = "qwen2.5-coder-1.5b+0.5b"


def bundled_paths() -> tuple[str, str]:
    """Paths of the installed bundled pair; skips when llama_cpp or the models are missing."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from edgespec.store import ModelStore

    store = ModelStore()
    spec = store.registry.pair(BUNDLED_PAIR)
    for model in (spec.target, spec.draft):
        if not store.is_installed(model.name):
            pytest.skip(
                f"bundled model {model.name} is not installed: run `edgespec models pull {BUNDLED_PAIR}`"
            )
    return str(store.path_for(spec.target.name)), str(store.path_for(spec.draft.name))
