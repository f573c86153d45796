"""A startup check of the native backend: does this llama.cpp build decode this model on this CPU?

A crashing kernel (llama.cpp's AMX matmul on Sapphire Rapids, an instruction the CPU lacks in a
wheel built elsewhere) kills the process with a signal: no Python error, a dead terminal, the answer
lost. So the first time a given build, CPU and model file meet, a child process loads the model and
decodes one token and one 16-token batch (the single-token and the batched matmul paths). If the
child dies, the parent turns that into an ``EngineError`` that says what to do. Success is
remembered in ``<data home>/probes/`` under a key of everything that matters, so later starts cost
one ``stat`` and no decode.

    python -m edgespec.engine.probe MODEL.gguf [--no-repack] [--gpu-layers N] [--reductions backend]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from ..errors import EngineError

PROBE_TIMEOUT = 300.0  # seconds: loading a large model from a cold disk can take a while
BATCH = 16


def probe_key(
    model_path: str, repack: bool, gpu_layers: int, system_info: str, cpu: str, reductions: str = "numpy"
) -> str:
    """Everything that decides whether the kernels work: the build, the CPU, the file, the settings."""
    stat = os.stat(model_path)
    settings = [repack, gpu_layers] + ([reductions] if reductions != "numpy" else [])  # numpy: the old keys
    ident = json.dumps(
        [system_info, cpu, os.path.abspath(model_path), stat.st_size, stat.st_mtime_ns, *settings,
         _llama_version()],
    )
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


def cpu_identity() -> str:
    """The CPU's model name and flags (two machines with equal strings run the same kernels)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(lines[:2])


def _llama_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return "?"


def ensure_backend_works(
    model_path: str,
    repack: bool,
    gpu_layers: int,
    system_info: str,
    probe_dir: Path | None = None,
    reductions: str = "numpy",
) -> None:
    """Probe ``model_path`` in a child process unless this exact combination passed before (remembered
    in ``probe_dir``; None: probe every time); ``reductions``: the context's (backend: its samplers'
    kernels decode too)."""
    key = probe_key(model_path, repack, gpu_layers, system_info, cpu_identity(), reductions)
    marker = probe_dir / f"{key}.ok" if probe_dir is not None else None
    if marker is not None and marker.exists():
        return
    command = [*_probe_command(), model_path, "--gpu-layers", str(gpu_layers), "--reductions", reductions]
    if not repack:
        command.append("--no-repack")
    if not run_probe(command, model_path):
        return  # an ordinary failure (a bad file, say): loading in-process reports it in its own words
    if marker is None:
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"model": model_path, "repack": repack, "gpu_layers": gpu_layers}) + "\n")


def _probe_command() -> list[str]:
    """The child: this package's module, or the single binary itself (which has no ``-m``)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "--engine-probe"]
    return [sys.executable, "-m", "edgespec.engine.probe"]


def run_probe(command: list[str], model_path: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Run the child: True if it passed, False if it failed with an ordinary error; a crash (killed
    by a signal) or a hang becomes an ``EngineError`` that says what to do."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise EngineError(
            f"the native backend did not finish a one-token test decode of {model_path} in {timeout:.0f} s. "
            "Check free memory and disk, or set EDGESPEC_LLAMA_LOG=1 to see llama.cpp's messages."
        ) from exc
    if done.returncode >= 0:
        return done.returncode == 0
    detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    name = signal.Signals(-done.returncode).name
    raise EngineError(
        f"llama.cpp crashed ({name}) in a test decode of {Path(model_path).name} on this CPU, so it would "
        "crash in use too. Reinstall llama-cpp-python for this machine without AMX, with explicit CPU "
        "flags: `python scripts/install_llama.py` (see README, 'Install'); or run with --no-repack "
        "(slower)." + (f" Last output: {' | '.join(detail)}" if detail else "")
    )


def child(argv: list[str] | None = None) -> int:
    """Load, decode one token, then one batch of BATCH tokens; exit 0 if llama.cpp survived."""
    parser = argparse.ArgumentParser(prog="python -m edgespec.engine.probe")
    parser.add_argument("model")
    parser.add_argument("--no-repack", action="store_true")
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--reductions", default="numpy")
    args = parser.parse_args(argv)
    from ._context import Context, ContextSettings
    from ._model import Model
    from .samplers import Keep

    model = Model(args.model, n_gpu_layers=args.gpu_layers, repack=not args.no_repack)
    settings = ContextSettings(n_ctx=256, n_batch=64, n_seq_max=1, n_threads=0, reductions=args.reductions)
    ctx = Context(model, settings)
    try:
        tokens = model.tokenize("def probe(x):\n    return x + 1\n" * 4)[: BATCH + 1]
        ctx.decode(tokens[:1], [0], [(0,)], [True])
        if ctx.reductions == "backend":  # the target's top-k, then the draft's top-K softmax (samplers.py)
            ctx.keep(Keep(8, 1.0, model.n_vocab))
        ctx.decode(tokens[1:], range(1, len(tokens)), [(0,)] * (len(tokens) - 1), [True] * (len(tokens) - 1))
        n = len(tokens) - 1
        rows = ctx.logits_rows(n) if ctx.kept is None else np.concatenate(ctx.sampled_rows(n)[2])
        if not bool(abs(rows).sum() > 0):
            print("the test decode returned all-zero logits", file=sys.stderr)
            return 3
    finally:
        ctx.close()
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(child())
