"""What this machine has for a CUDA build of llama-cpp-python, read through an injectable `Env` (tests
give it a fake driver and toolkit): the NVIDIA driver and its GPUs (nvidia-smi), the system's nvcc when it
suits them, else CUDA 13's toolkit from PyPI; and that PyPI toolkit laid out as an installed one.

scripts/install_llama.py chooses from these; each finder returns what it found, or None and why not (a
phrase for the line the install prints).
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

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


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgespec" / "llama-wheels"


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


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def dotted(version: tuple[int, int]) -> str:
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
            reasons.append(f"the system's nvcc {dotted(version)} has no cuBLAS beside it ({root})")
            continue
        lib = runtime_dir(root)
        return Toolkit(nvcc, str(root), version, f"nvcc {dotted(version)} at {nvcc}", str(lib or "")), ""
    return None, "; ".join(reasons)


def _unsuitable(env: Env, nvcc: str, version: tuple[int, int], driver: Driver) -> str:
    if version < CUDA_MIN:
        return f"the system's nvcc {dotted(version)} is older than CUDA {dotted(CUDA_MIN)}"
    if version[0] > driver.cuda[0]:
        return (f"the system's nvcc {dotted(version)} is newer than the driver's CUDA {dotted(driver.cuda)}: "
                "what it builds would not load")
    try:
        known = set(re.findall(r"compute_(\d+)", env.run([nvcc, "--list-gpu-arch"])))
    except CommandFailed:
        known = set()  # an nvcc without --list-gpu-arch: let the build say
    missing = [a for a in driver.archs if known and a not in known]
    if missing:
        return f"the system's nvcc {dotted(version)} cannot compile for sm_{missing[0]}"
    return ""


def toolkit_dir(env: Env, version: tuple[int, int]) -> Path:
    """Where the PyPI CUDA toolkit of this version lives: pip's `--target` folder."""
    return env.cache_root() / "cuda" / dotted(version)


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
    source = f"nvcc from PyPI's {CUDA_WHEELS[0]} {dotted(installed)} wheels"
    return Toolkit(str(root / "bin" / "nvcc"), str(root), installed, source, str(root / "lib"), wheels), ""


def runtime_dir(root: Path) -> Path | None:
    """The toolkit's folder of libcudart/libcublas, for the build's rpath (None: the system's own)."""
    if root == Path("/usr"):
        return None
    for lib in (root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib"))):
        if next(lib.glob("libcudart.so*"), None) is not None:
            return lib
    return root / "lib"


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
