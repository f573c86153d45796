#!/usr/bin/env python3
"""Build ``dist/edgespec``: edgespec as one self-contained executable (PyInstaller ``--onefile``).

It freezes the Python environment it runs in: CPython, edgespec and its TUI (CSS included), numpy,
Textual, Rich, huggingface_hub, platformdirs, and llama-cpp-python with its native libraries
(``llama_cpp/lib/*.so``: llama-cpp-python has no PyInstaller hook, and without them a frozen app
fails with "Shared library with base name 'llama' not found"). For a binary that runs on any x86-64
CPU with AVX2, that environment's llama-cpp-python must be the portable build
(``python scripts/install_llama.py --portable``, which scripts/test.sh uses); this script refuses
a build with instruction sets beyond AVX2 unless ``--allow-non-portable``.

Layout, chosen by measured start-up time (lab/notebook.md, "Single binary"): PyInstaller's own
``--onefile`` unpacks ~140 MB on every start (~1 s before anything runs), so the app is frozen as a
folder (``--onedir``) and shipped inside one file: a short POSIX ``sh`` launcher followed by the
folder as a tar.gz. The first start unpacks it into ``${XDG_CACHE_HOME:-~/.cache}/edgespec/binary/<id>``
(``EDGESPEC_UNPACK_DIR`` overrides), later starts exec it from there (the launcher costs a ``test -x``).
It needs only ``sh``, ``tail``, ``tar`` and ``gzip``, which every Linux has.

    python scripts/build_binary.py [--out dist] [--allow-non-portable]
    python scripts/build_binary.py --cuda [--out dist] [--allow-non-portable]

``--cuda`` writes ``dist/edgespec-cuda`` from an environment whose llama-cpp-python is a CUDA build
(``python scripts/install_llama.py`` on a machine with an NVIDIA GPU). The CUDA libraries that build
links (``libcudart``, ``libcublas``: hundreds of MB) are not frozen in: the machine it runs on needs the
NVIDIA driver and the CUDA runtime of the same major version, from the system or the ``nvidia-*`` pip
wheels. At start the binary names a missing one, or a driver older than the runtime, in one line with
what to install, instead of a loader error or a silent fall back to the CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYINSTALLER = "pyinstaller==6.22.3"
BEYOND_AVX2 = ("AVX512", "AVX_VNNI", "AMX")  # compiled-in features an AVX2-only CPU lacks
# Installed in a dev environment but never used by the app: keep them out of the binary.
# Not part of the app: tools and tests, and the training stack (`edgespec train` needs the `train`
# extra and says so; CI installs it next to the app, where PyInstaller would otherwise bundle GBs of it).
EXCLUDED = (
    "matplotlib", "PIL", "pytest", "_pytest", "torch", "gguf", "tkinter", "IPython", "pandas",
    "transformers", "peft", "accelerate", "safetensors", "sympy", "networkx", "tokenizers",
)
ENTRY = "import sys\nfrom edgespec.cli import main\nsys.exit(main())\n"
# The CUDA binary's entry: each CUDA library the build links is looked up before anything loads it, in
# the loader's order (LD_LIBRARY_PATH, the build's own runpath: a toolkit from PyPI, the system's); then
# the driver's CUDA version must reach the runtime's major version (cudaDriverGetVersion: 12040 is 12.4).
CUDA_ENTRY = """import ctypes, os, sys
def found(name):
    for folder in (*filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":")), *{runpath!r}, ""):
        try:
            return ctypes.CDLL(os.path.join(folder, name))
        except OSError:
            pass
def stop(problem):
    sys.exit(f"edgespec-cuda: {{problem}}. Without an NVIDIA GPU use the CPU binary.")
libs = {{}}
for name, fix in {needs!r}:
    libs[name] = found(name) or stop(f"{{name}} is missing: {{fix}}")
for name, lib in libs.items():
    if name.startswith("libcudart"):
        driver, runtime = ctypes.c_int(), ctypes.c_int()
        lib.cudaDriverGetVersion(ctypes.byref(driver)), lib.cudaRuntimeGetVersion(ctypes.byref(runtime))
        if driver.value == 0:
            stop("no NVIDIA driver answers (cudaDriverGetVersion: 0): install the NVIDIA driver")
        if driver.value // 1000 < runtime.value // 1000:
            runs = f"{{driver.value // 1000}}.{{driver.value % 1000 // 10}}"
            stop(f"the NVIDIA driver runs CUDA {{runs}} at most, this binary needs CUDA "
                 f"{{runtime.value // 1000}}: update the driver {driver_hint}")
