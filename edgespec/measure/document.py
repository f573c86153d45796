"""What a bench run writes: the JSON document (its schema, the machine and software it ran on, the
models' identities) and reading it back. ``report`` renders it.

Schema ``edgespec-bench/1``, one document per run:

    {"schema", "created", "command", "hardware": {...}, "software": {...}, "pair": {...},
     "settings": {...}, "cost_profile": {...} | null,
     "baseline": {"strategy": "plain", "tokens_per_second", ...,
                  "noise": {"per_run": {spread}, "per_prompt": {spread}}},
     "results": [{"key", "strategy", "budget", "params", "tokens_per_second", "speedup",
                  "speedup_spread": {"median", "min", "max", "p25", "p75"}, "pooled_speedup",
                  "paired_ratios", "mal", "acceptance_rate", "verified_per_step",
                  "draft_decodes_per_step", "mal_per_draft_pass", "mal_per_verified_token",
                  "plain_step_share", "time_split": {"draft", "verify", "overhead"},
                  "python_ms_per_step", "efficiency", "identical_to_plain", ...}, ...],
     "per_prompt": [...]}

``speedup`` is the median over prompts of the paired ratio (the strategy's tokens/s ÷ the tokens/s of
the plain runs right before and after it on the same prompt); efficiency = speedup ÷ MAL (the share
of the ideal speedup a free draft and free verification would give). ``noise``: plain runs paired
against the plain runs before and after them (one strategy run apart), per run and per prompt
(geometric mean) — the spread a strategy that changed nothing would show on this machine.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from .. import __version__

if TYPE_CHECKING:
    from ..engine import EngineSettings
from ..models.store import model_identity
from ..profile.store import cpu_model, llama_version

SCHEMA = "edgespec-bench/1"


# -- environment ----------------------------------------------------------------------------------------
def gpu_names() -> list[str]:
    """GPU names from nvidia-smi when there is one (empty otherwise)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


# The CPU's own instruction sets that decide llama.cpp's kernels (a VM's model name may not tell them)
CPU_FEATURES = (
    "avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
)


def hardware_info(settings: EngineSettings) -> dict:
    from ..engine import cpu_flags, supports_gpu_offload, system_info

    flags = cpu_flags()
    return {
        "cpu": cpu_model(),
        "cpu_features": [f for f in CPU_FEATURES if f in flags],
        "cpu_cores": os.cpu_count(),
        "machine": platform.machine(),
        "gpus": gpu_names(),
        "gpu_offload_supported": supports_gpu_offload(),
        "target_gpu_layers": settings.target_gpu_layers,
        "draft_gpu_layers": settings.draft_gpu_layers,
        "threads": settings.threads or os.cpu_count(),
        "llama_system_info": system_info().strip(),
    }


def software_info() -> dict:
    import numpy

    return {
        "edgespec": __version__,
        "llama_cpp_python": llama_version(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
    }


def model_info(path: str | None, registry_sha: str | None = None) -> dict | None:
    if path is None:
        return None
    ident = model_identity(path)
    return {
        "path": ident["path"],
        "size": ident["size"],
        "sha256": ident["sha256"] or registry_sha,
        "sha256_source": "store" if ident["sha256"] else ("registry" if registry_sha else None),
    }


def document(summary: dict, *, pair: dict, settings: dict, hardware: dict, cost_profile: dict | None) -> dict:
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "hardware": hardware,
        "software": software_info(),
        "pair": pair,
        "settings": settings,
        "cost_profile": cost_profile,
        **summary,
    }


def mark_timing_only(doc: dict, why: str) -> dict:
    """Say on ``doc`` and on each of its figures (the baseline, every result, prompt and the cost
    profile) that they are timings only, and why (``bench --like``: random weights)."""
    doc.update(timing_only=True, timing_only_why=why)
    figures = [doc.get("baseline"), doc.get("cost_profile"), *doc.get("results", [])]
    for figure in figures + doc.get("per_prompt", []):
        if isinstance(figure, dict):
            figure["timing_only"] = True
    return doc


def write_json(doc: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> dict:
    from ..errors import EdgespecError

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EdgespecError(f"cannot read bench results {path}: {exc}") from exc
    if doc.get("schema") != SCHEMA:
        raise EdgespecError(f"{path} is not an `edgespec bench --json` file (schema {doc.get('schema')!r})")
    return doc
