"""Offload that fits: how many layers of the draft and the target go to the GPU when the flags say
``auto`` (the default), and where each model runs.

llama.cpp's own fitter, ``llama_params_fit`` (common/fit.cpp), lives in its ``common`` library, which
llama-cpp-python does not ship, and the breakdown it reads, ``llama_get_memory_breakdown``, returns a
C++ ``std::map`` (no C ABI ctypes could call portably). So edgespec does what fit.cpp does with the C
API: a ``no_alloc`` load of each model (metadata only; llama.cpp simulates every allocation) and a
context on it, reading llama.cpp's own accounting: the weights' bytes (``llama_model_size``) and the
KV cache and compute buffers as llama.cpp logs them for that context; free memory per device comes from
ggml (``ggml_backend_dev_memory``). The search follows fit.cpp's order for a pair: the draft whole
first (it runs every draft pass), then as many target layers as fit. Without a GPU device nothing is
loaded: ``auto`` is 0 layers, as before.
"""

from __future__ import annotations

import ctypes
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import llama_cpp as C
import llama_cpp.llama_cpp as _binding

from ..errors import EngineError
from ._backend import _ensure_backend, llama_log

AUTO: Literal["auto"] = "auto"
GpuLayers = int | Literal["auto"]  # a --*-gpu-layers flag: a count, -1 (all) or auto (fitted here)
MiB = 1 << 20
MARGIN = 1024 * MiB  # kept free on each GPU: fit.cpp's default (common.h, fit_params_target)
_GPU_TYPES = (1, 2)  # ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU (CPU = 0, ACCEL = 3)
_LOAD_MODE_NONE = 0  # LLAMA_LOAD_MODE_NONE: a no_alloc load maps nothing (mmap asserts in llama.cpp)


@dataclass(frozen=True)
class Device:
    """A GPU as ggml reports it."""

    name: str  # "CUDA0"
    description: str  # "NVIDIA H200"
    free: int  # bytes free now
    total: int


