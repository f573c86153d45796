#!/usr/bin/env bash
# Build the GPU kit here (needs network once, for the sdist): a trimmed llama-cpp-python sdist, the
# pure-Python packages edgespec needs that a bare PyTorch machine may lack, and a tiny GGUF that
# carries the Qwen2.5 tokenizer (the GPU machine has no models). Everything goes to gpu-kit/
# (git-ignored), which is carried to the GPU machine with the working tree: the whole must stay
# under 64 MiB (or, cross-built, packed by scripts/gpu/build.sh --cross into gpu-carry/).
#
#   scripts/gpu/pack.sh [SDIST.tar.gz] [TOKENIZER.gguf]
#
# SDIST defaults to `pip download llama-cpp-python==<installed version> --no-binary :all:`;
# TOKENIZER to the bundled draft model in the edgespec store.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
KIT=gpu-kit
LIMIT_MIB=60  # leaves room for the working tree within the 64 MiB carry
VERSION=$($PY -c "from importlib.metadata import version; print(version('llama_cpp_python'))")
SDIST=${1:-}
TOKENIZER=${2:-$($PY -c "
from edgespec.models.store import ModelStore
s = ModelStore(); spec = s.registry.pair('qwen2.5-coder-1.5b+0.5b'); print(s.path_for(spec.draft.name))")}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [ -z "$SDIST" ]; then
  $PY -m pip download --no-deps --no-binary :all: --dest "$TMP" "llama-cpp-python==$VERSION" >&2
  SDIST=$(ls "$TMP"/llama_cpp_python-*.tar.gz)
fi
tar xzf "$SDIST" -C "$TMP"
SRC=$(ls -d "$TMP"/llama_cpp_python-*/)
rm -rf "$KIT" && mkdir -p "$KIT/py" "$KIT/site"

# llama.cpp: the library and the CPU and CUDA backends only (no models, tools, tests, docs, other
# backends: ggml_add_backend skips a disabled backend's directory).
LC="$SRC/vendor/llama.cpp"
mkdir -p "$KIT/llama.cpp/ggml/src"
cp -r "$LC"/{CMakeLists.txt,LICENSE,cmake,src,include,vendor,common} "$KIT/llama.cpp/"
cp -r "$LC"/ggml/{CMakeLists.txt,cmake,include} "$KIT/llama.cpp/ggml/"
for entry in "$LC"/ggml/src/*; do
  case "$(basename "$entry")" in
    ggml-cann|ggml-openvino|ggml-webgpu|ggml-et|ggml-metal|ggml-hexagon|ggml-sycl|ggml-vulkan|\
ggml-opencl|ggml-virtgpu|ggml-zdnn|ggml-zendnn|ggml-musa|ggml-blas|ggml-rpc) ;;
    *) cp -r "$entry" "$KIT/llama.cpp/ggml/src/" ;;
  esac
done
# The Python side: llama_cpp (ctypes bindings; loads the libraries from LLAMA_CPP_LIB_PATH) and gguf.
cp -r "$SRC/llama_cpp" "$KIT/py/" && rm -rf "$KIT/py/llama_cpp/server" "$KIT/py/llama_cpp/lib"
cp -r "$LC/gguf-py/gguf" "$KIT/site/"
SITE=$($PY -c "import jinja2, os; print(os.path.dirname(os.path.dirname(jinja2.__file__)))")
# rich, huggingface_hub (tqdm, filelock) and idna: edgespec.models.store imports them, and the profile
# code check.py and kit.py run reaches it (found by listing what `import check` loads)
for pkg in diskcache platformdirs yaml jinja2 markupsafe typing_extensions.py httpx2 httpcore2 truststore \
  rich huggingface_hub tqdm filelock idna; do
  cp -r "$SITE/$pkg" "$KIT/site/"
done
cp -r "$SITE"/{httpx2,httpcore2,truststore,huggingface_hub}-*.dist-info "$KIT/site/"  # they read their version
find "$KIT" -name '__pycache__' -prune -exec rm -rf {} +

# The tokenizer: a 1-layer, 64-wide random model of the Qwen2.5 family (also a tiny model to test with).
$PY scripts/randomgguf.py --like qwen2.5-0.5b --tokenizer-from "$TOKENIZER" --type Q8_0 \
  --layers 1 --embd 64 --ff 128 --heads 1 --kv-heads 1 --out "$KIT/qwen2.5-tokenizer.gguf" >&2

SIZE=$(du -sm "$KIT" | cut -f1)
echo "gpu-kit: ${SIZE} MiB (limit ${LIMIT_MIB} MiB), llama-cpp-python $VERSION"
[ "$SIZE" -le "$LIMIT_MIB" ] || { echo "gpu-kit is too large to carry" >&2; exit 1; }
