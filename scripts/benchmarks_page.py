"""Regenerate docs/benchmarks.md from the kept bench runs listed in docs/bench/page.toml.

    python scripts/benchmarks_page.py            # write docs/benchmarks.md
    python scripts/benchmarks_page.py --check    # exit 1 if the committed page differs from the runs

To add a run: `edgespec bench ... --json docs/bench/NAME.json`, add a [[run]] for it to the list, run this.
The logic is edgespec/measure/page.py; tests/test_benchmarks_page.py checks the page against the runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgespec.measure.page import load_list, render

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "docs" / "bench" / "page.toml"
PAGE = ROOT / "docs" / "benchmarks.md"
COMMAND = "python scripts/benchmarks_page.py"


def build() -> str:
    return render(load_list(LIST), ROOT, COMMAND)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with the committed page instead of writing")
    args = p.parse_args(argv)
    text = build()
    if args.check:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
