"""llama.cpp's backend samplers (ctypes glue): a sampler chain per sequence id runs inside the decode's
own graph, on the device holding the output layer, and only its few results come back per output row
instead of the whole logits row (``Context.sampled_rows``; read through ``sampled.SampledVerified``).

Two chains, each one sampler (``Keep``):
- the target's: llama.cpp's top_k(K), the K best ids of a row and their raw logits, unordered (ggml's
  top-k). K = 2 for a greedy target (argmax and the top-1 − top-2 margin); K = the request's top_k when
  it samples — temperature, top-p and the dense p stay numpy, over those K logits (``sampled.py``).
  A request sampling without top-k (top_k = 0) needs every logit: the chains come off for it.
- the draft's: ``TopKSoftmax``, written here from ggml ops (llama.cpp has no sampler that keeps the
  full-softmax probabilities of the top K): the K best ids below a vocabulary limit, their logits and
  their probabilities under the softmax of the whole row at the draft's temperature.

Rules of llama.cpp 0.3.36 (lab/notebook/backend-samplers-plan.md §2): a chain on *every* sequence id
or on none; a chain is initialised once (a fresh one per attach); the context never frees them (freed
here, after they are replaced or the context is gone); ``n_outputs_max_per_seq`` must be 0 (a tree has
many outputs per sequence).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import llama_cpp as C
import llama_cpp.llama_cpp as _binding

from ..errors import EngineError

REDUCTIONS = ("auto", "numpy", "backend")  # where the rows are reduced: ``resolve``
GREEDY_K = 2  # a greedy target needs its best two logits: the argmax and the margin


def kept_per_row(sampling) -> int | None:
    """The ids a backend sampler keeps per row for a request sampling so (``ports.Sampling``): the best
    2 under greedy, the top_k when it samples with top-k, None (whole logits rows) without."""
    if sampling.temperature <= 0:
        return GREEDY_K
    return max(GREEDY_K, sampling.top_k) if sampling.top_k > 0 else None


def reductions_from_env() -> str:
    """The default choice: ``EDGESPEC_REDUCTIONS`` (for scripts), else auto."""
    return os.environ.get("EDGESPEC_REDUCTIONS", "auto")


def resolve(asked: str, remote: bool, on_gpu: bool) -> str:
    """Where a context reduces its rows, decided once before it is created: numpy for a model on RPC
    servers (not supported there) and, under auto, on a CPU (measured: lab/notebook/backend-samplers-
    plan.md §4); the backend's samplers under auto where the output layer is on a GPU."""
    if asked not in REDUCTIONS:
        raise EngineError(f"unknown reductions {asked!r}: use one of {', '.join(REDUCTIONS)}.")
    if remote:
        return "numpy"
    if asked == "auto":
        return "backend" if on_gpu else "numpy"
    return asked


@dataclass(frozen=True)
class Keep:
    """What a backend sampler keeps of each output row: its ``k`` best ids and their logits; with
    ``temperature`` > 0 also their probabilities under softmax(logits / temperature) over the ids below
    ``vocab_limit`` (the draft's), the others ignored."""

    k: int
    temperature: float = 0.0
    vocab_limit: int = 0


