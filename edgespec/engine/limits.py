"""Limits that protect the process: settings llama.cpp would not refuse but abort on (a native
``GGML_ASSERT``: no Python error, a dead process and a backtrace on the terminal), refused first with
the flag to change. ``models.pairs.open_pair`` checks every load; the commands check before loading."""

from __future__ import annotations

from ..errors import EngineError
from ._context import LLAMA_MAX_SEQ

BATCH = 512  # tokens: the batches a prompt is decoded in (engine/pair.py: EngineSettings.context)
MAX_CTX = 1 << 24  # llama.cpp's context sizes are 32-bit; far beyond any model's training context
MAX_THREADS = 1024


def check_engine(settings) -> None:
    """``settings``: an ``EngineSettings``; ``EngineError`` naming the flag when a limit is crossed.

    The context must hold the batches the engine decodes (a prompt's chunks, a whole draft tree with
    the tokens before it): llama.cpp caps its batch at the context size asked for (while it rounds the
    context itself up) and asserts when a batch is larger."""
    nodes = settings.max_tree_nodes
    if not _whole(nodes) or not 1 <= nodes < LLAMA_MAX_SEQ:
        raise EngineError(f"--max-tree-nodes must be from 1 to {LLAMA_MAX_SEQ - 1}, not {nodes}.")
    least = max(BATCH, nodes + 1)
    if not _whole(settings.n_ctx) or not least <= settings.n_ctx <= MAX_CTX:
        raise EngineError(
            f"--ctx must be from {least} to {MAX_CTX} tokens (the engine decodes in batches of up to "
            f"{least} tokens, and a batch must fit the window), not {settings.n_ctx}."
        )
    if not _whole(settings.threads) or not 0 <= settings.threads <= MAX_THREADS:
        raise EngineError(f"--threads must be from 0 (all cores) to {MAX_THREADS}, not {settings.threads}.")
    for flag, layers in (("target", settings.target_gpu_layers), ("draft", settings.draft_gpu_layers)):
        if layers != "auto" and (not _whole(layers) or layers < -1):
            raise EngineError(
                f"--{flag}-gpu-layers must be auto (what fits), -1 (all), 0 or more, not {layers}."
            )


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