@dataclass(frozen=True)
class Footprint:
    """What a model needs on the GPU with every layer there, by llama.cpp's accounting."""

    units: int  # llama.cpp's offload units: the repeating layers and the output layer (n_layer + 1)
    weights: int  # bytes of weights (llama_model_size; the token embeddings in it stay on the CPU)
    kv: int  # bytes of KV cache for the context asked for
    compute: int  # bytes of compute buffers

    def need(self, layers: int) -> int:
        """Bytes on the GPU with ``layers`` units there. The compute buffer is whole as soon as one
        layer is there; weights and KV are spread evenly over the units. The output layer (the largest
        unit) is the last offloaded, so a partial offload is over-counted, never under: it fits."""
        if layers <= 0:
            return 0
        return self.compute + math.ceil((self.weights + self.kv) * min(layers, self.units) / self.units)

    def most(self, budget: int) -> int:
        """The most units whose ``need`` fits in ``budget`` bytes (0 when not even the buffers fit)."""
        spread = budget - self.compute
        if spread <= 0:
            return 0
        if self.weights + self.kv == 0:
            return self.units
        # need(k) ≤ budget  ⇔  ceil(bytes·k/units) ≤ spread  ⇔  k ≤ spread·units/bytes
        return min(self.units, spread * self.units // (self.weights + self.kv))


def fit_layers(
    devices: list[Device],
    target: Footprint,
    draft: Footprint | None,
    asked: tuple[GpuLayers, GpuLayers] = (AUTO, AUTO),
) -> tuple[int, int]:
    """(target, draft) GPU layers for the ``--*-gpu-layers`` flags (-1 where a model is there whole),
    for what was ``asked`` of each: a number is kept (its memory counted first), ``auto`` fitted.

    The budget is every GPU's free memory less ``MARGIN`` each (llama.cpp spreads layers over its GPUs
    in proportion to free memory). An auto draft goes first, whole or as much of it as fits (it runs
    every draft pass); an auto target takes as many layers as fit in what is left."""
    budget = sum(max(0, d.free - MARGIN) for d in devices)
    models = {"target": (target, asked[0]), "draft": (draft, asked[1])}
    layers = {name: 0 for name in models}
    # numbers first (their memory is taken whatever else fits), then an auto draft, then an auto target
    for name in sorted(models, key=lambda name: (models[name][1] == AUTO, name == "target")):
        footprint, request = models[name]
        if footprint is None:
            continue
        if request == AUTO:
            layers[name] = footprint.most(budget)
        else:
            layers[name] = footprint.units if int(request) < 0 else min(int(request), footprint.units)
        budget -= footprint.need(layers[name])
    flag = {
        name: -1 if fp is not None and layers[name] == fp.units else layers[name]
        for name, (fp, _) in models.items()
    }
    return flag["target"], flag["draft"]


# -- llama.cpp's accounting --------------------------------------------------------------------
def footprint(path: str, n_ctx: int, n_batch: int, n_seq_max: int, flash_attn: bool | None) -> Footprint:
    """A ``no_alloc`` load of ``path`` with every layer offloaded and a context as the engine makes one
    (``ContextSettings``: unified KV, n_ubatch = n_batch): llama.cpp's bytes for weights, KV, compute."""
    _ensure_backend()
    params = C.llama_model_default_params()
    params.n_gpu_layers = -1
    params.no_alloc = True
    params.load_mode = _LOAD_MODE_NONE
    with llama_log() as heard:
        model = C.llama_model_load_from_file(path.encode("utf-8"), params)
        if not model:
            raise EngineError(
                f"llama.cpp could not read {path} to size its offload; check the file "
                "(`edgespec models verify`) or give --target-gpu-layers/--draft-gpu-layers."
            )
        try:
            cparams = C.llama_context_default_params()
            cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = n_ctx, n_batch, n_batch
            cparams.n_seq_max, cparams.kv_unified = n_seq_max, True
            cparams.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_AUTO if flash_attn is None else int(flash_attn)
            ctx = C.llama_init_from_model(model, cparams)
            if ctx:
                C.llama_free(ctx)
            weights, units = int(C.llama_model_size(model)), int(C.llama_model_n_layer(model)) + 1
        finally:
            C.llama_model_free(model)
    if not ctx:
        raise EngineError(
            f"llama.cpp could not size a {n_ctx}-token context for {path}: try a smaller --ctx."
        )
    kv, compute = logged_buffers("".join(heard))
    return Footprint(units=units, weights=weights, kv=kv, compute=compute)


_KV = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB")
_COMPUTE = re.compile(r"(\S+) compute buffer size = +([\d.]+) MiB")


def logged_buffers(log: str) -> tuple[int, int]:
    """(KV, compute) bytes in llama.cpp's log of a context's creation (the KV cache's size line; every
    backend's compute buffer, summed: on a GPU machine all but a small host one are on the GPU)."""
    kv = sum(float(m) for m in _KV.findall(log))
    compute = sum(float(m) for _, m in _COMPUTE.findall(log))
    if not _KV.search(log) or not _COMPUTE.search(log):
        raise EngineError(
            "llama.cpp's log did not give the KV and compute buffer sizes edgespec sizes offload with; "
            "give --target-gpu-layers and --draft-gpu-layers as numbers."
        )
    return round(kv * MiB), round(compute * MiB)


# -- ggml's devices ------------------------------------------------------------------------------
def gpu_devices() -> list[Device]:
    """The GPUs this llama.cpp build sees, with their free memory (none in a CPU build)."""
    _ensure_backend()
    if not C.llama_supports_gpu_offload():
        return []
    ggml = _ggml()
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(dev) not in _GPU_TYPES:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        name, description = ggml.ggml_backend_dev_name(dev), ggml.ggml_backend_dev_description(dev)
        found.append(Device(name.decode(), description.decode(), free.value, total.value))
    return found


def _ggml() -> ctypes.CDLL:
    """libggml beside libllama (already loaded by it), with the device functions' C signatures."""
    libllama = Path(_binding._lib._name)
    ggml = ctypes.CDLL(str(libllama.with_name(libllama.name.replace("llama", "ggml"))))
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.argtypes, ggml.ggml_backend_dev_get.restype = [ctypes.c_size_t], ctypes.c_void_p
    ggml.ggml_backend_dev_type.argtypes, ggml.ggml_backend_dev_type.restype = [ctypes.c_void_p], ctypes.c_int
    for text in (ggml.ggml_backend_dev_name, ggml.ggml_backend_dev_description):
        text.argtypes, text.restype = [ctypes.c_void_p], ctypes.c_char_p
    size_p = ctypes.POINTER(ctypes.c_size_t)
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size_p, size_p]
    ggml.ggml_backend_dev_memory.restype = None
    return ggml


# -- where a model runs ------------------------------------------------------------------------
@dataclass(frozen=True)
class RunsOn:
    """Where a loaded model runs: the device holding its offloaded layers and how many of its units."""

    device: str  # "CPU", a GPU's description, or the RPC servers' summary
    gpu_layers: int  # llama.cpp's offload units on that device
    layers: int  # all units (repeating layers + the output layer)

    def as_dict(self) -> dict:
        return {"device": self.device, "gpu_layers": self.gpu_layers, "layers": self.layers}


def runs_on(gpu_layers: int, n_layer: int, devices: list[Device]) -> RunsOn:
    """The report for a model of ``n_layer`` repeating layers loaded with ``gpu_layers`` (-1: all)."""
    units = n_layer + 1
    on_gpu = units if gpu_layers < 0 else min(gpu_layers, units)
    if not devices or on_gpu == 0:
        return RunsOn("CPU", 0, units)
    return RunsOn(" + ".join(d.description for d in devices), on_gpu, units)