class TopKSoftmax:
    """The draft's sampler (``Keep`` with a temperature), built into the decode's graph by
    ``backend_apply``: row[:limit] → softmax(· / T) and top_k(K) → the K ids, their logits and probs.
    Its parameters are baked into each graph llama.cpp builds (a reused graph keeps them): another
    temperature needs new chains (``Context.keep``). Keeps its ctypes callbacks alive."""

    def __init__(self, keep: Keep):
        ops = _ggml_ops()

        def backend_apply(smpl, ctx, graph, data) -> None:
            row = data.contents
            n = min(int(ops.ggml_nelements(row.logits)), keep.vocab_limit)
            logits = ops.ggml_view_1d(ctx, row.logits, n, 0)  # ids < vocab_limit
            probs = ops.ggml_soft_max_ext(ctx, logits, None, 1.0 / keep.temperature, 0.0)
            best = ops.ggml_top_k(ctx, logits, keep.k)  # unordered
            row.candidates = best
            row.logits = ops.ggml_get_rows(ctx, ops.ggml_reshape_2d(ctx, logits, 1, n), best)
            row.probs = ops.ggml_get_rows(ctx, ops.ggml_reshape_2d(ctx, probs, 1, n), best)

        self._callbacks = (  # what llama.cpp calls back: kept alive with this object
            C.llama_sampler_i_name(lambda smpl: b"edgespec-top-k-softmax"),
            C.llama_sampler_i_apply(lambda smpl, candidates: None),  # never on the host: backend only
            C.llama_sampler_i_backend_init(lambda smpl, buffer_type, n_outputs: True),
            C.llama_sampler_i_backend_apply(backend_apply),
        )
        name, apply, init, graph_apply = self._callbacks
        self.iface = C.llama_sampler_i(name=name, apply=apply, backend_init=init, backend_apply=graph_apply)

    def sampler(self):
        return C.llama_sampler_init(ctypes.pointer(self.iface), None)


@cache
def _ggml_ops() -> ctypes.CDLL:
    """The few ggml ops ``TopKSoftmax`` builds with, from the libggml-base beside libllama (its version
    is checked at start, ``_backend.check_library``); tensors and contexts stay opaque pointers."""
    libllama = Path(_binding._lib._name)
    ops = ctypes.CDLL(str(libllama.with_name(libllama.name.replace("llama", "ggml-base"))))
    p = ctypes.c_void_p
    for name, args in {
        "ggml_soft_max_ext": [p, p, p, ctypes.c_float, ctypes.c_float],
        "ggml_top_k": [p, p, ctypes.c_int],
        "ggml_get_rows": [p, p, p],
        "ggml_reshape_2d": [p, p, ctypes.c_int64, ctypes.c_int64],
        "ggml_view_1d": [p, p, ctypes.c_int64, ctypes.c_size_t],
    }.items():
        getattr(ops, name).argtypes, getattr(ops, name).restype = args, p
    ops.ggml_nelements.argtypes, ops.ggml_nelements.restype = [p], ctypes.c_int64
    return ops


class Chains:
    """One chain per sequence id 0 … n_seq − 1, each keeping ``keep``, made for one attach."""

    def __init__(self, n_seq: int, keep: Keep):
        self.keep = keep
        self._custom = TopKSoftmax(keep) if keep.temperature > 0 else None  # shared by the chains
        self.chains: list = []  # llama_sampler pointers
        for _ in range(n_seq):
            chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
            sampler = self._custom.sampler() if self._custom else C.llama_sampler_init_top_k(keep.k)
            C.llama_sampler_chain_add(chain, sampler)  # the chain owns it
            self.chains.append(chain)

    def configs(self) -> ctypes.Array:
        """The chains as ``llama_context_params.samplers`` takes them (kept alive by the caller)."""
        config = C.llama_sampler_seq_config
        return (config * len(self.chains))(
            *[config(seq, ctypes.cast(chain, ctypes.c_void_p)) for seq, chain in enumerate(self.chains)]
        )

    def attach(self, ctx) -> None:
        """Give the chains to a live context (each ``llama_set_sampler`` re-reserves its graph)."""
        for seq, chain in enumerate(self.chains):
            if not C.llama_set_sampler(ctx, seq, chain):
                raise EngineError("this backend cannot run a top-k sampler: use --reductions numpy.")

    def free(self) -> None:
        for chain in self.chains:
            C.llama_sampler_free(chain)
        self.chains = []


def detach_all(ctx, n_seq: int) -> None:
    """Take the chains off every sequence id: the next decode copies whole logits rows again."""
    for seq in range(n_seq):
        C.llama_set_sampler(ctx, seq, None)
