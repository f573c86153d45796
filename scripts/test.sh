#!/usr/bin/env bash
# Install edgespec with its test extras and the bundled model pair into .venv, then run the tests.
#   scripts/test.sh            the full suite (real-model tests included)
#   scripts/test.sh --quick    the quick subset: no model loading, seconds
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip
# llama-cpp-python with explicit CPU flags, never -march=native nor AMX (its AMX kernels crash on
# Sapphire Rapids): built from source the first time (~9 minutes on 2 cores), cached by flags. The
# portable (AVX2) build, so that one wheel serves both the tests and the single binary built below.
# A CUDA build already installed (`python scripts/install_llama.py` on an NVIDIA machine) is kept
# instead: the tests run on it, and the CPU single binary, which needs the portable build, is not
# built (tests/real/test_binary.py skips).
CUDA_BUILD=
if python -c "import importlib.util as u, pathlib as p, sys; s = u.find_spec('llama_cpp')
sys.exit(not (s and any(p.Path(s.origin).parent.joinpath('lib').glob('libggml-cuda*'))))" 2>/dev/null; then
    CUDA_BUILD=1
    echo "llama-cpp-python is a CUDA build: kept (not replaced by the portable CPU build); no single binary"
else
    python scripts/install_llama.py --portable
fi
python -m pip install -q -e '.[test,bundled]'
if [ "${1:-}" = "--quick" ]; then
    shift
    lint-imports  # docs/architecture.md's import rules (pyproject.toml [tool.importlinter]); under a second
    mypy  # the decoder ↔ models seam, engine/ports.py (pyproject.toml [tool.mypy]); seconds
    exec python -m pytest -q -m "not model and not slow" "$@"
fi
# The training stack (torch CPU build, transformers, peft) for tests/engine/test_train_tiny.py; the quick
# subset above stays free of it.
python -m pip install -q -e '.[train]'
ruff check edgespec tui tests scripts
lint-imports  # the import rules of docs/architecture.md (pyproject.toml [tool.importlinter])
mypy  # the decoder ↔ models seam: engine/ports.py's Protocols and what implements them ([tool.mypy])
edgespec models pull qwen2.5-coder-1.5b+0.5b
# The single binary (tests/real/test_binary.py); its no-Python chroot test needs a static busybox.
if [ "$(id -u)" = 0 ] && ! command -v busybox >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq busybox-static) >/dev/null 2>&1 ||
        echo "busybox-static not installed: the chroot test will skip"
fi
if [ -z "$CUDA_BUILD" ]; then
    python scripts/build_binary.py
    export EDGESPEC_BINARY="$PWD/dist/edgespec"
fi
# The 25 slowest tests are listed at the end: what to trim when the suite nears CI's time.
if [ $# -eq 0 ]; then
    # The statistical losslessness tests (tests/engine/test_lossless.py: pure Python, one core each;
    # 21 minutes in a row on 2 cores, 12 on both at once) run first, then everything else, whose
    # models use both cores themselves. Both always run; the script fails if either did.
    lossless=0 rest=0
    python -m pytest -q -n 2 --dist worksteal tests/engine/test_lossless.py || lossless=$?
    python -m pytest -q -rs --durations=25 --ignore=tests/engine/test_lossless.py || rest=$?
    exit $((lossless ? lossless : rest))
fi
python -m pytest -q -rs --durations=25 "$@"
