#!/usr/bin/env bash
# Run `edgespec chat` under tmux, type a prompt, and print the pane with its ANSI colours twice:
# while the answer streams (tokens coloured by provenance) and once it has finished (Markdown, with
# the answer's stats line), both with the live status bar (tok/s, MAL, acceptance, context).
#
#   scripts/tmux_chat_check.sh ["PROMPT"]
#
# Environment: CHAT_ARGS (extra `edgespec chat` arguments, default "--max-tokens 160"),
# LOAD_TIMEOUT / ANSWER_TIMEOUT (seconds, default 300 / 300), STREAM_WAIT (seconds of streaming after
# the first step before the first capture, default 3), COLS / ROWS (pane size, default 140 x 45).
# The chat history goes to a throw-away data dir whose models/ links to the real one, so the check
# neither touches your conversations nor assembles the models again.
set -euo pipefail

PROMPT=${1:-"Write a Python function that checks whether a string is a palindrome."}
CHAT_ARGS=${CHAT_ARGS:-"--max-tokens 160"}
LOAD_TIMEOUT=${LOAD_TIMEOUT:-300}
ANSWER_TIMEOUT=${ANSWER_TIMEOUT:-300}
STREAM_WAIT=${STREAM_WAIT:-3}
COLS=${COLS:-140}
ROWS=${ROWS:-45}

if ! command -v tmux >/dev/null 2>&1; then
    echo "tmux_chat_check: tmux is not installed (e.g. apt-get install tmux); nothing checked." >&2
    exit 2
fi
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
if command -v edgespec >/dev/null 2>&1; then EDGESPEC=$(command -v edgespec); else EDGESPEC="$PYTHON -m edgespec"; fi

REAL_HOME=$("$PYTHON" -c "from edgespec.models.paths import home_dir; print(home_dir())")
CHECK_HOME=$(mktemp -d -t edgespec-chat-check.XXXXXX)
mkdir -p "$REAL_HOME/models"
ln -s "$REAL_HOME/models" "$CHECK_HOME/models"
SESSION="edgespec-chat-check-$$"

cleanup() {
    tmux kill-session -t "$SESSION" 2>/dev/null || true
    rm -rf "$CHECK_HOME"
}
trap cleanup EXIT

pane() { tmux capture-pane -t "$SESSION" -p "$@"; }

# wait_for TEXT TIMEOUT: poll the (uncoloured) pane until it shows TEXT
wait_for() {
    local text=$1 deadline=$((SECONDS + $2))
    until pane | grep -qF -- "$text"; do
        if pane | grep -qF "edgespec: error"; then
            echo "tmux_chat_check: edgespec chat exited with an error:" >&2
            pane >&2
            exit 1
        fi
        if ((SECONDS > deadline)); then
            echo "tmux_chat_check: timed out waiting for '$text'. The pane:" >&2
            pane >&2
            exit 1
        fi
        sleep 0.5
    done
}

# wait_gone TEXT TIMEOUT: poll until the pane no longer shows TEXT
wait_gone() {
    local text=$1 deadline=$((SECONDS + $2))
    while pane | grep -qF -- "$text"; do
        if ((SECONDS > deadline)); then
            echo "tmux_chat_check: timed out waiting for '$text' to go. The pane:" >&2
            pane >&2
            exit 1
        fi
        sleep 0.5
    done
}

tmux new-session -d -s "$SESSION" -x "$COLS" -y "$ROWS" \
    "env EDGESPEC_HOME='$CHECK_HOME' COLORTERM=truecolor $EDGESPEC chat $CHAT_ARGS; sleep 600"

wait_for " ready │" "$LOAD_TIMEOUT"
tmux send-keys -t "$SESSION" -l "$PROMPT"
tmux send-keys -t "$SESSION" Enter
wait_for " generating │" 30
wait_gone "MAL 0.00 │" "$ANSWER_TIMEOUT" # the first step has arrived (prefill done)
sleep "$STREAM_WAIT"
STREAMING=$(pane -e)
wait_for " ready │" "$ANSWER_TIMEOUT"
sleep 0.5
FINISHED=$(pane -e)

echo "=== while streaming (${STREAM_WAIT}s after the first step) ==="
printf '%s\n' "$STREAMING"
echo "=== finished ==="
printf '%s\n' "$FINISHED"

tmux send-keys -t "$SESSION" C-q

status=0
if ! printf '%s' "$STREAMING" | grep -q $'\e\\[38;2;'; then
    echo "tmux_chat_check: FAIL: no ANSI colours in the streaming capture" >&2
    status=1
fi
for text in "tok/s" "MAL" "acc" "ctx"; do
    if ! printf '%s' "$FINISHED" | grep -qF "$text"; then
        echo "tmux_chat_check: FAIL: the status bar lacks '$text'" >&2
        status=1
    fi
done
if [ "$status" -eq 0 ]; then echo "tmux_chat_check: OK (streamed with colours; status bar shows tok/s, MAL, acceptance, context)"; fi
exit "$status"
