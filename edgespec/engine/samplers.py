"""llama.cpp's backend samplers (ctypes glue): a sampler chain per sequence id runs inside the decode's
own graph, on the device holding the output layer, and only its few results come back per output row
instead of the whole logits row (``Context.sampled_rows``; read through ``sampled.SampledVerified``).

The one chain used is top_k(K): the K best ids of a row and their raw logits, unordered (ggml's
top-k). K = 2 for a greedy target (argmax and the top-1 − top-2 margin); K = the request's top_k when
it samples — temperature, top-p and the dense p stay numpy, over those K logits (``sampled.py``).
A request sampling without top-k (top_k = 0) needs every logit: the chains come off for it.

Rules of llama.cpp 0.3.36 (lab/notebook/backend-samplers-plan.md §2): a chain on *every* sequence id
or on none; a chain is initialised once (a fresh one per attach); the context never frees them (freed
here, after they are replaced or the context is gone); ``n_outputs_max_per_seq`` must be 0 (a tree has
many outputs per sequence).
"""

from __future__ import annotations

import ctypes
import os

import llama_cpp as C

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


class TopKChains:
    """One top_k(k) chain per sequence id 0 … n_seq − 1, made for one attach."""

    def __init__(self, n_seq: int, k: int):
        self.k = k
        self.chains: list = []  # llama_sampler pointers
        for _ in range(n_seq):
            chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(k))  # the chain owns it
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