from edgespec.cli import main
sys.exit(main())
"""
DRIVER = "libcuda.so.1"  # the NVIDIA driver's library: never frozen in, always needed


def llama_lib_dir() -> Path:
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


def cuda_needs(readelf_dynamic: str) -> tuple[list[str], list[str]]:
    """The CUDA libraries (``libcu*``) a library links, the driver's first, and the folders of its runpath
    (``$ORIGIN`` aside), from ``readelf -d``'s NEEDED and RUNPATH (or RPATH) lines."""
    names = re.findall(r"\(NEEDED\)\s+Shared library: \[(libcu[^\]]+)\]", readelf_dynamic)
    paths = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", readelf_dynamic)
    folders = [f for p in paths for f in p.split(":") if f and "$ORIGIN" not in f]
    return [DRIVER, *sorted(set(names) - {DRIVER})], folders


def how_to_get(name: str) -> str:
    """What to install for one CUDA library: the driver, or the runtime of the build's major version."""
    if name == DRIVER:
        return "install the NVIDIA driver (nvidia-smi must list the GPU)"
    major = name.rsplit(".so.", 1)[-1].split(".")[0]
    wheel = "nvidia-cublas" if name.startswith("libcublas") else "nvidia-cuda-runtime"
    if major.isdigit() and int(major) < 13:  # CUDA 12's wheels are suffixed and laid out per package
        folder = "cublas" if "cublas" in wheel else "cuda_runtime"
        wheel, lib = f"{wheel}-cu{major}", f"nvidia/{folder}/lib"
    else:
        lib = f"nvidia/cu{major}/lib"
    return (f"install the CUDA {major} runtime (the CUDA toolkit {major}.x, or `pip install {wheel}` and "
            f"add its site-packages/{lib} to LD_LIBRARY_PATH)")


def cuda_libs(lib_dir: Path) -> tuple[list[str], list[str]]:
    """The CUDA libraries the CUDA build in ``lib_dir`` needs at run time and the folders its runpath
    names (``cuda_needs``); ValueError when it is no CUDA build."""
    cuda = sorted(lib_dir.glob("libggml-cuda.so*"))
    if not cuda:
        raise ValueError(
            "this environment's llama-cpp-python has no CUDA backend: run `python scripts/install_llama.py` "
            "on a machine with an NVIDIA GPU first (it builds with CUDA there)"
        )
    readelf = subprocess.run(["readelf", "-d", str(cuda[0])], capture_output=True, text=True, check=True)
    return cuda_needs(readelf.stdout)


DRIVER_FOR = {12: "525", 13: "580"}  # the oldest Linux driver of each CUDA major version


def cuda_entry(needs: list[str], runpath: list[str]) -> str:
    runtime = next((name for name in needs if name.startswith("libcudart")), "")
    major = int(runtime.rsplit(".so.", 1)[-1].split(".")[0] or 0) if runtime else 0
    hint = f"({DRIVER_FOR[major]} or newer)" if major in DRIVER_FOR else "(see nvidia-smi's CUDA Version)"
    needs_fixes = [(name, how_to_get(name)) for name in needs]
    return CUDA_ENTRY.format(needs=needs_fixes, runpath=tuple(runpath), driver_hint=hint)


def drop_cuda_runtime(app_dir: Path, needs: list[str]) -> list[str]:
    """Remove the CUDA libraries PyInstaller froze in (found beside the build): the system's are used."""
    dropped = [f for f in app_dir.rglob("libcu*.so*") if any(f.name.startswith(n) for n in needs)]
    for lib in dropped:
        lib.unlink()
    return sorted(f.name for f in dropped)


