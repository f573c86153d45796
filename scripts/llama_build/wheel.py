"""Building and installing llama-cpp-python's wheel, and checking that a CUDA build sees the GPU: the
steps of scripts/install_llama.py with side effects (`Steps`; tests pass fakes). A failing CUDA step
raises `StepFailed`, which install_llama.py turns into the CPU build's fallback.
"""
from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

LLAMA_CPP_PYTHON = "0.3.36"  # keep equal to the pin in pyproject.toml (a test checks)


def build_key(args: list[str]) -> str:
    ident = " ".join([LLAMA_CPP_PYTHON, platform.machine(), sys.implementation.cache_tag, *args])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


class StepFailed(Exception):
    """A CUDA step that failed: `reason` in a sentence, `tail` the last lines of its output."""

    def __init__(self, reason: str, tail: list[str] | None = None, log: Path | None = None):
        super().__init__(reason)
        self.reason, self.tail, self.log = reason, tail or [], log


def error_tail(log: str, lines: int = 15) -> list[str]:
    """The build log's last lines before pip's own closing notes: where the compiler's error is."""
    kept = log.splitlines()
    for i, line in enumerate(kept):
        if "note: This error originates from a subprocess" in line:
            kept = kept[:i]
            break
    tail = [s for s in kept if s.strip()][-lines:]
    return textwrap.dedent("\n".join(tail)).splitlines()


def build_wheel(args: list[str], out: Path) -> Path:
    """pip wheel from the sdist with these CMAKE_ARGS, bypassing pip's wheel cache; the output is
    shown and kept in `out/build.log`. StepFailed with the log's tail when pip fails."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CMAKE_ARGS=" ".join(args))
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    cuda = any(a.startswith("-DGGML_CUDA=on") for a in args)
    took = "4-9 minutes on 2 cores"
    if cuda:
        took = "with CUDA for one GPU architecture: about 55 minutes on 2 cores"
    print(f"building llama-cpp-python {LLAMA_CPP_PYTHON} ({took}) with\n  " + " ".join(args), flush=True)
    log = out / "build.log"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary",
           "llama-cpp-python", "-w", str(out), f"llama-cpp-python=={LLAMA_CPP_PYTHON}"]
    piped = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace"}
    with log.open("w") as keep, subprocess.Popen(cmd, env=env, **piped) as pip:
        for line in pip.stdout:
            sys.stdout.write(line)
            keep.write(line)
    if pip.returncode:
        raise StepFailed(f"pip wheel exited with {pip.returncode}", error_tail(log.read_text()), log)
    return next(out.glob("llama_cpp_python-*.whl"))


def pip_install(wheel: Path) -> None:
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir"]
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(wheel)], check=True)  # this exact build
    subprocess.run([*pip, str(wheel)], check=True)  # and whatever it needs (numpy, diskcache, jinja2)


GPU_CHECK = "import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 3)"


def cuda_check() -> str:
    """Empty when the installed llama-cpp-python loads and sees a GPU, else what went wrong."""
    done = subprocess.run([sys.executable, "-c", GPU_CHECK], capture_output=True, text=True)
    if done.returncode == 0:
        return ""
    if done.returncode == 3:
        return "the CUDA build installed, but llama.cpp finds no GPU through it"
    out = [s for s in (done.stdout + done.stderr).splitlines() if s.strip()]
    return "the CUDA build installed, but does not load: " + (out[-1] if out else f"exit {done.returncode}")


def pip_target(requirements: list[str], target: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target), *requirements],
                   check=True)


class Steps(NamedTuple):
    """The actions with side effects (tests pass fakes)."""

    build: Callable[[list[str], Path], Path] = build_wheel
    install: Callable[[Path], None] = pip_install
    check: Callable[[], str] = cuda_check
    fetch_toolkit: Callable[[list[str], Path], None] = pip_target
