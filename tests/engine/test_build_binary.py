"""scripts/build_binary.py --cuda without CUDA: which libraries the binary needs (readelf's NEEDED and
RUNPATH), its start-up check naming a missing one in one line, and the refusal of a CPU build. The
frozen binaries themselves: tests/real/test_binary.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.scripts import load

B = load("build_binary")
ROOT = Path(__file__).resolve().parents[2]
READELF = """
Dynamic section at offset 0x2d1e000 contains 33 entries:
  Tag        Type                         Name/Value
 0x0000000000000001 (NEEDED)             Shared library: [libggml-base.so.0]
 0x0000000000000001 (NEEDED)             Shared library: [libcudart.so.13]
 0x0000000000000001 (NEEDED)             Shared library: [libcublas.so.13]
 0x0000000000000001 (NEEDED)             Shared library: [libcublasLt.so.13]
 0x0000000000000001 (NEEDED)             Shared library: [libstdc++.so.6]
 0x000000000000001d (RUNPATH)            Library runpath: [$ORIGIN:/cache/cuda/13.0/nvidia/cu13/lib]
"""


def test_the_cuda_libraries_and_runpath_come_from_readelf():
    needs, runpath = B.cuda_needs(READELF)
    assert needs == ["libcuda.so.1", "libcublas.so.13", "libcublasLt.so.13", "libcudart.so.13"]
    assert runpath == ["/cache/cuda/13.0/nvidia/cu13/lib"]
    assert "NVIDIA driver" in B.how_to_get("libcuda.so.1")
    assert "pip install nvidia-cuda-runtime` and add its site-packages/nvidia/cu13/lib" in B.how_to_get(
        "libcudart.so.13")  # fmt: skip
    assert "nvidia-cublas-cu12" in B.how_to_get("libcublas.so.12")  # CUDA 12's wheels: per package


def run_entry(entry: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LD_LIBRARY_PATH": ""}  # the runpath, then the system's
    return subprocess.run([sys.executable, "-c", entry, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env)  # fmt: skip


def test_a_missing_cuda_library_is_named_in_one_line_with_what_to_install():
    done = run_entry(B.cuda_entry(["libcudart.so.99"], []), "--version")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("edgespec-cuda: libcudart.so.99 is missing: install the CUDA 99 runtime")


def fake_cudart(folder: Path, driver: int, runtime: int) -> None:
    """A stand-in libcudart.so.13 reporting these CUDA versions (12040: 12.4), found by the runpath
    before any the system has."""
    source = (f"int cudaDriverGetVersion(int *v) {{ *v = {driver}; return 0; }}\n"
              f"int cudaRuntimeGetVersion(int *v) {{ *v = {runtime}; return 0; }}\n")  # fmt: skip
    out = folder / "libcudart.so.13"
    cc = ["cc", "-shared", "-fPIC", "-x", "c", "-", "-o", str(out)]
    subprocess.run(cc, input=source, text=True, check=True)


needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for a stand-in library")


@needs_cc
def test_a_library_in_the_builds_runpath_is_found_and_the_app_starts(tmp_path):
    fake_cudart(tmp_path, driver=13010, runtime=13000)
    done = run_entry(B.cuda_entry(["libcudart.so.13"], [str(tmp_path)]), "--help")
    assert done.returncode == 0, done.stderr
    assert "generate" in done.stdout


@needs_cc
def test_a_driver_older_than_the_runtime_or_none_is_named_with_the_fix(tmp_path):
    fake_cudart(tmp_path, driver=12040, runtime=13000)
    done = run_entry(B.cuda_entry(["libcudart.so.13"], [str(tmp_path)]), "--help")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert "the NVIDIA driver runs CUDA 12.4 at most, this binary needs CUDA 13" in line
    assert line.endswith("update the driver (580 or newer). Without an NVIDIA GPU use the CPU binary.")
    fake_cudart(tmp_path, driver=0, runtime=13000)  # what the runtime answers where no driver is loaded
    done = run_entry(B.cuda_entry(["libcudart.so.13"], [str(tmp_path)]), "--help")
    assert done.returncode == 1 and "no NVIDIA driver answers" in done.stderr


def test_cuda_refuses_a_cpu_build_of_llama_cpp_python(tmp_path, monkeypatch, capsys):
    (tmp_path / "libggml-cpu.so").touch()
    monkeypatch.setattr(B, "llama_lib_dir", lambda: tmp_path)
    assert B.main(["--cuda", "--out", str(tmp_path / "dist")]) == 2
    err = capsys.readouterr().err
    assert "no CUDA backend" in err and "scripts/install_llama.py" in err
    assert not (tmp_path / "dist").exists()