def pyinstaller_args(out: Path, work: Path, entry: Path) -> list[str]:
    libs = llama_lib_dir()
    args = [
        "--onedir", "--name", "edgespec", "--noconfirm", "--clean",
        "--distpath", str(out), "--workpath", str(work / "build"), "--specpath", str(work),
        # subcommands and TUI screens are imported by name at run time
        "--collect-submodules", "edgespec", "--collect-submodules", "tui",
        "--collect-data", "edgespec", "--collect-data", "tui", "--collect-data", "textual",
        "--collect-submodules", "textual", "--collect-submodules", "rich",
        "--collect-submodules", "huggingface_hub",
        "--copy-metadata", "llama-cpp-python", "--copy-metadata", "huggingface_hub",
        "--copy-metadata", "textual",
    ]
    for lib in sorted(libs.glob("*.so*")):  # where llama_cpp looks for them: next to its module
        args += ["--add-binary", f"{lib}{os.pathsep}llama_cpp/lib"]
    for module in EXCLUDED:
        args += ["--exclude-module", module]
    return [*args, str(entry)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="output folder (default dist/)")
    parser.add_argument("--allow-non-portable", action="store_true",
                        help="freeze a llama-cpp-python built with instruction sets beyond AVX2")
    parser.add_argument("--cuda", action="store_true",
                        help="write edgespec-cuda from this environment's CUDA build of llama-cpp-python")
    opts = parser.parse_args(argv)
    entry_text, name, needs = ENTRY, "edgespec", []
    if opts.cuda:
        try:
            needs, runpath = cuda_libs(llama_lib_dir())
            entry_text, name = cuda_entry(needs, runpath), "edgespec-cuda"
        except ValueError as err:
            print(f"build_binary.py --cuda: {err}.", file=sys.stderr)
            return 2

    from edgespec.engine import compiled_features

    extra = sorted(f for f in compiled_features() if f.startswith(BEYOND_AVX2))
    if extra and not opts.allow_non_portable:
        # the CUDA build has this CPU's instruction sets (install_llama.py has no portable CUDA build)
        fix = "pass --allow-non-portable for CPUs like this one" if opts.cuda else (
            "Run `python scripts/install_llama.py --portable` first, or pass --allow-non-portable")
        print(f"this environment's llama-cpp-python uses {', '.join(extra)}: the binary would not run on "
              f"every AVX2 CPU. {fix}.", file=sys.stderr)
        return 2
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", PYINSTALLER], check=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edgespec-build-") as tmp:
        work = Path(tmp)
        entry = work / "edgespec_main.py"
        entry.write_text(entry_text)
        subprocess.run([sys.executable, "-m", "PyInstaller", "--log-level", "WARN",
                        *pyinstaller_args(work / "dist", work, entry)], check=True)
        if opts.cuda:
            dropped = drop_cuda_runtime(work / "dist" / "edgespec", needs)
            print(f"left out, the machine's own are used: {', '.join(dropped) or 'nothing'}")
        binary = self_extracting(work / "dist" / "edgespec", opts.out / name)
    size = binary.stat().st_size / 2**20
    print(f"built {binary} ({size:.0f} MiB) in {time.monotonic() - started:.0f} s")
    return 0


LAUNCHER = """#!/bin/sh
# edgespec, one file: this launcher, then the frozen app folder as a tar.gz (scripts/build_binary.py).
# The first start unpacks it once; later starts run the unpacked copy directly.
set -e
root="${{EDGESPEC_UNPACK_DIR:-${{XDG_CACHE_HOME:-$HOME/.cache}}/edgespec/binary}}"
dir="$root/{build_id}"
if [ ! -x "$dir/edgespec/edgespec" ]; then
    mkdir -p "$root"
    tmp=$(mktemp -d "$root/.unpack.XXXXXX")
    tail -c +{offset:010d} "$0" | tar -xzf - -C "$tmp"
    [ -d "$dir" ] || mv "$tmp" "$dir"
    rm -rf "$tmp"
fi
exec "$dir/edgespec/edgespec" "$@"
"""


def self_extracting(app_dir: Path, out: Path) -> Path:
    """One executable file: the launcher with the payload's byte offset and id, then the payload."""
    data = subprocess.run(["tar", "-czf", "-", "-C", str(app_dir.parent), app_dir.name], check=True,
                          stdout=subprocess.PIPE).stdout
    build_id = hashlib.sha256(data).hexdigest()[:16]  # a new build never reuses an old unpacked copy
    header = LAUNCHER.format(build_id=build_id, offset=0).encode()
    header = LAUNCHER.format(build_id=build_id, offset=len(header) + 1).encode()  # same length
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    tmp.write_bytes(header + data)
    tmp.chmod(0o755)
    tmp.replace(out)
    return out


if __name__ == "__main__":
    sys.exit(main())
