#!/usr/bin/env python3
"""Build and install llama-cpp-python: with CUDA for this machine's NVIDIA GPU when it has one, else
for its CPU; in both, explicit CPU flags: never `-march=native`, never AMX.

Why explicit CPU flags: llama.cpp's default build (`GGML_NATIVE=ON`) compiles its AMX matmul path on
Intel CPUs that have AMX (Sapphire Rapids and later), and that path (`ggml_backend_amx_mul_mat`)
segfaults on Q4_K models there. We list the instruction sets this CPU has (from /proc/cpuinfo) as
explicit `GGML_<ISA>=ON` flags and leave every AMX flag off: the same kernels as a native build (the
repacked Q4_K/Q8 paths included), minus the crashing one.

CUDA: with an NVIDIA driver (nvidia-smi), the build adds `GGML_CUDA=on` for this GPU's architecture
(nvidia-smi's compute capability), compiled by the system's nvcc when it suits the driver (same or
older CUDA major version, knows the architecture, has cuBLAS beside it), else by the CUDA 13 toolkit
from PyPI (nvidia-cuda-nvcc and friends) installed into the build cache, when the driver runs CUDA 13
(CUDA 12's PyPI packages have no nvcc). It prints one line saying what it chose and why. A CUDA build
that fails, or that installs but cannot see the GPU, falls back to the CPU build with the reason.

pip's wheel cache does not key on CMAKE_ARGS (a wheel built once with other flags is reused
silently), so this script builds with `--no-cache-dir` into its own cache, keyed by version and
flags (and for CUDA, the architecture and toolkit version), and installs that exact wheel. A second
run with the same choice reuses it in seconds.

    python scripts/install_llama.py                 # CUDA if there is an NVIDIA GPU, else CPU; no AMX
    python scripts/install_llama.py --cpu           # this CPU's instruction sets only, even with a GPU
    python scripts/install_llama.py --portable      # AVX2 baseline, CPU only: runs on any x86-64 with AVX2
    python scripts/install_llama.py --dry-run       # what it would build, and why; builds nothing
    python scripts/install_llama.py --print-args    # just print the CMAKE_ARGS
    CMAKE_ARGS="-DGGML_CUDA=on" python scripts/install_llama.py   # your flags after ours, no detection
    python scripts/install_llama.py --wheel-dir DIR # also copy the built wheel to DIR

This file chooses (CPU flags, CPU or CUDA) and runs the steps with the CPU fallback; scripts/llama_build/
cuda.py finds the driver and a toolkit, scripts/llama_build/wheel.py builds, installs and checks the wheel.
"""
from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

# scripts/llama_build/ (scripts/ is on sys.path when this file runs as a script; tests load it by path)
from llama_build.cuda import (
    CUDA_MIN,
    CUDA_WHEELS,
    WHEEL_CUDA_MAJOR,
    CommandFailed,
    Driver,
    Env,
    Toolkit,
    complete_toolkit,
    detect_driver,
    dotted,
    find_libcuda,
    parse_nvcc_version,
    read_text,
    system_toolkit,
    wheel_toolkit,
)
from llama_build.wheel import StepFailed, Steps, build_key

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


# --- the choice: CPU or CUDA, and why -----------------------------------------------------------------


class Choice(NamedTuple):
    line: str  # what was chosen and why, printed
    args: list[str]  # CMAKE_ARGS
    key_args: list[str]  # what the wheel cache keys on: args without paths, plus the CUDA version
    driver: Driver | None = None
    toolkit: Toolkit | None = None  # None: a CPU build

    @property
    def cuda(self) -> bool:
        return self.toolkit is not None


def cpu_args(opts: argparse.Namespace, env: Env) -> list[str]:
    """Today's CPU CMake arguments, the user's CMAKE_ARGS last, unchanged: the wheel cache keys on them."""
    return [*cpu_base(opts.portable, env), *env.environ.get("CMAKE_ARGS", "").split()]


def cpu_base(portable: bool, env: Env) -> list[str]:
    if env.machine not in ("x86_64", "AMD64"):  # no x86 options; ggml picks the architecture's own
        return [*ALWAYS]
    return cmake_args(None if portable else cpu_flags(env.cpu()))


def cpu_choice(opts: argparse.Namespace, env: Env, why: str) -> Choice:
    args = cpu_args(opts, env)
    return Choice(f"CPU build: {why}", args, args)


