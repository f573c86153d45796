"""ParallelSpec's draft: its [MASK] tokens, and the LoRA adapter that trained them (optional).

The draft reads the context plus [MASK]_1 … [MASK]_K and returns K + 1 next-token distributions in
one pass (``Draft.parallel_dists``). Untrained, the masks are K unused padding ids of the draft's
vocabulary (Qwen2.5: 151665 … 151935 are ``[PAD…]`` entries with their own embedding rows): the
mechanism runs, the far distributions are poor. Trained, a GGUF LoRA adapter (``edgespec train
parallel``) carries the weights and, in its metadata:

    parallelspec.k            uint32     K
    parallelspec.mask_ids     int32[K]   the ids of [MASK]_1 … [MASK]_K
    parallelspec.base_sha256  string     sha256 of the draft GGUF it was trained on

llama.cpp keeps only an adapter's scalar metadata, so the file's header is read here directly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import EngineError
from .gguf_header import read_header  # arrays included, fast

DEFAULT_K = 4
DEFAULT_MASK_IDS = (151665, 151666, 151667, 151668)  # unused padding entries of the Qwen2.5 vocabulary


@dataclass(frozen=True)
class ParallelDrafter:
    """What a parallel drafter is: K and its masks, and the adapter that trained them (if any)."""

    k: int  # [MASK] tokens per draft pass: the tree is at most K + 1 deep
    mask_ids: tuple[int, ...]  # [MASK]_1 … [MASK]_K (never proposed as draft tokens)
    adapter: str | None = None  # the GGUF LoRA adapter; None: the plain draft (untrained masks)
    base_sha256: str | None = None  # the draft GGUF the adapter was trained on


def untrained(n_vocab: int, k: int = DEFAULT_K) -> ParallelDrafter:
    """The plain draft with the default masks (the first k of ``DEFAULT_MASK_IDS``)."""
    if not 1 <= k <= len(DEFAULT_MASK_IDS):
        raise EngineError(f"untrained ParallelSpec has K in 1..{len(DEFAULT_MASK_IDS)}, not {k}")
    if n_vocab <= DEFAULT_MASK_IDS[k - 1]:
        raise EngineError(
            f"the draft's vocabulary has {n_vocab} ids: the default [MASK] ids {DEFAULT_MASK_IDS[:k]} "
            "(Qwen2.5 padding) are not in it. Use a parallel-drafter adapter that names its own mask ids."
        )
    return ParallelDrafter(k=k, mask_ids=DEFAULT_MASK_IDS[:k])


def read_adapter(path: str | Path) -> ParallelDrafter:
    """The ParallelSpec metadata of a GGUF LoRA adapter; an ``EngineError`` naming what is missing."""
    try:
        kv, _ = read_header(path)
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read the parallel-drafter adapter {path}: {exc}") from exc
    if kv.get("general.type") != "adapter" or kv.get("adapter.type") != "lora":
        raise EngineError(f"{path} is not a GGUF LoRA adapter (general.type = adapter, adapter.type = lora)")
    missing = [key for key in ("parallelspec.k", "parallelspec.mask_ids") if key not in kv]
    if missing:
        raise EngineError(
            f"{path} is a LoRA adapter but not a parallel drafter: it lacks {', '.join(missing)}. "
            "Make one with `edgespec train parallel`."
        )
    k, mask_ids = int(kv["parallelspec.k"]), tuple(int(t) for t in kv["parallelspec.mask_ids"])
    if k < 1 or len(mask_ids) != k or len(set(mask_ids)) != k:
        raise EngineError(f"{path}: parallelspec.mask_ids must hold K = {k} distinct ids, got {mask_ids}")
    return ParallelDrafter(k, mask_ids, str(path), kv.get("parallelspec.base_sha256"))


def check_base(spec: ParallelDrafter, draft_path: str, known_sha256: str | None = None) -> None:
    """The adapter must have been trained on this very draft file (its LoRA deltas mean nothing on
    other weights). ``known_sha256``: the draft's hash when the caller knows it (the model store's record
    of this exact file), else it is computed."""
    if spec.base_sha256 is None:
        return
    if (known_sha256 or file_sha256(draft_path)).lower() != spec.base_sha256.lower():
        raise EngineError(
            f"the parallel-drafter adapter {spec.adapter} was trained on another draft model "
            f"(sha256 {spec.base_sha256[:12]}…), not {draft_path}. Use the adapter made for this pair's "
            "draft, or train one: `edgespec train parallel`."
        )


def file_sha256(path: str) -> str:
    """The file's sha256, computed."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
