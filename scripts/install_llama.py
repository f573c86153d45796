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
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

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

# CUDA. The oldest toolkit/driver CUDA version a build uses: llama.cpp's CUDA 12 baseline.
CUDA_MIN = (12, 0)
# The CUDA toolkit from PyPI: only CUDA 13's packages carry nvcc (nvidia-cuda-nvcc-cu12 is ptxas alone).
# Installed together with `pip --target`, they lay out one toolkit under nvidia/cu13/.
WHEEL_CUDA_MAJOR = 13
CUDA_WHEELS = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime",
               "nvidia-cublas", "nvidia-cuda-cccl")
WHEEL_MIN_ARCH = 75  # CUDA 13 dropped Maxwell, Pascal and Volta (sm_50 to sm_72)
SMI_QUERY = ("nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader")
PROC_VERSION = "/proc/driver/nvidia/version"
LIBCUDA_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/lib/wsl/lib", "/usr/local/nvidia/lib64")


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


# --- what this machine has: pure functions over an injectable environment -------------------------


class CommandFailed(Exception):
    """A command of `Env.run` that could not start or exited non-zero; the message is its output."""


def run_command(cmd: list[str]) -> str:
    """stdout and stderr of `cmd` together; CommandFailed if it cannot run or exits non-zero."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CommandFailed(str(err)) from err
    out = done.stdout + done.stderr
    if done.returncode:
        raise CommandFailed(out.strip() or f"{cmd[0]} exited with {done.returncode}")
    return out


def read_text(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


class Env(NamedTuple):
    """What detection reads, so that tests can give it a fake driver and toolkit."""

    run: Callable[[list[str]], str] = run_command  # nvidia-smi, nvcc, ldconfig
    which: Callable[[str], str | None] = shutil.which
    read: Callable[[str], str | None] = read_text  # /proc files
    environ: Mapping[str, str] = os.environ
    machine: str = platform.machine()
    cache: Path | None = None  # the edgespec cache folder (default: ~/.cache/edgespec)
    cpuinfo: str | None = None  # /proc/cpuinfo's text (default: read it)
    nvcc_places: tuple[str, ...] = ("/usr/local/cuda/bin/nvcc",)  # where to look after PATH

    def cache_root(self) -> Path:
        return self.cache if self.cache is not None else cache_dir().parent

    def cpu(self) -> str:
        return self.cpuinfo if self.cpuinfo is not None else (self.read("/proc/cpuinfo") or "")


class Gpu(NamedTuple):
    name: str
    arch: str  # compute capability without the dot: "90" for 9.0 (H100/H200), "89" for an RTX 4090


class Driver(NamedTuple):
    version: str  # "580.65.06"
    cuda: tuple[int, int]  # the newest CUDA version it runs (nvidia-smi's "CUDA Version")
    gpus: tuple[Gpu, ...]

    @property
    def archs(self) -> list[str]:
        return sorted({g.arch for g in self.gpus}, key=int)


class Toolkit(NamedTuple):
    nvcc: str  # its path (for the wheels: where it will be once installed)
    root: str  # CUDAToolkit_ROOT
    version: tuple[int, int]
    source: str  # how the line names it
    lib: str = ""  # its cudart and cuBLAS, for the rpath ("": the system's loader finds them)
    wheels: tuple[str, ...] = ()  # pip requirements to install first (empty: the system's toolkit)
    note: str = ""  # why the system's nvcc is not the one


class Choice(NamedTuple):
    line: str  # what was chosen and why, printed
    args: list[str]  # CMAKE_ARGS
    key_args: list[str]  # what the wheel cache keys on: args without paths, plus the CUDA version
    driver: Driver | None = None
    toolkit: Toolkit | None = None  # None: a CPU build

    @property
    def cuda(self) -> bool:
        return self.toolkit is not None


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def _show(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def parse_smi(text: str) -> tuple[str | None, tuple[int, int] | None]:
    """Driver version and CUDA version from plain `nvidia-smi`'s header."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*(\d+\.\d+)", text)
    return (driver.group(1) if driver else None), (_version(cuda.group(1)) if cuda else None)


def parse_gpus(csv: str) -> tuple[Gpu, ...]:
    """`nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader`, one GPU a line."""
    gpus = []
    for line in csv.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) == 3 and re.fullmatch(r"\d+\.\d+", parts[1]):
            gpus.append(Gpu(parts[0], parts[1].replace(".", "")))
    return tuple(gpus)


