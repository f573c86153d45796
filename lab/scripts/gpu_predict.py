"""Predicted speedups and auto's choice on the GPU curves of ``lab/scripts/gpu_session.sh``.

    python lab/scripts/gpu_predict.py RESULTS_DIR ACCEPTANCE.json [ACCEPTANCE.json ...] > table.md

For every kit result (``gpu-*.json``: one target configuration's curves, plain tokens/s and, for the
1.5B run, the Python overhead per step of each strategy/budget), the speedup each strategy/budget of
the acceptance documents (``bench --json`` of the real pair on a CPU) would reach there — the kit's
formula (``scripts/gpu/kit.py``), with the Python overhead measured on the 1.5B run for the
strategies/budgets a target was measured without; for a chain (whose step has the same shape whatever
is accepted: γ draft passes, γ + 1 tokens verified) also from its step **as it ran** on the random
pair (``step_ms``: CUDA graphs and all) — and what ``auto``'s policy would do on that curve
for a caught-up draft: its mode and its forecast over plain decoding's measured tokens/s (auto's
default acceptance prior: before it has seen the pair's own acceptance).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "scripts" / "gpu"), str(ROOT / "scripts"), str(ROOT)]

from kit import acceptance_from_bench, predict  # noqa: E402

from edgespec.planner.auto import AutoPlanner  # noqa: E402
from edgespec.profile.costs import CostProfile  # noqa: E402


def auto_choice(costs, plain_rate: float, budget: int = 48) -> tuple[str, float]:
    """auto's mode on these curves (its default prior) for a caught-up draft, and its forecast's
    ratio to plain decoding's measured tokens/s."""
    policy = AutoPlanner(costs=costs).policy
    mode = policy.decide(pending=1, cap=budget)
    return mode, policy.forecast_rate / plain_rate


def as_run(result: dict, acceptance: dict[str, dict]) -> str:
    """The real pair's chain MAL × plain decoding's time per token ÷ the chain's step as it ran."""
    plain = 1.0 / result["plain"]["tokens_per_second"]
    cells = []
    for o in result["overhead"]:
        key = f"{o['strategy']}:{o['budget']}"
        if o["strategy"] == "chain" and "step_ms" in o and key in acceptance:
            cells.append(f"{key} {acceptance[key]['mal'] * plain / (o['step_ms'] / 1000):.2f}×")
    return ", ".join(cells) or "-"


def main(argv: list[str]) -> int:
    results_dir, *acceptance_files = argv
    acceptance: dict[str, dict] = {}
    for f in acceptance_files:
        acceptance.update(acceptance_from_bench(json.loads(Path(f).read_text())))
    docs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(results_dir).glob("gpu-*.json"))}
    overhead = next((r["overhead"] for d in docs.values() for r in d["results"] if r["overhead"]), [])
    print("| run | target | GPU layers | c_t(1) ms | c_t(16)/c_t(1) | c_t(64)/c_t(1) | c_d(1) ms", end="")
    print(" | plain tok/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, doc in docs.items():
        for r in doc["results"]:
            c = CostProfile.from_dict(r["costs"]).model()
            layers = r.get("target_gpu_layers", -1)
            print(
                f"| {name} | {r['target'].split('-Q4_K')[0]} | {'all' if layers == -1 else layers} | "
                f"{c.t(1) * 1000:.2f} | {c.t(16) / c.t(1):.2f} | {c.t(64) / c.t(1):.2f} | "
                f"{c.d(1) * 1000:.2f} | {r['plain']['tokens_per_second']:.1f} |"
            )
            own = {(o["strategy"], o["budget"]) for o in r["overhead"]}
            merged = r["overhead"] + [o for o in overhead if (o["strategy"], o["budget"]) not in own]
            rows.append((name, {**r, "overhead": merged}, c, as_run(r, acceptance)))
    print("\n| run | " + " | ".join(acceptance) + " | best | auto (mode, forecast) | chain, step as run |")
    print("|---|" + "---:|" * (len(acceptance) + 3))
    for name, r, c, measured in rows:
        found = {p["key"]: p["speedup"] for p in predict(r, acceptance)}
        best = max(found, key=found.get) if found else "-"
        mode, forecast = auto_choice(c, r["plain"]["tokens_per_second"])
        cells = [f"{found[k]:.2f}×" if k in found else "-" for k in acceptance]
        best_cell = f"{best} {found[best]:.2f}×" if found else "-"
        said = "plain" if mode == "plain" else f"{mode}, {forecast:.2f}×"
        print(f"| {name} | " + " | ".join(cells) + f" | {best_cell} | {said} | {measured} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
