#!/usr/bin/env bash
# Build llama.cpp's shared libraries with CUDA from gpu-kit/llama.cpp (scripts/gpu/pack.sh) into
# gpu-kit/lib (what LLAMA_CPP_LIB_PATH points the llama_cpp bindings at). Incremental: a second call
# reuses gpu-kit/build. The kit runs edgespec (pure Python) from this source tree, not installed.
#
#   scripts/gpu/build.sh [CMAKE_ARG...]          on the GPU machine (its nvcc); CUDA=OFF: CPU libraries
#   scripts/gpu/build.sh --cross [CMAKE_ARG...]  here, without a GPU: the carry for check.sh
#   scripts/gpu/build.sh --cross --dry-run       print what --cross would run; run nothing
#
# --cross (about an hour of both cores: start it early, in the background, on a quiet machine): installs
# the CUDA toolkit wheels of CUDA_VERSION (default 13.0: the GPU machine's driver must run CUDA 13) into
# TOOLKIT (default ~/.cache/edgespec/cuda-cross/CUDA_VERSION) once, completes it as an installed toolkit
# (llama_build/cuda.py complete_toolkit: lib64, targets/, unversioned links) with an empty stub libcuda.so
# (soname libcuda.so.1; check.sh preloads the driver's), builds for CUDA_ARCH (default 90-real: H100,
# H200) with portable CPU flags, and packs gpu-carry/kit.tar.xz (≤ 60 MiB), which check.sh unpacks.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=gpu-kit
PY=${PYTHON:-python3}
CROSS= DRY=
while [ $# -gt 0 ]; do
  case $1 in
    --cross) CROSS=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -D*) break ;;
    *) echo "build.sh: unknown argument $1 (use --cross, --dry-run, then -DNAME=VALUE CMake arguments)" >&2
       exit 2 ;;
  esac
done
[ -z "$DRY" ] || [ -n "$CROSS" ] || { echo "build.sh: --dry-run goes with --cross" >&2; exit 2; }
CUDA=${CUDA:-ON}
EXTRA=()
if [ -n "$CROSS" ]; then
  CUDA_VERSION=${CUDA_VERSION:-13.0}
  MAJOR=${CUDA_VERSION%%.*}
  TOOLKIT=${TOOLKIT:-${XDG_CACHE_HOME:-$HOME/.cache}/edgespec/cuda-cross/$CUDA_VERSION}
  ROOT=$TOOLKIT/nvidia/cu$MAJOR
  ARCH=${CUDA_ARCH:-90-real}
  WHEELS=("nvidia-cuda-nvcc==$CUDA_VERSION.*" "nvidia-cuda-runtime==$CUDA_VERSION.*" nvidia-cublas
          nvidia-cuda-cccl nvidia-nvvm nvidia-cuda-crt)
  EXTRA=(-DCMAKE_CUDA_COMPILER="$ROOT/bin/nvcc" -DCUDAToolkit_ROOT="$ROOT" -DGGML_NATIVE=OFF
         -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
else
  ARCH=${CUDA_ARCH:-native}  # e.g. 90 for H100/H200
fi
CMAKE=(cmake -S "$KIT/llama.cpp" -B "$KIT/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
  -DGGML_CUDA="$CUDA" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGGML_NATIVE=ON -DGGML_CUDA_NCCL=OFF
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "${EXTRA[@]}" "$@")
CARRY=(tar cJf gpu-carry/kit.tar.xz -C "$KIT" lib py site qwen2.5-tokenizer.gguf)

if [ -n "$DRY" ]; then
  echo "$PY -m pip install -q --target $TOOLKIT ${WHEELS[*]}"
  echo "${CMAKE[*]}"
  echo "cmake --build $KIT/build --target llama -j $(nproc)"
  echo "${CARRY[*]}"
  exit 0
fi
if [ -n "$CROSS" ]; then
  [ -d "$KIT/llama.cpp" ] || { echo "build.sh: no $KIT/llama.cpp: run scripts/gpu/pack.sh first" >&2; exit 1; }
  if [ ! -e "$TOOLKIT/READY" ]; then
    rm -rf "$TOOLKIT"
    $PY -m pip install -q --target "$TOOLKIT" "${WHEELS[@]}"
    PYTHONPATH=scripts $PY -c "import sys; from pathlib import Path; from llama_build.cuda import complete_toolkit
complete_toolkit(Path(sys.argv[1]), 'x86_64', None)" "$ROOT"
    mkdir -p "$ROOT/lib/stubs"  # the link step wants a libcuda; the GPU machine's driver provides the real one
    echo "" | cc -shared -x c - -Wl,-soname,libcuda.so.1 -o "$ROOT/lib/stubs/libcuda.so"
    "$ROOT/bin/nvcc" --version >"$TOOLKIT/READY"
  fi
fi
"${CMAKE[@]}" >&2
cmake --build "$KIT/build" --target llama -j "$(nproc)" >&2
mkdir -p "$KIT/lib"
find "$KIT/build" \( -name 'libllama.so*' -o -name 'libggml*.so*' \) -exec cp -P {} "$KIT/lib/" \;
ls "$KIT/lib"
if [ -n "$CROSS" ]; then
  mkdir -p gpu-carry
  "${CARRY[@]}"
  SIZE=$(du -m gpu-carry/kit.tar.xz | cut -f1)
  echo "gpu-carry/kit.tar.xz: $SIZE MiB (limit 60)"
  [ "$SIZE" -le 60 ] || { echo "build.sh: the carry is over 60 MiB" >&2; exit 1; }
fi