def detect_driver(env: Env) -> tuple[Driver | None, str]:
    """The NVIDIA driver and its GPUs, or None and why not (a phrase for "CPU build: ...")."""
    proc = env.read(PROC_VERSION)
    if env.which("nvidia-smi") is None:
        if proc is None:
            return None, "no NVIDIA driver found"
        found = re.search(r"Kernel Module\s+([\d.]+)", proc)
        driver = f"the NVIDIA driver {found.group(1)}" if found else "an NVIDIA driver"
        return None, (f"{driver} is loaded ({PROC_VERSION}) but nvidia-smi is not on PATH, so this GPU's "
                      "architecture and CUDA version are unknown: install the driver's utilities "
                      "(nvidia-smi) and rerun")
    try:
        header = env.run(["nvidia-smi"])
        gpus = parse_gpus(env.run(list(SMI_QUERY)))
    except CommandFailed as err:
        first = next((s for s in str(err).splitlines() if s.strip()), "no output")
        return None, f"nvidia-smi failed ({first.strip()})"
    version, cuda = parse_smi(header)
    if not gpus:
        return None, "nvidia-smi lists no GPU with a compute capability (a driver older than 510?)"
    if cuda is None:
        return None, "nvidia-smi does not say which CUDA version the driver runs"
    return Driver(version or "?", cuda, gpus), ""


def parse_nvcc_version(text: str) -> tuple[int, int] | None:
    found = re.search(r"release (\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def nvcc_candidates(env: Env) -> list[str]:
    """Where a system nvcc may be, in order: CUDACXX, CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda."""
    found = [env.environ.get("CUDACXX", "")]
    homes = [env.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH")]
    found += [str(Path(home) / "bin" / "nvcc") for home in homes if home]
    found += [env.which("nvcc") or "", *env.nvcc_places]
    seen: list[str] = []
    for path in found:
        if path and path not in seen and os.path.isfile(path):
            seen.append(path)
    return seen


def toolkit_root(env: Env, nvcc: str) -> Path:
    """The toolkit's top folder as nvcc itself sees it (its `_HERE_`: /usr/local/bin/nvcc may be a
    wrapper script), else the folder above the nvcc binary."""
    try:
        out = env.run([nvcc, "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull])
        here = re.search(r"_HERE_=(.+)$", out, re.MULTILINE)
        if here:
            return Path(here.group(1).strip()).parent
    except CommandFailed:
        pass
    return Path(os.path.realpath(nvcc)).parent.parent


def has_cublas(root: Path) -> bool:
    """cuBLAS (library and header) in the toolkit at `root` (or the system's, for a toolkit in /usr)."""
    libs = [root / "lib64", root / "lib", *root.glob("targets/*/lib")]
    heads = [root / "include", *root.glob("targets/*/include")]
    if root == Path("/usr"):
        libs += [Path(d) for d in LIBCUDA_DIRS]
        heads.append(Path("/usr/include"))
    return (any(next(d.glob("libcublas.so*"), None) for d in libs if d.is_dir())
            and any((d / "cublas_v2.h").is_file() for d in heads))


def system_toolkit(env: Env, driver: Driver) -> tuple[Toolkit | None, str]:
    """The system's nvcc when it suits the driver and the GPU, or None and why not."""
    candidates = nvcc_candidates(env)
    if not candidates:
        return None, "no nvcc found (CUDACXX, CUDA_HOME, PATH, /usr/local/cuda)"
    reasons = []
    for nvcc in candidates:
        try:
            version = parse_nvcc_version(env.run([nvcc, "--version"]))
        except CommandFailed as err:
            reasons.append(f"{nvcc} does not run ({str(err).splitlines()[0] if str(err) else 'no output'})")
            continue
        if version is None:
            reasons.append(f"{nvcc} --version names no release")
            continue
        why = _unsuitable(env, nvcc, version, driver)
        if why:
            reasons.append(why)
            continue
        root = toolkit_root(env, nvcc)
        if not has_cublas(root):
            reasons.append(f"the system's nvcc {_show(version)} has no cuBLAS beside it ({root})")
            continue
        lib = runtime_dir(root)
        return Toolkit(nvcc, str(root), version, f"nvcc {_show(version)} at {nvcc}", str(lib or "")), ""
    return None, "; ".join(reasons)


def _unsuitable(env: Env, nvcc: str, version: tuple[int, int], driver: Driver) -> str:
    if version < CUDA_MIN:
        return f"the system's nvcc {_show(version)} is older than CUDA {_show(CUDA_MIN)}"
    if version[0] > driver.cuda[0]:
        return (f"the system's nvcc {_show(version)} is newer than the driver's CUDA {_show(driver.cuda)}: "
                "what it builds would not load")
    try:
        known = set(re.findall(r"compute_(\d+)", env.run([nvcc, "--list-gpu-arch"])))
    except CommandFailed:
        known = set()  # an nvcc without --list-gpu-arch: let the build say
    missing = [a for a in driver.archs if known and a not in known]
    if missing:
        return f"the system's nvcc {_show(version)} cannot compile for sm_{missing[0]}"
    return ""


def toolkit_dir(env: Env, version: tuple[int, int]) -> Path:
    """Where the PyPI CUDA toolkit of this version lives: pip's `--target` folder."""
    return env.cache_root() / "cuda" / _show(version)


def wheel_toolkit(env: Env, driver: Driver) -> tuple[Toolkit | None, str]:
    """CUDA 13's toolkit from PyPI, not newer than the driver, or None and why not."""
    if driver.cuda[0] < WHEEL_CUDA_MAJOR:
        return None, (f"PyPI has no nvcc for CUDA {driver.cuda[0]} (only CUDA {WHEEL_CUDA_MAJOR}'s packages "
                      "carry one)")
    old = [a for a in driver.archs if int(a) < WHEEL_MIN_ARCH]
    if old:
        return None, f"CUDA {WHEEL_CUDA_MAJOR}, the toolkit PyPI has, no longer compiles for sm_{old[0]}"
    if env.machine not in ("x86_64", "AMD64", "aarch64"):
        return None, f"PyPI's CUDA toolkit has no build for {env.machine}"
    minor = driver.cuda[1] if driver.cuda[0] == WHEEL_CUDA_MAJOR else 99
    version = (WHEEL_CUDA_MAJOR, minor)
    upper = f"{WHEEL_CUDA_MAJOR}.{minor + 1}"
    wheels = tuple(f"{name}>={WHEEL_CUDA_MAJOR}.0,<{upper}" for name in CUDA_WHEELS)
    root = toolkit_dir(env, version) / "nvidia" / f"cu{WHEEL_CUDA_MAJOR}"
    installed = parse_nvcc_version(read_text(str(toolkit_dir(env, version) / "READY")) or "") or version
    source = f"nvcc from PyPI's {CUDA_WHEELS[0]} {_show(installed)} wheels"
    return Toolkit(str(root / "bin" / "nvcc"), str(root), installed, source, str(root / "lib"), wheels), ""


def runtime_dir(root: Path) -> Path | None:
    """The toolkit's folder of libcudart/libcublas, for the build's rpath (None: the system's own)."""
    if root == Path("/usr"):
        return None
    for lib in (root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))):
        if next(lib.glob("libcudart.so*"), None) is not None:
            return lib
    return root / "lib"


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
    line = (f"CUDA {_show(toolkit.version)} build for {'+'.join('sm_' + a for a in archs)} ({gpus}, "
            f"driver {driver.version}, {toolkit.source}{note})")
    key = [*base, *cuda, *user, f"cuda={_show(toolkit.version)}"]
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
            f"the NVIDIA driver {driver.version} runs CUDA {_show(driver.cuda)} at most; llama.cpp's CUDA "
            f"build needs CUDA {_show(CUDA_MIN)} or newer (driver 525+): update the driver and rerun"))
    toolkit, why_not_system = system_toolkit(env, driver)
    if toolkit is not None:
        return cuda_choice(env, driver, toolkit)
    toolkit, why_not_wheels = wheel_toolkit(env, driver)
    if toolkit is not None:
        return cuda_choice(env, driver, toolkit._replace(note=why_not_system))
    major = driver.cuda[0]
    return cpu_choice(opts, env, (
        f"NVIDIA driver {driver.version} (CUDA {_show(driver.cuda)}) but no CUDA compiler to use: "
        f"{why_not_system}; {why_not_wheels}. Install a CUDA {major}.x toolkit (nvcc and cuBLAS, at most "
        f"{_show(driver.cuda)}) or a driver for CUDA {WHEEL_CUDA_MAJOR} (580+), then rerun"))


