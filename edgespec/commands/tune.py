"""`edgespec tune` (not yet available)."""

from __future__ import annotations

import sys


def register(sub) -> None:
    p = sub.add_parser("tune", help="tune (not yet available)")
    p.set_defaults(run=run)


def run(args) -> int:
    print("edgespec tune: not yet available", file=sys.stderr)
    return 2
