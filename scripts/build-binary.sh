#!/usr/bin/env bash
# Build dist/edgespec (one executable) from the current Python environment; see build_binary.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python scripts/build_binary.py "$@"