def cuda_choice(env: Env, driver: Driver, toolkit: Toolkit) -> Choice:
    """This CPU's flags, then CUDA for the driver's GPUs with this toolkit, then the user's CMAKE_ARGS."""
    archs = driver.archs
    base, user = cpu_base(False, env), env.environ.get("CMAKE_ARGS", "").split()
    cuda = ["-DGGML_CUDA=on", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}"]
    paths = [f"-DCMAKE_CUDA_COMPILER={shlex.quote(toolkit.nvcc)}",
             f"-DCUDAToolkit_ROOT={shlex.quote(toolkit.root)}"]
    if toolkit.lib:  # cudart and cuBLAS load from the toolkit the build used (llama-cpp-python's own
        # rpath is $ORIGIN alone); _INIT: added to LDFLAGS, not instead
        paths.append(f"-DCMAKE_SHARED_LINKER_FLAGS_INIT={shlex.quote(f'-Wl,-rpath,{toolkit.lib}')}")
    names = sorted({g.name for g in driver.gpus})
    gpus = ", ".join(names) if len(driver.gpus) == 1 else f"{len(driver.gpus)} GPUs: {', '.join(names)}"
    note = f"; {toolkit.note}" if toolkit.note else ""
    line = (f"CUDA {dotted(toolkit.version)} build for {'+'.join('sm_' + a for a in archs)} ({gpus}, "
            f"driver {driver.version}, {toolkit.source}{note})")
    key = [*base, *cuda, *user, f"cuda={dotted(toolkit.version)}"]
    return Choice(line, [*base, *cuda, *paths, *user], key, driver, toolkit)


def choose(opts: argparse.Namespace, env: Env) -> Choice:
    """CPU or CUDA, with which toolkit, and the one line that says why."""
    if opts.cpu:
        return cpu_choice(opts, env, "--cpu given")
    if opts.portable:
        return cpu_choice(opts, env, "--portable builds the CPU-only wheel a shipped binary needs")
    user = env.environ.get("CMAKE_ARGS", "")
    if re.search(r"GGML_(CUDA|HIP|VULKAN|METAL|SYCL|MUSA|OPENCL)\b", user):
        args = cpu_args(opts, env)
        line = f"your CMAKE_ARGS ({user.strip()}) after this CPU's flags: no GPU detection"
        return Choice(line, args, args)
    driver, why = detect_driver(env)
    if driver is None:
        return cpu_choice(opts, env, why)
    if driver.cuda < CUDA_MIN:
        return cpu_choice(opts, env, (
            f"the NVIDIA driver {driver.version} runs CUDA {dotted(driver.cuda)} at most; llama.cpp's CUDA "
            f"build needs CUDA {dotted(CUDA_MIN)} or newer (driver 525+): update the driver and rerun"))
    toolkit, why_not_system = system_toolkit(env, driver)
    if toolkit is not None:
        return cuda_choice(env, driver, toolkit)
    toolkit, why_not_wheels = wheel_toolkit(env, driver)
    if toolkit is not None:
        return cuda_choice(env, driver, toolkit._replace(note=why_not_system))
    major = driver.cuda[0]
    return cpu_choice(opts, env, (
        f"NVIDIA driver {driver.version} (CUDA {dotted(driver.cuda)}) but no CUDA compiler to use: "
        f"{why_not_system}; {why_not_wheels}. Install a CUDA {major}.x toolkit (nvcc and cuBLAS, at most "
        f"{dotted(driver.cuda)}) or a driver for CUDA {WHEEL_CUDA_MAJOR} (580+), then rerun"))


# --- installing the choice, falling back to the CPU ---------------------------------------------------


def prepare_toolkit(choice: Choice, env: Env, fetch: Callable[[list[str], Path], None]) -> Choice:
    """Install PyPI's toolkit into the cache if the choice needs it (once), and name its real version."""
    toolkit = choice.toolkit
    if toolkit is None or not toolkit.wheels:
        return choice
    where = Path(toolkit.root).parent.parent
    if not (where / "READY").is_file():
        print(f"installing the CUDA toolkit from PyPI into {where} (about 1 GB): {' '.join(toolkit.wheels)}",
              flush=True)
        shutil.rmtree(where, ignore_errors=True)
        try:
            fetch(list(toolkit.wheels), where)
        except (subprocess.CalledProcessError, OSError) as err:
            raise StepFailed(f"installing the CUDA toolkit wheels failed ({err})") from err
        complete_toolkit(Path(toolkit.root), env.machine, find_libcuda(env))
        try:
            version = env.run([toolkit.nvcc, "--version"])
        except CommandFailed as err:
            raise StepFailed(f"the CUDA toolkit from PyPI does not run: {err}") from err
        (where / "READY").write_text(version)
    version = parse_nvcc_version(read_text(str(where / "READY")) or "")
    if version is None:
        raise StepFailed(f"the CUDA toolkit in {where} names no version: delete that folder and rerun")
    driver = choice.driver
    assert driver is not None
    source = f"nvcc from PyPI's {CUDA_WHEELS[0]} {dotted(version)} wheels"
    real = toolkit._replace(version=version, source=source)
    return cuda_choice(env, driver, real)


