#!/usr/bin/env bash
# Issue 41's side-by-side: edgespec serve (default strategy) vs llama-server built from the vendored
# llama.cpp (lab/scripts/build_llama_tools.sh), both on the bundled pair, measured by the same client
# (`edgespec bench --server`: a 6-turn coding conversation sent whole each turn, streamed, and a
# tool-calling exchange), one server at a time on this machine, all cores each.
#   lab/scripts/serve_vs_llama_server.sh BUILD/bin OUTDIR [MAX_TOKENS]
#   ROUNDS=3 SETS=conversation MODES="edgespec ngram-mod ngram-mod-fa-off" lab/scripts/serve_vs_llama_server.sh …
#     (the 2026-11-27 EPYC series: rounds alternate the servers, a drifting machine shifts all alike)
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
  edgespec bench --server "http://127.0.0.1:$port/v1" --sets "$sets" --max-tokens "$tokens" \
    --json "$out/$name.json" | tee "$out/$name.txt"
  kill "$pid"; wait "$pid" || true
}
sets=${SETS:-conversation,tools}
modes=${MODES:-edgespec plain draft ngram-mod ngram-mod-fa-off}
for round in $(seq "${ROUNDS:-1}"); do
  for mode in $modes; do
    name=$mode; [ "${ROUNDS:-1}" = 1 ] || name=$mode-$round
    case $mode in
      edgespec) run "$name" edgespec serve --port $port --ctx 8192 ;;
      plain) run "llama-server-$name" "$bin/llama-server" -m "$target" -c 8192 --port $port ;;
      draft) run "llama-server-$name" "$bin/llama-server" -m "$target" -md "$draft" --spec-type draft-simple \
        -c 8192 --port $port -ngl 0 -ngld 0 ;;
      ngram-mod) run "llama-server-$name" "$bin/llama-server" -m "$target" --spec-type ngram-mod -c 8192 --port $port ;;
      ngram-mod-fa-off) run "llama-server-$name" "$bin/llama-server" -m "$target" --spec-type ngram-mod -fa off \
        -c 8192 --port $port ;;
    esac
  done
done
