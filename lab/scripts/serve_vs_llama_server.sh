#!/usr/bin/env bash
# Issue 41's side-by-side: edgespec serve (default strategy) vs llama-server built from the vendored
# llama.cpp (lab/scripts/build_llama_tools.sh), both on the bundled pair, measured by the same client
# (`edgespec bench --server`: a 6-turn coding conversation sent whole each turn, streamed, and a
# tool-calling exchange), one server at a time on this machine, all cores each.
#   lab/scripts/serve_vs_llama_server.sh BUILD/bin OUTDIR [MAX_TOKENS]
set -euo pipefail
bin=${1:?BUILD/bin}; out=${2:?OUTDIR}; tokens=${3:-384}
mkdir -p "$out"
models=$(python -c "from edgespec.models.pairs import resolve_pair as r; p=r(); print(p.target_path, p.draft_path)")
read -r target draft <<<"$models"
port=8391
run() {  # NAME COMMAND...: start a server, measure it, stop it
  local name=$1; shift
  "$@" >"$out/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 1; done
  edgespec bench --server "http://127.0.0.1:$port/v1" --sets conversation,tools --max-tokens "$tokens" \
    --json "$out/$name.json" | tee "$out/$name.txt"
  kill "$pid"; wait "$pid" || true
}
run edgespec edgespec serve --port $port --ctx 8192
run llama-server-plain "$bin/llama-server" -m "$target" -c 8192 --port $port
run llama-server-draft "$bin/llama-server" -m "$target" -md "$draft" --spec-type draft-simple -c 8192 --port $port -ngl 0 -ngld 0
run llama-server-ngram-mod "$bin/llama-server" -m "$target" --spec-type ngram-mod -c 8192 --port $port
