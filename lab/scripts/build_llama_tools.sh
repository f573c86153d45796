#!/usr/bin/env bash
# Build llama.cpp's own tools (llama-server, llama-speculative-simple, llama-bench, ggml-rpc-server) from the
# llama.cpp vendored in the pinned llama-cpp-python sdist, with the same ggml CPU options as
# `scripts/install_llama.py --portable` (AVX2, never AMX) and GGML_RPC=ON, for side-by-side figures.
# Usage: lab/scripts/build_llama_tools.sh OUTDIR   (tools land in OUTDIR/build/bin)
set -euo pipefail
out=${1:?usage: build_llama_tools.sh OUTDIR}
here=$(cd "$(dirname "$0")/../.." && pwd)
version=$(python -c "import sys; sys.path.insert(0, '$here/scripts'); from llama_build.wheel import LLAMA_CPP_PYTHON as v; print(v)")
flags=$(python -c "import sys; sys.path.insert(0, '$here/scripts'); import install_llama as i; print(' '.join(i.cmake_args(None)))")
mkdir -p "$out" && cd "$out"
[ -d "llama_cpp_python-$version" ] || { pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d . && tar xzf "llama_cpp_python-$version.tar.gz"; }
src="llama_cpp_python-$version/vendor/llama.cpp"
cmake -S "$src" -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF $flags
cmake --build build -j "$(nproc)" --target llama-server llama-speculative-simple llama-bench ggml-rpc-server
ls -l build/bin
