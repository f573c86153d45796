"""Issue 61's Done-when, checked: `edgespec models advise`'s predictions for the bundled pair against
`edgespec bench --quick` in the same run (plain tokens/s, chain at the pair's γ, auto: within ±15 %),
and with ``--like SHAPE`` the fitted curves of an absent target against a random-weight file of its
shape measured here (c_t(1), c_t(16): within ±20 %). Run it on a quiet machine; it takes the bench's
time (about 10 minutes on 2 cores) plus, with ``--like qwen2.5-7b``, the 7B's measurement.

    python lab/scripts/advise_check.py --out /tmp/advise-check            # bench + advise
    python lab/scripts/advise_check.py --out /tmp/advise-check --like qwen2.5-coder-7b+0.5b
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

BUNDLED = "qwen2.5-coder-1.5b+0.5b"
PREDICTED, FITTED = 0.15, 0.20  # the Done-when's tolerances


def edgespec(*argv: str) -> None:
    print("$ edgespec " + " ".join(argv), file=sys.stderr)
    subprocess.run([sys.executable, "-m", "edgespec", *argv], check=True)


def advise(out: Path, threads: int, *extra: str) -> dict:
    path = out / f"advise{'-measure' if '--measure' in extra else ''}.json"
    flags = ["--threads", str(threads), *extra]
    print("$ edgespec models advise " + " ".join(flags), file=sys.stderr)
    text = subprocess.run(
        [sys.executable, "-m", "edgespec", "models", "advise", *flags, "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path.write_text(text)
    return json.loads(text)


def line(what: str, predicted: float, measured: float, tolerance: float) -> bool:
    ratio = predicted / measured
    ok = abs(ratio - 1) <= tolerance
    print(f"{what:<28} {predicted:>9.3f} {measured:>9.3f} {ratio:>7.3f}  {'ok' if ok else 'OUT'}")
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for the JSON documents")
    p.add_argument("--threads", type=int, default=0, help="threads for both (default: all cores)")
    p.add_argument("--like", help="also check the fitted curves of this absent pair against --measure")
    p.add_argument("--bench-json", type=Path, help="reuse a bench --quick document instead of running it")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # the bundled pair's curves measured afresh on this (quiet) machine, then the bench right after
    doc = advise(args.out, args.threads, "--pair", BUNDLED, "--refresh")
    bench = args.bench_json or args.out / "bench-quick.json"
    if args.bench_json is None:
        edgespec("bench", "--quick", "--threads", str(args.threads), "--json", str(bench))
    measured = json.loads(bench.read_text())
    (row,) = doc["pairs"]
    results = {r["key"]: r for r in measured["results"]}
    print(f"CPU: {doc['machine']['cpu']}, {doc['machine']['threads']} threads")
    print(f"{'':<28} {'predicted':>9} {'measured':>9} {'ratio':>7}")
    ok = line("plain tok/s", row["plain"], measured["baseline"]["tokens_per_second"], PREDICTED)
    chain = row["recommended"]  # bench --quick runs the pair's own chain under the key "chain"
    ok &= line(f"{chain} speedup", row["speedups"][chain], results["chain"]["speedup"], PREDICTED)
    ok &= line("auto speedup", row["speedups"]["auto"], results["auto"]["speedup"], PREDICTED)
    # bench's speedup is the median of per-prompt paired ratios; the formula forecasts a pooled rate
    # (all tokens ÷ all seconds): shown beside it, not a criterion
    for key, name in ((chain, "chain"), ("auto", "auto")):
        pooled = results[name]["pooled_speedup"]
        print(f"{key + ' pooled (info)':<28} {row['speedups'][key]:>9.3f} {pooled:>9.3f}", end="")
        print(f" {row['speedups'][key] / pooled:>7.3f}")
    if args.like:
        (fitted,) = advise(args.out, args.threads, "--pair", args.like)["pairs"]
        measured_ms = measure_shape(args.like, args.threads)
        (args.out / "like-measured.json").write_text(json.dumps(measured_ms))
        print(f"{args.like}: fitted ({fitted['curves']}) vs a random-weight file measured here, ms")
        for key in ("t1", "t16"):
            ok &= line(f"c_{key[0]}({key[1:]})", fitted["costs_ms"][key], measured_ms[key], FITTED)
    return 0 if ok else 1


def measure_shape(pair_name: str, threads: int, repeats: int = 5) -> dict[str, float]:
    """c_t(1) and c_t(16) of ``pair_name``'s target shape as a random-weight file, in ms: the two sizes
    the check needs (advise's ``--measure`` takes every quick size, about an hour for a 7B on 2 cores),
    measured as ``costs.measure`` does (each size-16 sample right after a size-1 sample)."""
    from edgespec.engine import EngineSettings
    from edgespec.models.pairs import open_pair
    from edgespec.models.registry import load_registry
    from edgespec.profile.costs import measure
    from edgespec.profile.like import like_pair

    shape = load_registry().pair(pair_name).target.name
    settings = EngineSettings(threads=threads, target_gpu_layers=0, draft_gpu_layers=0)
    with like_pair(shape, settings) as run, open_pair(run.resolved, settings) as pair:
        profile = measure(pair, sizes=(1, 16), catchup_sizes=(1,), repeats=repeats)
    return {"t1": profile.target[1] * 1e3, "t16": profile.target[16] * 1e3}


if __name__ == "__main__":
    sys.exit(main())
