"""The only package that imports llama_cpp: contexts, tree batches, KV bookkeeping, logits views.

Names are loaded on first use (PEP 562): the layers above import ``engine.rows`` (the logits-row
reductions) without loading llama.cpp, e.g. the server before it loads a model.
"""

from importlib import import_module

_WHERE = {
    "backend_versions": "._backend",
    "compiled_features": "._backend",
    "cpu_flags": "._backend",
    "supports_gpu_offload": "._backend",
    "system_info": "._backend",
    "tiled_matmul": "._backend",
    "ContextSettings": "._context",
    "Model": "._model",
    "Draft": ".draft",
    "EngineSettings": ".pair",
    "ModelPair": ".pair",
    "check_pairing": ".pair",
    "DEFAULT_K": ".parallel",
    "DEFAULT_MASK_IDS": ".parallel",
    "ParallelDrafter": ".parallel",
    "read_adapter": ".parallel",
    "Target": ".runners",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value
