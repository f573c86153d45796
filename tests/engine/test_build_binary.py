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
    return subprocess.run([sys.executable, "-c", entry, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip


def test_a_missing_cuda_library_is_named_in_one_line_with_what_to_install():
    done = run_entry(B.cuda_entry(["libcudart.so.99"], []), "--version")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("edgespec-cuda: libcudart.so.99 is missing: install the CUDA 99 runtime")


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to make a stand-in library")
def test_a_library_in_the_builds_runpath_is_found_and_the_app_starts(tmp_path):
    fake = tmp_path / "libcudart.so.99"  # an empty stand-in, found only through the recorded runpath
    subprocess.run(["cc", "-shared", "-x", "c", "-", "-o", str(fake)], input="", text=True, check=True)
    done = run_entry(B.cuda_entry(["libcudart.so.99"], [str(tmp_path)]), "--help")
    assert done.returncode == 0, done.stderr
    assert "generate" in done.stdout


def test_cuda_refuses_a_cpu_build_of_llama_cpp_python(tmp_path, monkeypatch, capsys):
    (tmp_path / "libggml-cpu.so").touch()
    monkeypatch.setattr(B, "llama_lib_dir", lambda: tmp_path)
    assert B.main(["--cuda", "--out", str(tmp_path / "dist")]) == 2
    err = capsys.readouterr().err
    assert "no CUDA backend" in err and "scripts/install_llama.py" in err
    assert not (tmp_path / "dist").exists()
