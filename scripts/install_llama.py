#!/usr/bin/env python3
"""Build and install llama-cpp-python with explicit CPU flags: never `-march=native`, never AMX.

Why: llama.cpp's default build (`GGML_NATIVE=ON`) compiles its AMX matmul path on Intel CPUs that
have AMX (Sapphire Rapids and later), and that path (`ggml_backend_amx_mul_mat`) segfaults on Q4_K
models there. We list the instruction sets this CPU has (from /proc/cpuinfo) as explicit
`GGML_<ISA>=ON` flags and leave every AMX flag off: the same kernels as a native build (the
repacked Q4_K/Q8 paths included), minus the crashing one.

pip's wheel cache does not key on CMAKE_ARGS (a wheel built once with other flags is reused
silently), so this script builds with `--no-cache-dir` into its own cache, keyed by version and
flags, and installs that exact wheel. A second run with the same flags reuses it in seconds.

    python scripts/install_llama.py                 # this CPU's instruction sets, no AMX
    python scripts/install_llama.py --portable      # AVX2 baseline: runs on any x86-64 CPU with AVX2
    python scripts/install_llama.py --print-args    # just print the CMAKE_ARGS
    CMAKE_ARGS="-DGGML_CUDA=on" python scripts/install_llama.py   # CUDA: your flags are added to ours
    python scripts/install_llama.py --wheel-dir DIR # also copy the built wheel to DIR
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"  # keep equal to the pin in pyproject.toml (a test checks)

# /proc/cpuinfo flag(s) → ggml's CMake option. Order is irrelevant; AMX is deliberately absent.
X86_FEATURES: dict[str, tuple[str, ...]] = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_F16C": ("f16c",),
    "GGML_FMA": ("fma",),
    "GGML_BMI2": ("bmi2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    # ggml's GGML_AVX512 turns on F, CD, VL, DQ and BW together.
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "GGML_AVX512_VBMI": ("avx512vbmi",),
    "GGML_AVX512_VNNI": ("avx512_vnni",),
    "GGML_AVX512_BF16": ("avx512_bf16",),
}
PORTABLE = ("GGML_SSE42", "GGML_F16C", "GGML_FMA", "GGML_BMI2", "GGML_AVX", "GGML_AVX2")
NEVER = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
# In every build: ggml's RPC backend (`edgespec rpc-server`, `--rpc`; part of the cache key).
ALWAYS = ("-DGGML_RPC=ON",)


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of the first processor listed in /proc/cpuinfo."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cmake_args(flags: set[str] | None, user_args: str = "") -> list[str]:
    """Explicit ggml CPU options: those the CPU has (or the portable set when `flags` is None)."""
    if flags is None:
        enabled = set(PORTABLE)
    else:
        enabled = {opt for opt, need in X86_FEATURES.items() if all(f in flags for f in need)}
    args = ["-DGGML_NATIVE=OFF", *ALWAYS]
    args += [f"-D{opt}={'ON' if opt in enabled else 'OFF'}" for opt in X86_FEATURES]
    args += [f"-D{opt}=OFF" for opt in NEVER]
    # The user's own flags (CUDA, say) come last; AMX stays off even if they ask for native.
    return args + user_args.split()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgespec" / "llama-wheels"


def build_key(args: list[str]) -> str:
    ident = " ".join([LLAMA_CPP_PYTHON, platform.machine(), sys.implementation.cache_tag, *args])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def build_wheel(args: list[str], out: Path) -> Path:
    """pip wheel from the sdist with these CMAKE_ARGS, bypassing pip's wheel cache."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CMAKE_ARGS=" ".join(args))
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    print(f"building llama-cpp-python {LLAMA_CPP_PYTHON} (4-9 minutes on 2 cores) with\n  "
          + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
                    "--no-binary", "llama-cpp-python", "-w", str(out),
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], env=env, check=True)
    return next(out.glob("llama_cpp_python-*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--portable", action="store_true",
                        help="AVX2 baseline instead of this CPU's instruction sets (for a binary to ship)")
    parser.add_argument("--print-args", action="store_true", help="print the CMAKE_ARGS and exit")
    parser.add_argument("--wheel-dir", type=Path, help="also copy the wheel here")
    parser.add_argument("--rebuild", action="store_true", help="ignore the cached wheel")
    parser.add_argument("--no-install", action="store_true", help="build (or find) the wheel only")
    opts = parser.parse_args(argv)

    if platform.machine() not in ("x86_64", "AMD64"):  # no x86 options; ggml picks the architecture's own
        args = [*ALWAYS, *os.environ.get("CMAKE_ARGS", "").split()]
    else:
        flags = None if opts.portable else cpu_flags(Path("/proc/cpuinfo").read_text())
        args = cmake_args(flags, os.environ.get("CMAKE_ARGS", ""))
    if opts.print_args:
        print(" ".join(args))
        return 0

    where = cache_dir() / build_key(args)
    wheels = sorted(where.glob("llama_cpp_python-*.whl"))
    if opts.rebuild or not wheels:
        shutil.rmtree(where, ignore_errors=True)
        wheel = build_wheel(args, where)
        (where / "CMAKE_ARGS").write_text(" ".join(args) + "\n")
    else:
        wheel = wheels[0]
        print(f"using the cached llama-cpp-python wheel built with the same flags: {wheel}")
    if opts.no_install:
        print(wheel)
        return 0
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir"]
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(wheel)], check=True)  # this exact build
    subprocess.run([*pip, str(wheel)], check=True)  # and whatever it needs (numpy, diskcache, jinja2)
    if opts.wheel_dir:
        opts.wheel_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, opts.wheel_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
