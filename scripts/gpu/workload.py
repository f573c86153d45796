"""What the GPU check's stages run on (scripts/gpu/check.py): the sizes of the GPU run and of the CPU dry
run, the random GGUFs (written here, or by the background ``gen`` stage for the big targets), the model
pair with every layer offloaded, and the prompts.
"""

from __future__ import annotations

import os
import time
from argparse import Namespace
from dataclasses import dataclass, replace
from pathlib import Path

import kit  # scripts/gpu and scripts on PYTHONPATH (check.sh)
import numpy as np
import randomgguf

from edgespec.engine import EngineSettings, ModelPair


@dataclass(frozen=True)
class Sizes:
    """How big each stage is: the GPU run (≤ 8 minutes on an H200) or the CPU dry run (seconds)."""

    draft: str  # the draft's shape (a randomgguf BUILTIN name) or "tiny"
    target: str  # the lossless/auto/sampling target
    curve_targets: tuple[str, ...]
    tokens: int  # per lossless / paired run
    prompts: int  # prompts per lossless comparison
    repeats: int  # paired runs per side
    budget: int  # every strategy's tree size in the lossless stage
    sizes: tuple[int, ...]  # curve sizes
    chain_budgets: tuple[int, ...]
    n_ctx: int


GPU = Sizes(
    draft="qwen2.5-0.5b",
    target="qwen2.5-1.5b",
    curve_targets=("qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b"),
    tokens=48,
    prompts=1,
    repeats=3,
    budget=16,
    sizes=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64),
    chain_budgets=(4, 8, 16),
    n_ctx=2048,
)
DRY = Sizes("tiny", "tiny", ("tiny",), tokens=12, prompts=1, repeats=2, budget=6, sizes=(1, 2, 4),
            chain_budgets=(4,), n_ctx=512)  # fmt: skip
TINY_VOCAB = 1088


def model_path(name: str, args: Namespace, role: str = "target") -> Path:
    """The random GGUF for ``name`` (written when missing); "tiny": the tests' tiny model, the draft
    with another seed than the target so that draft ≠ target."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if name == "tiny":
        path = work / f"tiny-{role}.gguf"
        if not path.exists():
            seed = randomgguf.TINY_SEED if role == "target" else randomgguf.TINY_SEED + 6
            # ids up to TINY_VOCAB: kit.measure_target's prompt is ids 1000-1063 (padding: silent tokens)
            randomgguf.write_tiny_gguf(path, replace(randomgguf.TINY, n_vocab=TINY_VOCAB), seed=seed)
        return path
    ready = work / f"{name}-{args.layers}.ready"  # after the whole file, by `gen` (check.sh starts it early)
    path = kit.make_model(name, args.tokenizer_from, work, "Q4_K", args.layers)
    ready.touch()
    return path


def wait_for(name: str, args: Namespace, seconds: float) -> Path:
    """The model ``gen`` writes in the background, once it is whole (or written here if ``gen`` never
    started)."""
    ready, started = Path(args.work) / f"{name}-{args.layers}.ready", time.monotonic()
    while (
        name != "tiny" and not ready.exists() and time.monotonic() - started < seconds and _gen_running(args)
    ):
        time.sleep(1)
    return model_path(name, args)


def _gen_running(args: Namespace) -> bool:
    try:
        os.kill(int((Path(args.work) / "gen.pid").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def load(target: Path, draft: Path, args: Namespace, **settings) -> ModelPair:
    """A pair with every layer offloaded unless ``settings`` say otherwise."""
    base = {
        "n_ctx": args.sizes.n_ctx,
        "threads": args.threads,
        "max_tree_nodes": 64,
        "target_gpu_layers": -1,
        "draft_gpu_layers": -1,
        "probe_dir": Path(args.work) / "probes",
    }
    return ModelPair(str(target), str(draft), EngineSettings(**{**base, **settings}))


def prompts(count: int) -> list[list[int]]:
    """Prompts of 48 printable-byte ids each: any ids do for random weights, these for the tiny model's
    synthetic tokenizer too (its silent ids never win a greedy choice)."""
    rng = np.random.default_rng(7)
    return [list(map(int, rng.integers(40, 120, size=48))) for _ in range(count)]
