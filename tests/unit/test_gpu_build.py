"""scripts/gpu/build.sh's argument handling and the cross-build it would run (``--cross --dry-run``):
the hour-long build itself is not run here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/gpu/build.sh", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)  # fmt: skip


def test_cross_dry_run_prints_the_toolkit_install_the_cmake_command_and_the_carry():
    done = build("--cross", "--dry-run", "-DGGML_CUDA_FA_ALL_QUANTS=ON", TOOLKIT="/t", CUDA_ARCH="")
    assert done.returncode == 0, done.stderr
    pip, cmake, make, carry = done.stdout.splitlines()
    assert "--target /t " in pip and "nvidia-cuda-nvcc==13.0.*" in pip and "nvidia-cublas" in pip
    flags = cmake.split()
    assert "-DGGML_CUDA=ON" in flags and "-DCMAKE_CUDA_ARCHITECTURES=90-real" in flags  # H100/H200
    assert "-DCMAKE_CUDA_COMPILER=/t/nvidia/cu13/bin/nvcc" in flags
    assert "-DCUDAToolkit_ROOT=/t/nvidia/cu13" in flags
    # portable CPU flags: the later -D wins in CMake, so the cross-build's NATIVE=OFF comes after the default
    assert flags.index("-DGGML_NATIVE=OFF") > flags.index("-DGGML_NATIVE=ON") and "-DGGML_AVX2=ON" in flags
    assert flags[-1] == "-DGGML_CUDA_FA_ALL_QUANTS=ON"  # the caller's arguments last
    assert make.startswith("cmake --build gpu-kit/build --target llama")
    assert carry.startswith("tar cJf gpu-carry/kit.tar.xz -C gpu-kit lib py site")


def test_another_cuda_version_and_architecture():
    done = build("--cross", "--dry-run", TOOLKIT="/t", CUDA_VERSION="13.2", CUDA_ARCH="120-real")
    pip, cmake = done.stdout.splitlines()[:2]
    assert "nvidia-cuda-nvcc==13.2.*" in pip and "nvidia-cuda-runtime==13.2.*" in pip
    assert "-DCMAKE_CUDA_ARCHITECTURES=120-real" in cmake.split()


def test_bad_arguments_say_what_to_use():
    unknown = build("--crosss")
    assert unknown.returncode == 2 and "unknown argument --crosss" in unknown.stderr
    alone = build("--dry-run")
    assert alone.returncode == 2 and "--dry-run goes with --cross" in alone.stderr
