"""``edgespec train parallel``: data → training → export → check, each stage resumable.

The work directory holds everything: ``data.jsonl`` (self-distillation), ``checkpoint.pt`` and
``loss.csv`` (training), the adapter GGUF and ``record.json`` (what was trained on, how long, the
loss curve's ends, the adapter's sha256, and the llama.cpp-vs-PyTorch check).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from ..errors import EdgespecError
from .distill import DistillSettings, generate_data, read_records
from .groups import default_mask_ids
from .loop import TrainSettings, evaluate, read_curve, train
from .prompts import training_prompts


@dataclass(frozen=True)
class ParallelJob:
    target: str  # target GGUF path (writes the data)
    draft: str  # draft GGUF path (trained)
    work: Path
    out: Path  # the adapter GGUF
    prompts: int = 240
    distill: DistillSettings = DistillSettings()
    train: TrainSettings = TrainSettings()
    rank: int = 8
    alpha: float = 16.0
    threads: int = 1
    resume: bool = False
    data_only: bool = False
    skip_data: bool = False

    @property
    def data_path(self) -> Path:
        return self.work / "data.jsonl"


def run_job(job: ParallelJob, say=print) -> dict:
    """Every stage of ``job``; returns the record also written to ``work/record.json``."""
    record: dict = {"target": job.target, "draft": job.draft, "prompts": job.prompts}
    if not job.skip_data:
        say(f"data: the target answers {job.prompts} training prompts → {job.data_path}")
        prompts = training_prompts(job.prompts)
        record["data_run"] = generate_data(job.target, prompts, job.data_path, job.distill)
    records = read_records(job.data_path)
    if not records:
        raise ValueError(f"no training data in {job.data_path}: run without --skip-data first")
    record["data"] = {"records": len(records), "answer_tokens": sum(len(r["answer_ids"]) for r in records),
                      "prompt_tokens": sum(len(r["prompt_ids"]) for r in records)}
    if job.data_only:
        return record

    from .deps import require

    require()
    if not job.resume and (job.work / "checkpoint.pt").exists():
        raise EdgespecError(
            f"{job.work} already has a training checkpoint: pass --resume to continue it, or remove "
            "checkpoint.pt, loss.csv and eval_before.json there (or pick another --work) to start over."
        )
    from .export import export_adapter
    from .model import LoraSettings, ParallelDrafter, load_draft

    train_records, held_out = split_held_out(records)
    record["data"]["held_out_records"] = len(held_out)
    say(f"train: {job.draft}, K={job.train.k}, masks {list(job.train.mask_ids)}, LoRA rank {job.rank}")
    start = perf_counter()
    drafter = ParallelDrafter(load_draft(job.draft, job.threads), job.train.mask_ids,
                              LoraSettings(rank=job.rank, alpha=job.alpha))
    record["load_seconds"] = round(perf_counter() - start, 1)
    before_path = job.work / "eval_before.json"
    if not before_path.is_file():  # measured once, before the first step (kept across --resume)
        say(f"eval before training on {len(held_out)} held-out answers")
        before_path.write_text(json.dumps(evaluate(drafter, held_out, job.train)))
    record["eval_before"] = json.loads(before_path.read_text())
    record["train"] = train(drafter, train_records, job.work, job.train, resume=job.resume)
    record["eval_after"] = evaluate(drafter, held_out, job.train)
    before, after = record["eval_before"]["top1"], record["eval_after"]["top1"]
    say(f"held-out top-1 per depth: before {before} after {after}")
    curve = read_curve(job.work / "loss.csv")
    record["loss_first"], record["loss_last"] = _ends(curve)
    adapter = export_adapter(drafter.state(), job.draft, job.out, job.train.mask_ids, job.alpha,
                             extra={"lora_rank": job.rank, "steps": record["train"]["steps"]})
    record["adapter"] = adapter
    say(f"adapter: {adapter['path']} ({adapter['bytes']} bytes) sha256 {adapter['sha256']}")
    record["check"] = check_against_llama(drafter, job, records[0])
    say(f"check (llama.cpp vs PyTorch logits): {record['check']}")
    (job.work / "record.json").write_text(json.dumps(record, indent=2, default=str))
    return record


def split_held_out(records: list[dict], every: int = 20) -> tuple[list[dict], list[dict]]:
    """Every ``every``-th prompt index (index % every == every - 1) is held out of training."""
    held = [r for r in records if r["index"] % every == every - 1]
    return [r for r in records if r["index"] % every != every - 1], held


def _ends(curve: list[dict], n: int = 10) -> tuple[dict, dict]:
    """Mean loss of the first and of the last ``n`` optimiser steps (the curve is noisy)."""
    def mean(rows: list[dict]) -> dict:
        keys = [k for k in rows[0] if k == "loss" or k.startswith("ce")] if rows else []
        return {k: round(sum(r[k] for r in rows) / len(rows), 4) for k in keys} | {"steps": len(rows)}

    return (mean(curve[:n]), mean(curve[-n:])) if curve else ({}, {})


def check_against_llama(drafter, job: ParallelJob, record: dict, n_tokens: int = 48) -> dict:
    """One sequence plus the K masks through llama.cpp with the adapter and through PyTorch."""
    from .check import compare, llama_rows, torch_rows

    tokens = (list(record["prompt_ids"]) + list(record["answer_ids"]))[:n_tokens]
    masks = list(job.train.mask_ids)
    ours = torch_rows(drafter, tokens, masks)
    theirs = llama_rows(job.draft, tokens + masks, str(job.out), job.threads)
    n = len(tokens)
    return {"text_rows": compare(ours[:n], theirs[:n]), "mask_rows": compare(ours[n:], theirs[n:])}


def default_train_settings(k: int = 4, mask_base: int | None = None, **kw) -> TrainSettings:
    mask_ids = default_mask_ids(k) if mask_base is None else default_mask_ids(k, mask_base)
    return TrainSettings(k=k, mask_ids=mask_ids, **kw)
