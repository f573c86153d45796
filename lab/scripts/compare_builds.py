#!/usr/bin/env python3
"""Plain decoding speed of several llama-cpp-python builds, measured side by side (paired rounds).

Each variant is a folder holding an installed ``llama_cpp`` (``pip install --no-deps --target DIR
WHEEL``; ``-`` is the current environment's own) plus optional extra ``generate`` flags. Every round
runs each variant once, in a rotated order, on the same prompt, so drift and neighbours' load hit
all variants alike; the report gives each variant's median tokens/s and its median per-round ratio
to the first variant.

    python scripts/compare_builds.py --rounds 8 \\
        native=/tmp/native-site explicit=- portable=/tmp/portable-site "norepack=-:--no-repack"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from statistics import median

PROMPT = "Write a Python function that parses a CSV file and returns the rows as dictionaries."


def run_once(site: str, flags: list[str], tokens: int, threads: int) -> float:
    env = dict(os.environ)
    if site != "-":
        env["PYTHONPATH"] = site + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "edgespec.cli", "generate", PROMPT, "--strategy", "none", "--json",
               "--max-tokens", str(tokens), "--threads", str(threads), *flags]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout)["stats"]["tokens_per_second"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", help="NAME=SITE[:FLAGS] (SITE '-' = this environment)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    opts = parser.parse_args(argv)
    variants = []
    for spec in opts.variants:
        name, rest = spec.split("=", 1)
        site, _, flags = rest.partition(":")
        variants.append((name, site, flags.split()))
    rates: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for r in range(opts.rounds):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for name, site, flags in order:
            rates[name].append(run_once(site, flags, opts.tokens, opts.threads))
        print(f"round {r + 1}: " + "  ".join(f"{n} {rates[n][-1]:.1f}" for n, _, _ in variants), flush=True)
    base = variants[0][0]
    print(f"\n{'variant':<12} {'median tok/s':>13} {'paired ratio to ' + base:>24}")
    for name, _, _ in variants:
        ratios = [a / b for a, b in zip(rates[name], rates[base])]
        print(f"{name:<12} {median(rates[name]):>13.2f} {median(ratios):>24.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