# --- building, installing, checking ------------------------------------------------------------------


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


def find_libcuda(env: Env) -> str | None:
    """The driver's libcuda.so.1 (what a stub libcuda.so for the linker should point at)."""
    try:
        for line in env.run(["ldconfig", "-p"]).splitlines():
            if line.strip().startswith("libcuda.so.1 ") and "=>" in line:
                return line.split("=>", 1)[1].strip()
    except CommandFailed:
        pass
    found = (Path(d) / "libcuda.so.1" for d in LIBCUDA_DIRS)
    return next((str(lib) for lib in found if lib.exists()), None)


def complete_toolkit(root: Path, machine: str, libcuda: str | None) -> None:
    """Make PyPI's toolkit folder look like an installed CUDA toolkit to CMake and nvcc: `lib64` and
    `targets/<arch>-linux/{include,lib}` links, unversioned `libX.so` links, and `lib/stubs/libcuda.so`
    pointing at the driver's library (the link step needs an unversioned libcuda)."""
    def link(path: Path, to: str) -> None:
        if not path.exists() and not path.is_symlink():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(to)

    link(root / "lib64", "lib")
    target = root / "targets" / ("sbsa-linux" if machine == "aarch64" else "x86_64-linux")
    link(target / "include", "../../include")
    link(target / "lib", "../../lib")
    for lib in (root / "lib").glob("lib*.so.*"):
        unversioned = re.fullmatch(r"(lib[\w+-]+\.so)\.\d+", lib.name)
        if unversioned:
            link(lib.with_name(unversioned.group(1)), lib.name)
    if libcuda:
        link(root / "lib" / "stubs" / "libcuda.so", libcuda)


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
    source = f"nvcc from PyPI's {CUDA_WHEELS[0]} {_show(version)} wheels"
    real = toolkit._replace(version=version, source=source)
    return cuda_choice(env, driver, real)


class Steps(NamedTuple):
    """The actions with side effects (tests pass fakes)."""

    build: Callable[[list[str], Path], Path] = build_wheel
    install: Callable[[Path], None] = pip_install
    check: Callable[[], str] = cuda_check
    fetch_toolkit: Callable[[list[str], Path], None] = pip_target


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
