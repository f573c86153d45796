"""The only package that imports llama_cpp: contexts, tree batches, KV bookkeeping, logits views."""

from ._llama import (
    ContextSettings,
    Model,
    backend_versions,
    compiled_features,
    supports_gpu_offload,
    system_info,
)
from .pair import EngineSettings, ModelPair, check_pairing
from .runners import Draft, Target

__all__ = [
    "ContextSettings",
    "Draft",
    "EngineSettings",
    "Model",
    "ModelPair",
    "backend_versions",
    "compiled_features",
    "Target",
    "check_pairing",
    "supports_gpu_offload",
    "system_info",
]
