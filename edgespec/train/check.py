"""Does llama.cpp, with the exported adapter, compute what the PyTorch drafter computed?

The runtime decodes ``x_0..x_t, MASK_1..MASK_K`` causally; in PyTorch that is the group layout with
one anchor at t. Both sides' logits rows are compared (the weights are the same dequantised values;
llama.cpp quantises activations for its quantised matmuls, so rows agree to a tolerance, not bits).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .groups import build_layout


def llama_rows(
    gguf_path: str, tokens: Sequence[int], adapter: str | None = None, threads: int = 1
) -> np.ndarray:
    """(len(tokens), V) logits of a causal decode of ``tokens`` by llama.cpp, with ``adapter`` if given."""
    from ..engine._context import Context, ContextSettings
    from ..engine._lora import LoraAdapter
    from ..engine._model import Model

    model = Model(str(gguf_path), repack=False)
    try:
        n = len(tokens)
        settings = ContextSettings(n_ctx=max(256, n + 8), n_batch=max(64, n), n_seq_max=1, n_threads=threads)
        ctx = Context(model, settings)
        lora = LoraAdapter(model, adapter) if adapter else None
        try:
            ctx.use_adapter(lora)
            ctx.decode(list(tokens), list(range(n)), [[0]] * n, [True] * n)
            return np.array(ctx.logits_rows(n), dtype=np.float32)
        finally:
            ctx.close()
            if lora is not None:
                lora.close()
    finally:
        model.close()


def torch_rows(drafter, tokens: Sequence[int], mask_ids: Sequence[int]) -> np.ndarray:
    """(len(tokens) + K, V) logits of ``tokens`` then MASK_1..K (one group at the last token)."""
    import torch

    layout = build_layout(tokens, len(tokens), [len(tokens) - 1], mask_ids)
    with torch.no_grad():
        return drafter.logits(layout).numpy()


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """Largest absolute logit difference, and how often the argmax agrees, row by row."""
    return {
        "max_abs": float(np.max(np.abs(a - b))),
        "mean_abs": float(np.mean(np.abs(a - b))),
        "argmax_agree": float(np.mean(a.argmax(axis=1) == b.argmax(axis=1))),
    }
