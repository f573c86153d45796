"""The GPU check's stages (scripts/gpu/check.py's docstring says what each checks), by name in ``RUN``:
each takes the parsed arguments and returns its result, ``ok`` saying whether it passed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from argparse import Namespace
from itertools import product
from pathlib import Path
from statistics import median

import kit  # scripts/gpu and scripts on PYTHONPATH (check.sh)
import randomgguf
from rowcheck import RowKeeper, run_tokens
from workload import load, model_path, prompts, wait_for

from edgespec.planner.strategies import STRATEGY_NAMES
from edgespec.profile.attach import PairProfile, attach
from edgespec.strategy import PairDefaults, StrategyChoice, make_planner

STAGES = ("sanity", "lossless", "auto", "sampling", "curves", "binary")
LOSSY = ("mcsd-target-init",)  # its longest-branch rule is lossy by design (Lu et al. 2024, §3.1)
TRAINED = ("parallelspec",)  # needs a trained [MASK] adapter, which random weights have not
LOSSLESS = tuple(s for s in (*STRATEGY_NAMES, "auto") if s not in LOSSY + TRAINED)


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
