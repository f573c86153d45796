"""The training loop: deterministic data order, AdamW, checkpoints, resume, a loss curve on disk.

Work directory layout: ``checkpoint.pt`` (LoRA, mask rows, optimiser, step), ``loss.csv`` (one row
per optimiser step), ``run.json`` (settings and totals). Sequence number s picks record
``permutation(epoch)[s mod n]`` and its anchors from a generator seeded with (seed, s), so a resumed
run continues exactly where it stopped; Ctrl-C writes a checkpoint before exiting.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter

import numpy as np

from .groups import build_layout, choose_anchors, default_mask_ids, loss_weights
from .progress import progress


@dataclass(frozen=True)
class TrainSettings:
    k: int = 4  # mask tokens per group
    mask_ids: tuple[int, ...] = field(default_factory=default_mask_ids)
    groups: int = 24  # parallel groups (anchors) per sequence
    decay: float = 0.8  # lambda_k = decay**k
    lr: float = 5e-4
    warmup: int = 10  # optimiser steps of linear warm-up
    accum: int = 2  # sequences per optimiser step
    steps: int = 1000  # optimiser steps (the run also stops at max_minutes)
    max_minutes: float = 0.0  # 0 → no time limit
    checkpoint_every: int = 10  # optimiser steps
    max_len: int = 512  # longer sequences are cut (prompt + answer)
    seed: int = 0


def sequence_for(records: Sequence[dict], s: int, seed: int) -> dict:
    """The record used as sequence number ``s`` (a fresh permutation each epoch)."""
    n = len(records)
    order = np.random.default_rng([seed, s // n]).permutation(n)
    return records[int(order[s % n])]


def layout_for(record: dict, s: int, settings: TrainSettings, stream: int = 1):
    """Sequence number ``s``'s layout; its anchors come from the generator (seed, s, stream)."""
    tokens = (list(record["prompt_ids"]) + list(record["answer_ids"]))[: settings.max_len]
    prompt_len = min(len(record["prompt_ids"]), len(tokens))
    rng = np.random.default_rng([settings.seed, s, stream])
    anchors = choose_anchors(prompt_len, len(tokens), settings.groups, rng)
    return build_layout(tokens, prompt_len, anchors, settings.mask_ids)


def _lr_factor(step: int, warmup: int) -> float:
    return min(1.0, (step + 1) / max(warmup, 1))


def train(
    drafter, records: Sequence[dict], work: Path, settings: TrainSettings, resume: bool = False
) -> dict:
    """Train ``drafter`` (a ``ParallelDrafter``) on ``records``; returns the run's totals."""
    import torch

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    ckpt_path, curve_path = work / "checkpoint.pt", work / "loss.csv"
    params = drafter.parameters()
    optimiser = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    step, wall_before, positions = 0, 0.0, 0
    if resume and ckpt_path.is_file():
        ckpt = torch.load(ckpt_path, weights_only=False)
        drafter.load_state(ckpt["model"])
        optimiser.load_state_dict(ckpt["optimiser"])
        step, wall_before, positions = ckpt["step"], ckpt["wall_seconds"], ckpt.get("positions", 0)
    elif curve_path.exists():
        curve_path.unlink()  # a fresh run starts a fresh curve
    weights = loss_weights(settings.k, settings.decay)
    header = ["step", "wall_seconds", "positions", "loss"] + [f"ce{k}" for k in range(settings.k + 1)]
    start = perf_counter()

    def elapsed() -> float:
        return wall_before + perf_counter() - start

    def save() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": drafter.state(), "optimiser": optimiser.state_dict(), "step": step,
                    "wall_seconds": elapsed(), "positions": positions, "settings": asdict(settings)}, tmp)
        tmp.replace(ckpt_path)

    deadline = settings.max_minutes * 60 if settings.max_minutes > 0 else math.inf
    try:
        with curve_path.open("a", newline="") as sink, progress("train", settings.steps, step) as update:
            writer = csv.writer(sink)
            if sink.tell() == 0:
                writer.writerow(header)
            while step < settings.steps and elapsed() < deadline:
                for group in optimiser.param_groups:
                    group["lr"] = settings.lr * _lr_factor(step, settings.warmup)
                optimiser.zero_grad(set_to_none=True)
                losses, per_depth = [], []
                for micro in range(settings.accum):
                    s = step * settings.accum + micro
                    layout = layout_for(sequence_for(records, s, settings.seed), s, settings)
                    loss, depths = drafter.loss(layout, weights)
                    (loss / settings.accum).backward()
                    losses.append(float(loss.detach()))
                    per_depth.append(depths)
                    positions += len(layout.input_ids)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimiser.step()
                step += 1
                ce = np.nanmean(np.array(per_depth, dtype=float), axis=0)
                writer.writerow([step, round(elapsed(), 1), positions, round(float(np.mean(losses)), 4)]
                                + [round(float(c), 4) for c in ce])
                sink.flush()
                status = f"loss {np.mean(losses):.3f} ce " + " ".join(f"{c:.2f}" for c in ce)
                if deadline < math.inf:  # the time limit comes first: say when (the bar's ETA is for --steps)
                    status += f" | time limit in {max(deadline - elapsed(), 0) / 60:.0f} min"
                update(step, status)
                if step % settings.checkpoint_every == 0:
                    save()
    except KeyboardInterrupt:
        save()
        raise
    save()
    totals = {"steps": step, "sequences": step * settings.accum, "positions": positions,
              "wall_seconds": round(elapsed(), 1), "settings": asdict(settings)}
    (work / "run.json").write_text(json.dumps(totals, indent=2))
    return totals


def evaluate(drafter, records: Sequence[dict], settings: TrainSettings) -> dict:
    """Held-out CE and top-1 accuracy per depth (depth 0: next token; k: MASK_k), fixed anchors."""
    sums = np.zeros((settings.k + 1, 3))
    for i, record in enumerate(records):
        layout = layout_for(record, i, settings, stream=2)  # stream 2: anchors never drawn by training
        sums += np.array(drafter.accuracy(layout, settings.k), dtype=float)
    rows = np.maximum(sums[:, 2], 1)
    return {"records": len(records), "rows": [int(r) for r in sums[:, 2]],
            "ce": [round(float(c), 4) for c in sums[:, 0] / rows],
            "top1": [round(float(h), 4) for h in sums[:, 1] / rows]}


def read_curve(path: Path) -> list[dict]:
    """loss.csv as a list of rows (numbers as floats)."""
    with Path(path).open() as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
