"""The prepared GPU device check, one stage per call (``scripts/gpu/check.sh`` runs them all, each under
its own time limit; see scripts/gpu/README.md). Each stage writes ``OUT/result.json`` and ``OUT/summary.md``
when it ends, so a timeout later in the run loses nothing before it.

Stages:

- ``sanity``: the library loads, sees the CUDA device (``--dry``: any device), and one plain decode runs.
- ``lossless``: every strategy's greedy tokens equal plain decoding's, or first differ where plain
  decoding's top-2 logit gap is under ``--near-tie`` (a batch sums in another order than one token);
  flash attention on and off; draft ≠ target and draft = target; the target's rows reduced by numpy
  and by llama.cpp's backend samplers. Random weights leave margins of ~0.1, so each emitted token is
  also checked to be the argmax of its own row of the verify batch (``rowcheck.py``; numpy's
  reductions, where the engine hands the decoder whole rows).
- ``auto``: auto against plain decoding, paired (alternating runs, tokens/s).
- ``sampling``: the engine's reductions on the GPU (llama.cpp's backend samplers) against numpy's,
  paired, for plain, chain and auto; greedy tokens equal. Skipped when the engine has no such setting.
- ``curves``: c_t(n), c_d(n), plain tokens/s and chains as run (``kit.measure_target``) for each target
  at full and half offload.
- ``binary``: the CUDA binary's ``--help`` and one answer on the GPU.

``--dry``: the same logic on the CPU with tiny random models (``randomgguf.write_tiny_gguf``; draft ≠
target by seed), every stage small: tests/engine/test_gpu_check.py runs it. ``--layers N``: the GPU
run's shapes and sizes with every model cut to N layers (the GPU path tried on any machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from argparse import Namespace
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path
from statistics import median

import kit  # scripts/gpu and scripts on PYTHONPATH (check.sh)
import numpy as np
import randomgguf
from rowcheck import RowKeeper, run_tokens

from edgespec.engine import EngineSettings, ModelPair
from edgespec.planner.strategies import STRATEGY_NAMES
from edgespec.profile.attach import PairProfile, attach
from edgespec.strategy import PairDefaults, StrategyChoice, make_planner

STAGES = ("sanity", "lossless", "auto", "sampling", "curves", "binary")
LOSSY = ("mcsd-target-init",)  # its longest-branch rule is lossy by design (Lu et al. 2024, §3.1)
TRAINED = ("parallelspec",)  # needs a trained [MASK] adapter, which random weights have not
LOSSLESS = tuple(s for s in (*STRATEGY_NAMES, "auto") if s not in LOSSY + TRAINED)


@dataclass(frozen=True)
class Sizes:
    """How big each stage is: the GPU run (≤ 8 minutes on an H200) or the CPU dry run (seconds)."""

    draft: str  # the draft's shape (a randomgguf BUILTIN name) or "tiny"
    target: str  # the lossless/auto/sampling target
    curve_targets: tuple[str, ...]
    tokens: int  # per lossless / paired run
    prompts: int  # prompts per lossless comparison
    repeats: int  # paired runs per side
    budget: int  # every strategy's tree size in the lossless stage
    sizes: tuple[int, ...]  # curve sizes
    chain_budgets: tuple[int, ...]
    n_ctx: int


GPU = Sizes(
    draft="qwen2.5-0.5b",
    target="qwen2.5-1.5b",
    curve_targets=("qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b"),
    tokens=48,
    prompts=1,
    repeats=3,
    budget=16,
    sizes=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64),
    chain_budgets=(4, 8, 16),
    n_ctx=2048,
)
DRY = Sizes("tiny", "tiny", ("tiny",), tokens=12, prompts=1, repeats=2, budget=6, sizes=(1, 2, 4),
            chain_budgets=(4,), n_ctx=512)  # fmt: skip
TINY_VOCAB = 1088


# --- models ---------------------------------------------------------------------------------------


def model_path(name: str, args: Namespace, role: str = "target") -> Path:
    """The random GGUF for ``name`` (written when missing); "tiny": the tests' tiny model, the draft
    with another seed than the target so that draft ≠ target."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if name == "tiny":
        path = work / f"tiny-{role}.gguf"
        if not path.exists():
            seed = randomgguf.TINY_SEED if role == "target" else randomgguf.TINY_SEED + 6
            # ids up to TINY_VOCAB: kit.measure_target's prompt is ids 1000-1063 (padding: silent tokens)
            randomgguf.write_tiny_gguf(path, replace(randomgguf.TINY, n_vocab=TINY_VOCAB), seed=seed)
        return path
    ready = work / f"{name}-{args.layers}.ready"  # after the whole file, by `gen` (check.sh starts it early)
    path = kit.make_model(name, args.tokenizer_from, work, "Q4_K", args.layers)
    ready.touch()
    return path


