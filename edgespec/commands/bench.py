"""`edgespec bench` (not yet available)."""

from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser("bench", help="bench (not yet available)")
    p.set_defaults(run=run)


def run(args) -> int:
    print("edgespec bench: not yet available", file=sys.stderr)
    return 2
