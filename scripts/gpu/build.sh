#!/usr/bin/env bash
# On the GPU machine: build llama.cpp's shared libraries with CUDA from gpu-kit/llama.cpp into
# gpu-kit/lib (what LLAMA_CPP_LIB_PATH points the llama_cpp bindings at). Incremental: a second call
# reuses gpu-kit/build. CUDA=OFF builds the CPU libraries instead (to test the kit without a GPU).
# The kit runs edgespec (pure Python) from this source tree, not installed.
#
# Also builds here, without a GPU, when given a CUDA toolkit (the pip packages nvidia-cuda-nvcc,
# -runtime, -cublas, -cccl, -nvvm, -crt of the GPU machine's CUDA major version) and portable CPU
# flags; the GPU machine then only measures (its device time is short):
#   CUDA_ARCH=90-real scripts/gpu/build.sh -DCMAKE_CUDA_COMPILER=TOOLKIT/bin/nvcc \
#     -DCUDAToolkit_ROOT=TOOLKIT -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=gpu-kit
CUDA=${CUDA:-ON}
ARCH=${CUDA_ARCH:-native}  # e.g. 90 for H100/H200
cmake -S "$KIT/llama.cpp" -B "$KIT/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_CUDA="$CUDA" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGGML_NATIVE=ON -DGGML_CUDA_NCCL=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "$@" >&2
cmake --build "$KIT/build" --target llama -j "$(nproc)" >&2
mkdir -p "$KIT/lib"
find "$KIT/build" \( -name 'libllama.so*' -o -name 'libggml*.so*' \) -exec cp -P {} "$KIT/lib/" \;
ls "$KIT/lib"
