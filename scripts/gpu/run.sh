#!/usr/bin/env bash
# On the GPU machine, after build.sh: make the random GGUFs and record the curves, plain tokens/s and
# the Python overhead per step; predicted speedups use the real pair's acceptance from ACCEPTANCE (a
# `bench --json` document). Output: docs/gpu-<NAME>.json and docs/gpu-<NAME>.md.
#
#   scripts/gpu/run.sh NAME [extra measure.py options, e.g. --targets qwen2.5-7b --repeats 2]
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=${1:?a name for the output, e.g. h100}
shift
export LLAMA_CPP_LIB_PATH=$PWD/gpu-kit/lib
export PYTHONPATH=$PWD:$PWD/gpu-kit/py:$PWD/gpu-kit/site
ACCEPTANCE=${ACCEPTANCE:-docs/bench/epyc-trees-all.json}
EXTRA=()
[ -f "$ACCEPTANCE" ] && EXTRA=(--acceptance "$ACCEPTANCE")
${PYTHON:-python} scripts/gpu/measure.py --tokenizer-from gpu-kit/qwen2.5-tokenizer.gguf \
  --work "${WORK:-/tmp/edgespec-gpu-work}" --out "docs/gpu-$NAME.json" "${EXTRA[@]}" "$@"
