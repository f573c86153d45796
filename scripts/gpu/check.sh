#!/usr/bin/env bash
# The prepared GPU device check: one `run` call of at most 8 minutes on a borrowed GPU machine, nothing
# built there. Each stage is one scripts/gpu/check.py process under its own time limit and writes
# $OUT/<stage>/result.json and summary.md as it ends (what a timeout leaves still comes back).
#
#   scripts/gpu/check.sh [STAGE...]     default: sanity lossless auto sampling curves binary
#   DRY=1 scripts/gpu/check.sh          the same stages on the CPU with tiny models (the test suite)
#   LAYERS=1 TOKENIZER=QWEN.gguf scripts/gpu/check.sh   the GPU run's shapes cut to 1 layer, on any machine
#
# On the GPU machine the libraries come cross-built (scripts/gpu/build.sh --cross) in
# gpu-carry/kit.tar.xz, unpacked here into gpu-kit/ when gpu-kit/lib is missing. The random GGUFs of
# the big targets are written in the background from the start (`gen`) while the first stages run.
# A sanity stage that finds no CUDA device stops the run (exit 3). Exit 1 when any stage failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/edgespec-check}
WORK=${WORK:-/tmp/edgespec-check-work}
DRY=${DRY:-}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
# edgespec from this tree (installed or not), check.py's kit.py and randomgguf.py
export PYTHONPATH=$PWD:$PWD/scripts/gpu:$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}
STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(sanity lossless auto sampling curves binary)
ARGS=(--work "$WORK" --tokenizer-from "${TOKENIZER:-gpu-kit/qwen2.5-tokenizer.gguf}" ${LAYERS:+--layers "$LAYERS"})
if [ -n "$DRY" ]; then
  ARGS+=(--dry --threads "${THREADS:-1}")
  BINARY=${BINARY-$PY -m edgespec}
  limit() { echo 300; }
else
  if [ ! -e gpu-kit/lib ] && [ -e gpu-carry/kit.tar.xz ]; then
    mkdir -p gpu-kit && tar xJf gpu-carry/kit.tar.xz -C gpu-kit
  fi
  export LLAMA_CPP_LIB_PATH=${LLAMA_CPP_LIB_PATH:-$PWD/gpu-kit/lib}
  export PYTHONPATH=$PYTHONPATH:$PWD/gpu-kit/py:$PWD/gpu-kit/site
  # cuBLAS and the CUDA runtime from the machine's own CUDA (the toolkit or PyTorch's wheels)
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $($PY -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    for lib in "$d" "$d/nvidia/cu13/lib" "$d/nvidia/cublas/lib" "$d/nvidia/cuda_runtime/lib"; do
      if [ -e "$lib/libcublas.so.13" ] || [ -e "$lib/libcudart.so.13" ]; then
        LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-}
      fi
    done
  done
  export LD_LIBRARY_PATH=$LLAMA_CPP_LIB_PATH:${LD_LIBRARY_PATH:-}
  # a cross-built libggml-cuda links a stub libcuda (no symbols, so not kept as NEEDED): load the driver
  command -v nvidia-smi >/dev/null && export LD_PRELOAD=libcuda.so.1
  BINARY=${BINARY-}
  [ -z "$BINARY" ] && [ -x dist/edgespec-cuda ] && BINARY=$PWD/dist/edgespec-cuda
  # seconds per stage: 470 in all, under the 8 minutes a device call is planned for (sanity writes the
  # 0.5B and 1.5B GGUFs; curves keeps partial.json after each target and offload)
  limit() { case $1 in sanity) echo 90 ;; lossless) echo 120 ;; auto|sampling) echo 45 ;;
            curves) echo 140 ;; binary) echo 30 ;; *) echo 60 ;; esac; }
  setsid $PY scripts/gpu/check.py gen "${ARGS[@]}" --out "$WORK/gen" >"$WORK/gen.log" 2>&1 </dev/null &
  echo $! >"$WORK/gen.pid"
fi

failed=0
for stage in "${STAGES[@]}"; do
  echo "== $stage $(date +%T)"
  timeout "$(limit "$stage")" $PY scripts/gpu/check.py "$stage" "${ARGS[@]}" --out "$OUT/$stage" \
    --binary "${BINARY:-}" >"$OUT/$stage.log" 2>&1
  rc=$?
  if [ ! -e "$OUT/$stage/result.json" ]; then  # killed by its limit, or crashed before writing
    mkdir -p "$OUT/$stage"
    echo "{\"ok\": false, \"error\": \"exit $rc (124: over its $(limit "$stage")-second limit)\"}" \
      >"$OUT/$stage/result.json"
    echo "# $stage: FAILED (exit $rc)" >"$OUT/$stage/summary.md"
  fi
  cat "$OUT/$stage/summary.md" | head -n 12
  [ $rc -eq 0 ] || failed=1
  if [ "$stage" = sanity ] && [ $rc -ne 0 ]; then
    echo "no CUDA device or no working library: the other stages would measure nothing; stop"
    exit 3
  fi
done
[ -e "$WORK/gen.pid" ] && rm -f "$WORK/gen.pid"
exit $failed
