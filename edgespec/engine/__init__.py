"""The only package that imports llama_cpp: contexts, tree batches, KV bookkeeping, logits views."""

from ._backend import backend_versions, compiled_features, supports_gpu_offload, system_info
from ._llama import ContextSettings, Model
from .draft import Draft
from .pair import EngineSettings, ModelPair, check_pairing
from .parallel import DEFAULT_K, DEFAULT_MASK_IDS, ParallelDrafter, read_adapter
from .runners import Target

__all__ = [
    "DEFAULT_K",
    "DEFAULT_MASK_IDS",
    "ContextSettings",
    "Draft",
    "EngineSettings",
    "Model",
    "ModelPair",
    "ParallelDrafter",
    "backend_versions",
    "compiled_features",
    "read_adapter",
    "Target",
    "check_pairing",
    "supports_gpu_offload",
    "system_info",
]