def wait_for(name: str, args: Namespace, seconds: float) -> Path:
    """The model ``gen`` writes in the background, once it is whole (or written here if ``gen`` never
    started)."""
    ready, started = Path(args.work) / f"{name}-{args.layers}.ready", time.monotonic()
    while (
        name != "tiny" and not ready.exists() and time.monotonic() - started < seconds and _gen_running(args)
    ):
        time.sleep(1)
    return model_path(name, args)


def _gen_running(args: Namespace) -> bool:
    try:
        os.kill(int((Path(args.work) / "gen.pid").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def load(target: Path, draft: Path, args: Namespace, **settings) -> ModelPair:
    """A pair with every layer offloaded unless ``settings`` say otherwise."""
    base = {
        "n_ctx": args.sizes.n_ctx,
        "threads": args.threads,
        "max_tree_nodes": 64,
        "target_gpu_layers": -1,
        "draft_gpu_layers": -1,
        "probe_dir": Path(args.work) / "probes",
    }
    return ModelPair(str(target), str(draft), EngineSettings(**{**base, **settings}))


def prompts(count: int) -> list[list[int]]:
    """Prompts of 48 printable-byte ids each: any ids do for random weights, these for the tiny model's
    synthetic tokenizer too (its silent ids never win a greedy choice)."""
    rng = np.random.default_rng(7)
    return [list(map(int, rng.integers(40, 120, size=48))) for _ in range(count)]


# --- stages ---------------------------------------------------------------------------------------


def planner_for(name: str, budget: int, profile: PairProfile):
    return attach(make_planner(StrategyChoice(name, {"budget": budget}), PairDefaults("random")), profile)


def stage_sanity(args: Namespace) -> dict:
    from edgespec.engine._backend import supports_gpu_offload, system_info

    smi = None
    if not args.dry:
        query = [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,compute_cap",
            "--format=csv,noheader",
        ]
        try:
            smi = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as err:
            smi = f"nvidia-smi: {err}"
    draft, target = model_path(args.sizes.draft, args, "draft"), model_path(args.sizes.target, args)
    with load(target, draft, args) as pair:
        run = run_tokens(pair, None, prompts(1)[0], 8)
    info = system_info()
    gpu = supports_gpu_offload() and "CUDA" in info
    return {
        "ok": gpu or args.dry or args.layers is not None,  # CUDA, unless a CPU run of the GPU path
        "gpu_offload": supports_gpu_offload(),
        "cuda": gpu,
        "system_info": info,
        "nvidia_smi": smi,
        "decoded": len(run["tokens"]),
        "tokens_per_second": run["tokens_per_second"],
    }


def stage_lossless(args: Namespace) -> dict:
    s = args.sizes
    draft, target = model_path(s.draft, args, "draft"), model_path(s.target, args)
    cases = []
    # rows are kept (and checked) under numpy's reductions; the backend's samplers keep none
    reductions = ({"reductions": "numpy"}, {"reductions": "backend"})
    for pair_name, (t, d) in {"draft≠target": (target, draft), "draft=target": (draft, draft)}.items():
        for flash, where in product((True, False), reductions):
            with (
                load(t, d, args, flash_attn=flash, **where) as pair,
                PairProfile(pair, home=Path(args.work)) as profile,
            ):
                keeper = RowKeeper(pair)
                for p, prompt in enumerate(prompts(s.prompts)):
                    plain = run_tokens(pair, None, prompt, s.tokens)
                    for name in LOSSLESS:
                        run = run_tokens(pair, planner_for(name, s.budget, profile), prompt, s.tokens, keeper)
                        case = {"pair": pair_name, "flash_attn": flash, **where, "prompt": p}
                        cases.append({**case, "strategy": name, **compare(run, plain, args.near_tie)})
                    keep_partial(args, cases)
    failures = [c for c in cases if not c["ok"]]
    return {
        "ok": not failures,
        "near_tie": args.near_tie,
        "strategies": list(LOSSLESS),
        "cases": cases,
        "failures": failures,
        "rows_checked": sum(c["rows_checked"] for c in cases),
        "near_tie_divergences": sum(c["diverges_at"] is not None for c in cases),
    }


def keep_partial(args: Namespace, done: list) -> None:
    """What a long stage has so far, in OUT/partial.json: it survives the stage's time limit."""
    (Path(args.out) / "partial.json").write_text(json.dumps(done, indent=1, default=str))


def compare(run: dict, plain: dict, near_tie: float) -> dict:
    """A strategy's run against plain decoding's: equal, or first different where plain decoding's top-2
    gap was under ``near_tie``; and every emitted token its verify row's argmax."""
    at = next((i for i, (a, b) in enumerate(zip(run["tokens"], plain["tokens"])) if a != b), None)
    margin = None if at is None else plain["margins"][at]
    return {
        "diverges_at": at,
        "plain_margin": margin,
        "rows_checked": run["rows_checked"],
        "not_argmax": run["not_argmax"],
        "ok": (margin is None or margin < near_tie) and not run["not_argmax"],
    }


def paired(runs: dict[str, callable], repeats: int) -> dict:
    """Each run ``repeats`` times, alternating the order every round; median tokens/s of each."""
    rates: dict[str, list[float]] = {name: [] for name in runs}
    tokens: dict[str, list[int]] = {}
    for r in range(repeats):
        for name in list(runs)[:: 1 if r % 2 == 0 else -1]:
            done = runs[name]()
            rates[name].append(done["tokens_per_second"])
            tokens[name] = done["tokens"]
    return {
        name: {"tokens_per_second": median(v), "runs": v, "tokens": tokens[name]} for name, v in rates.items()
    }


def stage_auto(args: Namespace) -> dict:
    s = args.sizes
    with (
        load(model_path(s.target, args), model_path(s.draft, args, "draft"), args) as pair,
        PairProfile(pair, home=Path(args.work)) as profile,
    ):
        prompt = prompts(1)[0]
        auto = planner_for("auto", s.budget, profile)
        done = paired(
            {
                "plain": lambda: run_tokens(pair, None, prompt, s.tokens),
                "auto": lambda: run_tokens(pair, auto, prompt, s.tokens),
            },
            s.repeats,
        )
    ratio = done["auto"]["tokens_per_second"] / done["plain"]["tokens_per_second"]
    return {"ok": True, "auto_over_plain": ratio, "runs": done}


def stage_sampling(args: Namespace) -> dict:
    s = args.sizes
    target, draft = model_path(s.target, args), model_path(s.draft, args, "draft")
    out: dict = {"ok": True}
    prompt = prompts(1)[0]
    with (
        load(target, draft, args, reductions="backend") as gpu,
        load(target, draft, args, reductions="numpy") as cpu,
        PairProfile(gpu, home=Path(args.work)) as gp,
        PairProfile(cpu, home=Path(args.work)) as cp,
    ):
        for name in ("none", "chain", "auto"):
            planners = {
                "backend": (gpu, None if name == "none" else planner_for(name, s.budget, gp)),
                "numpy": (cpu, None if name == "none" else planner_for(name, s.budget, cp)),
            }
            done = paired(
                {
                    side: (lambda p=p, q=q: run_tokens(p, q, prompt, s.tokens))
                    for side, (p, q) in planners.items()
                },
                s.repeats,
            )
            same = done["backend"]["tokens"] == done["numpy"]["tokens"]
            out[name] = {
                "backend_over_numpy": done["backend"]["tokens_per_second"]
                / done["numpy"]["tokens_per_second"],
                "same_tokens": same,
                "runs": done,
            }
            out["ok"] &= same
    return out


def stage_curves(args: Namespace) -> dict:
    from edgespec.models.shapes import shape_of

    s = args.sizes
    draft = model_path(s.draft, args, "draft")
    results = []
    for name in s.curve_targets:
        target = wait_for(name, args, 240)
        layers = randomgguf.TINY.n_layer if name == "tiny" else args.layers or shape_of(name).n_layer
        for gpu_layers in (-1, layers // 2):
            measure = Namespace(
                gpu_layers=gpu_layers,
                draft_gpu_layers=-1,
                threads=args.threads,
                sizes=s.sizes,
                repeats=2,
                tokens=s.tokens,
                strategies=("chain",),
                budgets=s.chain_budgets,
            )
            started = time.monotonic()
            results.append(
                {**kit.measure_target(target, draft, measure), "seconds": time.monotonic() - started}
            )
            keep_partial(args, results)
    labelled = [
        {**r, "target": f"{r['target']} ({r['target_gpu_layers']} layers on the GPU)"} for r in results
    ]
    return {"ok": True, "results": results, "table": kit.markdown(labelled, None)}


def stage_binary(args: Namespace) -> dict:
    if not args.binary:
        return {"ok": True, "skipped": "no binary: build dist/edgespec-cuda (scripts/build_binary.py --cuda)"}
    command = shlex.split(args.binary)
    draft, target = model_path(args.sizes.draft, args, "draft"), model_path(args.sizes.target, args)
    env = {**os.environ, "EDGESPEC_HOME": str(Path(args.work) / "home")}  # its profile cache, not the user's
    helped = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120, env=env)
    # the user's defaults (strategy and offload: auto) but for the models; a dry run's chain measures nothing
    ask = [
        "generate",
        "Say hello.",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--max-tokens",
        "8",
        "--json",
        "--ctx",
        str(args.sizes.n_ctx),
        *(["--strategy", "chain"] if args.dry else []),
    ]
    answer = subprocess.run([*command, *ask], capture_output=True, text=True, timeout=300, env=env)
    doc = json.loads(answer.stdout) if answer.returncode == 0 else None
    return {
        "ok": helped.returncode == 0 and doc is not None,
        "help_rc": helped.returncode,
        "answer_rc": answer.returncode,
        "answer": doc,
        "stderr_tail": answer.stderr[-2000:],
    }


def stage_gen(args: Namespace) -> dict:
    """The big targets, written in the background while the first stages run (check.sh)."""
    for name in args.sizes.curve_targets:
        if name not in (args.sizes.target, args.sizes.draft):  # those the first stage writes itself
            model_path(name, args)
    return {"ok": True}


RUN = {
    "sanity": stage_sanity,
    "lossless": stage_lossless,
    "auto": stage_auto,
    "sampling": stage_sampling,
    "curves": stage_curves,
    "binary": stage_binary,
    "gen": stage_gen,
}


def summary(stage: str, result: dict) -> str:
    """A few lines a reader takes in at a glance; the JSON next to it has everything."""
    state = "skipped: " + result["skipped"] if "skipped" in result else ("ok" if result["ok"] else "FAILED")
    lines = [f"# {stage}: {state}", ""]
    keys = (
        "error",
        "system_info",
        "nvidia_smi",
        "tokens_per_second",
        "rows_checked",
        "near_tie_divergences",
        "auto_over_plain",
        "answer_rc",
        "seconds",
    )
    lines += [f"- {k}: {result[k]}" for k in keys if k in result]
    lines += [f"- failure: {json.dumps(f)}" for f in result.get("failures", [])[:10]]
    lines += [
        f"- {k}: backend/numpy {v['backend_over_numpy']:.3f}, same tokens {v['same_tokens']}"
        for k, v in result.items()
        if isinstance(v, dict) and "backend_over_numpy" in v
    ]
    if "table" in result:
        lines += ["", result["table"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu/check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("stage", choices=[*STAGES, "gen"])
    p.add_argument("--out", required=True, help="this stage's folder: result.json and summary.md")
    p.add_argument("--work", required=True, help="where the random GGUFs go (kept between stages)")
    p.add_argument("--tokenizer-from", default="gpu-kit/qwen2.5-tokenizer.gguf")
    p.add_argument("--dry", action="store_true", help="tiny models on the CPU: the test suite's run")
    p.add_argument("--layers", type=int, help="real shapes cut to this many layers (the GPU path on a CPU)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument(
        "--near-tie", type=float, default=0.1, help="plain's top-2 gap under which a divergence passes"
    )
    p.add_argument("--binary", default="", help="the command to run as the binary (default: none)")
    args = p.parse_args(argv)
    args.sizes = DRY if args.dry else GPU
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        result = RUN[args.stage](args)
    except Exception as err:  # recorded for the report: the next stage still runs
        result = {
            "ok": False,
            "error": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc()[-4000:],
        }
    result["seconds"] = round(time.monotonic() - started, 1)
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "summary.md").write_text(summary(args.stage, result))
    print(summary(args.stage, result), end="")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