def wheel_for(choice: Choice, env: Env, steps: Steps, rebuild: bool) -> Path:
    """The cached wheel for this choice, built first if there is none (or `rebuild`)."""
    where = env.cache_root() / "llama-wheels" / build_key(choice.key_args)
    wheels = sorted(where.glob("llama_cpp_python-*.whl"))
    if wheels and not rebuild:
        print(f"using the cached llama-cpp-python wheel built with the same flags: {wheels[0]}")
        return wheels[0]
    shutil.rmtree(where, ignore_errors=True)
    wheel = steps.build(choice.args, where)
    (where / "CMAKE_ARGS").write_text(" ".join(choice.args) + "\n")
    return wheel


def install_choice(choice: Choice, opts: argparse.Namespace, env: Env, steps: Steps) -> tuple[Choice, Path]:
    """Build (or reuse) and install the chosen wheel; a CUDA choice that fails at any step falls back to
    the CPU build, saying why and how to retry. Returns what was installed."""
    if choice.cuda:
        try:
            choice = prepare_toolkit(choice, env, steps.fetch_toolkit)
            wheel = wheel_for(choice, env, steps, opts.rebuild)
            if not opts.no_install:
                try:
                    steps.install(wheel)
                except subprocess.CalledProcessError as err:
                    raise StepFailed(f"installing the CUDA wheel failed ({err})") from err
                problem = steps.check()
                if problem:
                    raise StepFailed(problem)
            return choice, wheel
        except StepFailed as failed:
            print(f"\nthe CUDA build failed: {failed.reason}", *failed.tail, sep="\n  ")
            if failed.log:
                print(f"  (whole log: {failed.log})")
            print("falling back to the CPU build. Rerun `python scripts/install_llama.py` to try CUDA again "
                  "once that is fixed, or pass --cpu to stop trying.\n", flush=True)
            choice = cpu_choice(opts, env, "the CUDA build failed (above)")
            print(choice.line, flush=True)
    wheel = wheel_for(choice, env, steps, opts.rebuild)
    if not opts.no_install:
        steps.install(wheel)
    return choice, wheel


def main(argv: list[str] | None = None, env: Env | None = None, steps: Steps | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="build for the CPU only, even with an NVIDIA GPU")
    parser.add_argument("--portable", action="store_true",
                        help="AVX2 baseline instead of this CPU's instruction sets, CPU only "
                             "(for a binary to ship)")
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would be built and why (CMAKE_ARGS, cache folder); build nothing")
    parser.add_argument("--print-args", action="store_true", help="print the CMAKE_ARGS and exit")
    parser.add_argument("--wheel-dir", type=Path, help="also copy the wheel here")
    parser.add_argument("--rebuild", action="store_true", help="ignore the cached wheel")
    parser.add_argument("--no-install", action="store_true", help="build (or find) the wheel only")
    opts = parser.parse_args(argv)
    env = env or Env()
    steps = steps or Steps()

    choice = choose(opts, env)
    if opts.print_args:
        print(" ".join(choice.args))
        return 0
    print(choice.line, flush=True)
    if opts.dry_run:
        where = env.cache_root() / "llama-wheels" / build_key(choice.key_args)
        built = next(where.glob("llama_cpp_python-*.whl"), None)
        print(f"CMAKE_ARGS: {' '.join(choice.args)}")
        if choice.toolkit is not None and choice.toolkit.wheels:
            print(f"toolkit: pip install --target {Path(choice.toolkit.root).parent.parent} "
                  + " ".join(shlex.quote(w) for w in choice.toolkit.wheels))
        print(f"wheel cache: {where} ({'built: ' + built.name if built else 'not built yet'})")
        return 0
    choice, wheel = install_choice(choice, opts, env, steps)
    if opts.no_install:
        print(wheel)
    if opts.wheel_dir:
        opts.wheel_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, opts.wheel_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
