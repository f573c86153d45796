"""The GPU measurement kit's logic (``scripts/gpu/measure.py`` is the entry point; see scripts/gpu/README.md).

On a machine with one GPU and no model downloads, it makes random-weight GGUFs of real shapes (a
0.5B draft; 1.5B/7B/14B/32B targets, Q4_K: costs depend on shapes, not weights), offloads them
fully and records, per target size:

- c_t(n): the target verifying n tokens, and c_d(n): one draft level of n nodes, n = 1…64
  (``costs.measure``: each sample paired with a 1-token sample of the same curve);
- plain tokens/s (the target alone, one token per decode);
- edgespec's Python overhead per step (``time_split.python``) for each strategy at budgets 4/8/16/32,
  with the median draft passes per step, and each step's wall time as it ran (draft, verify, total:
  the formula's curve sum checked against the real loop, CUDA graphs and all).

``predict`` combines those curves with the acceptance measured on the real pair (a ``bench --json``
document: MAL, verified tokens and draft passes per step of each strategy/budget) into the speedup
each strategy would reach on that GPU, per target size:

    step(s, b)  = c_t(v) + c_k(1) + (P − 1) · c_d(w) + python(s, b)     w = ⌈(v − 1) / P⌉
    plain       = 1 / (plain decoding's measured tokens/s)
    speedup     = MAL · plain / step(s, b)

with v the verified tokens per step, P the draft passes per step (the first one also catches up the
root: c_k(1), the draft decoding one committed token), w the average nodes per later pass.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path
from statistics import median
from time import perf_counter

from edgespec.models.shapes import make_like
from edgespec.profile.costs import CostProfile, measure

DRAFT = "qwen2.5-0.5b"
TARGETS = ("qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b")
BUDGETS = (4, 8, 16, 32)
STRATEGIES = ("chain", "tsd", "opt-tree", "dyspec")  # chain: γ = budget
SIZES = tuple(range(1, 65))


def make_model(name: str, tokenizer_gguf: str, out_dir: Path, qtype: str = "Q4_K", layers: int | None = None):
    """A random-weight GGUF shaped like ``name`` (the one in ``out_dir`` reused while it has that shape)."""
    shape = f"{name}:quant={qtype}" + ("" if layers is None else f",layers={layers}")
    return make_like(shape, out_dir, tokenizer_from=Path(tokenizer_gguf))


def overhead(pair, strategy: str, budget: int, prompt: list[int], tokens: int) -> dict:
    """Median Python ms, draft passes and wall ms (draft, verify, whole step) per step of one
    strategy/budget (greedy)."""
    from edgespec.decoding.decoder import Request, generate
    from edgespec.strategy import PairDefaults, StrategyChoice, make_planner

    planner = make_planner(StrategyChoice(strategy, {"budget": budget}), PairDefaults("random"))
    steps = [
        e for e in generate(pair, planner, Request(prompt=prompt, max_tokens=tokens)) if e.verified_nodes
    ]
    return {
        "strategy": strategy,
        "budget": budget,
        "steps": len(steps),
        "python_ms_per_step": median(e.timings.python for e in steps) * 1000,
        "draft_passes_per_step": median(e.draft_decodes for e in steps),
        "verified_per_step": median(e.verified_nodes for e in steps),
        "draft_ms_per_step": median(e.timings.draft for e in steps) * 1000,
        "verify_ms_per_step": median(e.timings.verify for e in steps) * 1000,
        "step_ms": median(e.timings.total for e in steps) * 1000,
    }


def plain_rate(pair, prompt: list[int], tokens: int) -> dict:
    from edgespec.decoding.decoder import Request, generate

    # tokens/s after the prompt, as bench and advise count plain decoding: the prompt's prefill timed
    # inside it made a 7B's 62 ms decode read as 9.6 tok/s, not 16.1, and every speedup 1.6-1.9x too high
    start = perf_counter()
    events = list(generate(pair, None, Request(prompt=prompt, max_tokens=tokens)))
    seconds = perf_counter() - start - sum(e.prefill_seconds for e in events)
    produced = sum(len(e.tokens) for e in events)
    python = [e.timings.python for e in events if e.verified_nodes]
    return {"tokens_per_second": produced / seconds, "python_ms_per_step": median(python) * 1000}


def measure_target(target: Path, draft: Path, args) -> dict:
    """Everything for one target size; the pair is loaded with every layer offloaded."""
    from edgespec.engine import EngineSettings, ModelPair

    offload = {"target_gpu_layers": args.gpu_layers, "draft_gpu_layers": args.draft_gpu_layers}
    settings = EngineSettings(n_ctx=2048, threads=args.threads, max_tree_nodes=64, **offload)
    with ModelPair(str(target), str(draft), settings) as pair:
        profile = measure(pair, sizes=args.sizes, catchup_sizes=(1, 2, 4, 8), repeats=args.repeats)
        prompt = list(range(1000, 1000 + 64))  # any ids: the weights are random
        plain = plain_rate(pair, prompt, args.tokens)
        rows = [overhead(pair, s, b, prompt, args.tokens) for s in args.strategies for b in args.budgets]
    return {
        "target": target.name,
        "draft": draft.name,
        "target_gpu_layers": args.gpu_layers,
        "costs": profile.as_dict(),
        "plain": plain,
        "overhead": rows,
    }


def predict(result: dict, acceptance: dict[str, dict]) -> list[dict]:
    """Predicted speedup of every measured strategy/budget (module docstring formula)."""
    costs = CostProfile.from_dict(result["costs"]).model()
    python = {(r["strategy"], r["budget"]): r["python_ms_per_step"] / 1000 for r in result["overhead"]}
    # plain decoding's own loop, measured (on a GPU it runs as CUDA graphs, faster than c_t(1) of a
    # curve whose batch sizes alternate)
    plain = 1.0 / result["plain"]["tokens_per_second"]
    out = []
    for key, acc in acceptance.items():
        strategy, _, budget = key.partition(":")
        py = python.get((strategy, int(budget))) if budget.isdigit() else None
        if py is None or not acc.get("draft_decodes_per_step"):
            continue
        v = min(64, max(1, round(acc["verified_per_step"])))
        passes = acc["draft_decodes_per_step"]
        width = min(64, max(1, math.ceil((v - 1) / passes)))
        step = float(costs.t(v)) + float(costs.k(1)) + (passes - 1) * float(costs.d(width)) + py
        speedup = acc["mal"] * plain / step
        out.append({"key": key, "mal": acc["mal"], "verified": v, "passes": passes, "step_ms": step * 1000})
        out[-1]["speedup"] = speedup
    return out


def acceptance_from_bench(doc: dict) -> dict[str, dict]:
    """MAL, verified tokens and draft passes per step of each entry of a ``bench --json`` document."""
    return {r["key"]: r for r in doc["results"]}


def markdown(results: list[dict], acceptance: dict[str, dict] | None) -> str:
    lines = ["| target | c_t(1) ms | c_t(16)/c_t(1) | c_d(1) ms | c_d(16)/c_d(1) | plain tok/s |"]
    lines.append("|---|---:|---:|---:|---:|---:|")
    for r in results:
        c = CostProfile.from_dict(r["costs"]).model()
        lines.append(
            f"| {r['target']} | {c.t(1) * 1000:.2f} | {c.t(16) / c.t(1):.2f} | {c.d(1) * 1000:.2f} | "
            f"{c.d(16) / c.d(1):.2f} | {r['plain']['tokens_per_second']:.1f} |"
        )
    lines += [
        "",
        "| target | strategy | budget | python ms/step | draft passes/step | draft ms | verify ms "
        "| step ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for o in r["overhead"]:
            lines.append(
                f"| {r['target']} | {o['strategy']} | {o['budget']} | {o['python_ms_per_step']:.2f} | "
                f"{o['draft_passes_per_step']:g} | {o['draft_ms_per_step']:.2f} | "
                f"{o['verify_ms_per_step']:.2f} | {o['step_ms']:.2f} |"
            )
    if acceptance:
        lines += [
            "",
            "| target | strategy | MAL (real pair) | verified | passes | step ms | predicted speedup |",
        ]
        lines.append("|---|---|---:|---:|---:|---:|---:|")
        for r in results:
            for p in predict(r, acceptance):
                lines.append(
                    f"| {r['target']} | {p['key']} | {p['mal']:.2f} | {p['verified']} | {p['passes']:g} | "
                    f"{p['step_ms']:.2f} | {p['speedup']:.2f}× |"
                )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/gpu/measure.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer-from", required=True, help="a GGUF with the Qwen2.5 tokenizer (the kit's)")
    p.add_argument("--work", default="gpu-work", help="where the random GGUFs go (several GiB)")
    p.add_argument("--targets", default=",".join(TARGETS), help="target shapes, comma-separated")
    p.add_argument("--draft", default=DRAFT)
    p.add_argument("--type", default="Q4_K")
    p.add_argument("--layers", type=int, help="override every model's layer count (tiny CPU runs)")
    p.add_argument("--gpu-layers", type=int, default=-1, help="target layers offloaded (-1: all)")
    p.add_argument("--draft-gpu-layers", type=int, default=-1, help="draft layers offloaded (-1: all)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--sizes", default="1-64", help="curve sizes: 'A-B' or comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--tokens", type=int, default=64, help="tokens per overhead / plain run")
    p.add_argument("--keep", action="store_true", help="keep the targets' GGUFs for a later run")
    p.add_argument("--acceptance", help="a bench --json document of the real pair (for predicted speedups)")
    p.add_argument("--out", required=True, help="JSON to write; the table goes next to it as .md")
    return p


def _sizes(text: str) -> tuple[int, ...]:
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return tuple(range(lo, hi + 1))
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.sizes = _sizes(args.sizes)
    args.budgets = tuple(int(b) for b in args.budgets.split(","))
    args.strategies = tuple(s for s in args.strategies.split(",") if s)  # "": curves and plain only
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    from edgespec.engine._backend import supports_gpu_offload, system_info

    draft = make_model(args.draft, args.tokenizer_from, work, args.type, args.layers)
    results = []
    for name in args.targets.split(","):
        target = make_model(name, args.tokenizer_from, work, args.type, args.layers)
        print(f"measuring {target.name} with {draft.name}", file=sys.stderr, flush=True)
        results.append(measure_target(target, draft, args))
        if not args.keep:
            target.unlink()  # the next target needs the disk more than this one
    acceptance = None
    if args.acceptance:
        acceptance = acceptance_from_bench(json.loads(Path(args.acceptance).read_text()))
    doc = {
        "schema": "edgespec-gpu/1",
        "gpu_offload": supports_gpu_offload(),
        "system_info": system_info(),
        "host": platform.node(),
        "settings": {k: v for k, v in vars(args).items() if k != "acceptance"},
        "results": results,
        "predicted": {r["target"]: predict(r, acceptance) for r in results} if acceptance else None,
    }
    out = Path(args.out)
    out.write_text(json.dumps(doc, indent=1))
    out.with_suffix(".md").write_text(markdown(results, acceptance))
    print(out.with_suffix(".md").read_text())
    return 0
