#!/usr/bin/env bash
# One device call of the GPU kit with libraries built beforehand (scripts/gpu/build.sh, cross-built
# here): a sanity check, then stages, each a measure.py run written to $RES and packed into
# $OUT/gpu-results.tgz after every stage (what a timeout leaves still comes back). The random GGUFs of
# later stages are written in the background (setsid: they outlive the call while the machine is warm).
#
#   lab/scripts/gpu_session.sh STAGE...   STAGE: sanity | gen | s1 | s7 | s14 | s32
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-out}
RES=${RES:-/tmp/gpu-res}
WORK=${WORK:-/tmp/edgespec-gpu-work}
LAYERS=${LAYERS:-}  # a layer count for every model: tiny test runs off the GPU
mkdir -p "$OUT" "$RES" "$WORK"
export PYTHONUNBUFFERED=1
export LLAMA_CPP_LIB_PATH=${LLAMA_CPP_LIB_PATH:-$PWD/gpu-kit/lib}
export PYTHONPATH=$PWD:$PWD/scripts:${KIT_PY-$PWD/gpu-kit/py}:$PWD/gpu-kit/site
PY=${PYTHON:-python3}
# cuBLAS and the CUDA runtime come from the machine's own CUDA (the toolkit or PyTorch's wheels).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  $($PY -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
  for lib in "$d" "$d/nvidia/cu13/lib" "$d/nvidia/cublas/lib" "$d/nvidia/cuda_runtime/lib"; do
    [ -e "$lib/libcublas.so.13" ] || [ -e "$lib/libcudart.so.13" ] && LD_LIBRARY_PATH=$lib:${LD_LIBRARY_PATH:-}
  done
done
export LD_LIBRARY_PATH=$LLAMA_CPP_LIB_PATH:${LD_LIBRARY_PATH:-}
# A cross-built libggml-cuda links a stub libcuda (no symbols, so not kept as NEEDED): load the driver.
command -v nvidia-smi >/dev/null && export LD_PRELOAD=libcuda.so.1
TOK=gpu-kit/qwen2.5-tokenizer.gguf
LAYER_ARGS=()
[ -n "$LAYERS" ] && LAYER_ARGS=(--layers "$LAYERS")

pack() { tar czf "$OUT/gpu-results.tgz" -C "$RES" . 2>/dev/null; }

gguf() {  # gguf NAME: the random Q4_K GGUF measure.py looks for, written under a temporary name first
  local path="$WORK/$1-Q4_K${LAYERS:+-${LAYERS}l}-random.gguf"
  [ -e "$path" ] && return
  $PY scripts/randomgguf.py --like "$1" --tokenizer-from "$TOK" --type Q4_K "${LAYER_ARGS[@]}" \
    --seed 0 --out "$path.tmp" >/dev/null && mv "$path.tmp" "$path"
}

measure() {  # measure NAME TIMEOUT ARGS...: one measure.py run
  local name=$1 limit=$2; shift 2
  echo "== $name $(date +%T)"
  timeout "$limit" $PY scripts/gpu/measure.py --tokenizer-from "$TOK" --work "$WORK" --keep \
    "${LAYER_ARGS[@]}" --out "$RES/gpu-$name.json" "$@" >"$RES/$name.log" 2>&1
  echo "   rc=$? $(date +%T)"; tail -n 3 "$RES/$name.log"
  pack
}

wait_for() {  # wait_for NAME SECONDS: until the background writer has finished the GGUF
  local path="$WORK/$1-Q4_K${LAYERS:+-${LAYERS}l}-random.gguf" i
  for ((i = 0; i < $2; i++)); do [ -e "$path" ] && return 0; sleep 1; done
  echo "   $path not written in $2 s"; return 1
}

PARTIAL=(--sizes 1,2,3,4,6,8,12,16,24,32,48,64 --repeats 2 --strategies chain --budgets 4 --tokens 32)
for stage in "$@"; do
  case $stage in
    sanity)
      nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
      nproc; lscpu | grep -m1 'Model name'
      echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
      ldd "$LLAMA_CPP_LIB_PATH"/libggml-cuda.so 2>/dev/null | grep -E 'not found|cublas|cudart|libcuda'
      $PY -c "from edgespec.engine._backend import supports_gpu_offload, system_info
print('gpu offload:', supports_gpu_offload()); print(system_info())" 2>&1 | tail -n 5 | tee "$RES/sanity.txt"
      grep -q "CUDA" "$RES/sanity.txt" || [ -n "$LAYERS" ] || { echo "no CUDA backend: stop"; pack; exit 3; } ;;
    gen)  # the bigger targets in the background, one after another (the disk holds all of them)
      setsid bash -c "$(declare -f gguf); WORK=$WORK LAYERS=$LAYERS PY=$PY TOK=$TOK LAYER_ARGS=(${LAYER_ARGS[*]});
        for m in ${GEN_MODELS:-qwen2.5-7b qwen2.5-14b qwen2.5-32b}; do gguf \$m; done" >"$RES/gen.log" 2>&1 < /dev/null & ;;
    s1)
      measure 1.5b 200 --targets qwen2.5-1.5b --strategies chain,tsd,opt-tree,dyspec --budgets 4,8,16,32,64 ;;
    s7)
      wait_for qwen2.5-7b 120 && measure 7b 150 --targets qwen2.5-7b --strategies chain,opt-tree,dyspec \
        --budgets 16 ;;
    s14)
      wait_for qwen2.5-14b 150 && measure 14b 120 --targets qwen2.5-14b --strategies chain --budgets 4 \
        && measure 14b-half 170 --targets qwen2.5-14b --gpu-layers "${HALF14:-24}" "${PARTIAL[@]}" ;;
    s32)
      wait_for qwen2.5-32b 200 && measure 32b 150 --targets qwen2.5-32b --strategies chain --budgets 4,8,16 \
        && measure 32b-half 220 --targets qwen2.5-32b --gpu-layers "${HALF32:-32}" "${PARTIAL[@]}" ;;
    s32full)
      wait_for qwen2.5-32b 200 && measure 32b 150 --targets qwen2.5-32b --strategies chain,opt-tree,dyspec --budgets 16 ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
cp "$RES"/gen.log "$OUT"/ 2>/dev/null
pack
ls -la "$RES"
