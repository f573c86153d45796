"""`edgespec tune`: train MCSD's early-stop decision model for a pair, and optionally compare it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rich.console import Console

from .. import options
from ..errors import EdgespecError
from ..measure import tune as tuning
from ..models.paths import decision_model_path
from ..planner.earlystop import DecisionModel
from ..profile.attach import attach
from ..progress import progress_bar
from ..strategy import StrategyChoice, make_planner

VARIANTS = ("off", "threshold", "model", "target-init")  # plain decoding always runs too


def register(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="train MCSD's early-stop decision model on the pair's own drafts",
        description="Run the pair with MCSD (early stop off) on a prompt set, label every drafted token "
        "with whether the target accepted it, train the decision model (numpy, fixed seed), report "
        "held-out accuracy and AUC, and store it where `--early-stop model` finds it: "
        "<data home>/decision-models/<pair>.npz. With --compare, plain decoding and MCSD variants are "
        "then timed side by side (interleaved per prompt) on the held-out prompts.",
    )
    p.add_argument(
        "--prompts",
        default="quick",
        help="prompt sets (engine, code, chat, math, summarisation, translation, quick, all; "
        "comma-separated) or a .jsonl file (default: quick)",
    )
    p.add_argument("--max-tokens", type=int, default=64, help="answer length per prompt (default 64)")
    p.add_argument("--strategy", choices=("mcsd", "mcsd-target-init"), default="mcsd", help="default: mcsd")
    p.add_argument("--held-out", type=float, default=0.2, help="share held out for evaluation (default 0.2)")
    p.add_argument("--hidden", type=int, default=16, help="hidden units (0: logistic regression)")
    p.add_argument("--epochs", type=int, default=400, help="full-batch Adam steps (default 400)")
    p.add_argument("--train-seed", type=int, default=0, help="seed of the split and the initial weights")
    p.add_argument("--output", help="where to store the model (default: the data home, per pair)")
    p.add_argument("--no-train", action="store_true", help="skip training: compare with the stored model")
    p.add_argument("--compare", action="store_true", help="then time plain decoding and MCSD variants")
    p.add_argument("--compare-prompts", help="prompt set for --compare (default: the held-out prompts)")
    p.add_argument("--compare-tokens", type=int, help="answer length for --compare (default: --max-tokens)")
    p.add_argument(
        "--variants",
        default="off,threshold,model",
        help=f"compared MCSD variants (of {','.join(VARIANTS)}), each between two plain runs",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object with the report")
    p.add_argument(
        "--like",
        metavar="SHAPE",
        help="no training: time plain decoding and the MCSD variants (off, threshold, target-init) on a "
        "random-weight target of a model's shape (qwen2.5-7b, …; NAME:layers=N,… to shrink it) with the "
        "bundled draft, and its cost curves; written to a temporary folder, deleted after; every figure "
        "is timing only (random weights make acceptance meaningless)",
    )
    options.add_run_args(p, strategy=False)
    group = p.add_argument_group(
        "strategy parameters", "early stop is off while collecting; --compare sets it"
    )
    options.add_parameter_flags(group, among=("mcsd", "mcsd-target-init"))
    p.set_defaults(run=run)


def _planner(
    args,
    resolved,
    pair,
    early_stop: str = "off",
    model_path: Path | None = None,
    strategy: str | None = None,
):
    """The command line's strategy choice with the early stop of a compared variant (off to collect),
    given what it asks of the loaded ``pair``'s profile (MCSD asks nothing: nothing is measured)."""
    params = {**options.parameters_from_args(args), "early_stop": early_stop}
    if model_path is not None:
        params["early_stop_model"] = str(model_path)
    planner = make_planner(StrategyChoice(strategy or args.strategy, params), resolved.defaults)
    attach(planner, pair)
    return planner


def run(args) -> int:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise EdgespecError(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    cases = tuning.load_cases(args.prompts)
    sampling = options.sampling_params(args)
    console = Console(stderr=True, quiet=args.json)
    if args.like:
        return _like(args, variants, cases, sampling, console)
    out: dict = {}
    resolved, pair = options.load(args)
    path = Path(args.output) if args.output else decision_model_path(resolved.name)
    with pair:
        out["pair"] = resolved.name
        compare_cases = cases
        if not args.no_train:
            planner = _planner(args, resolved, pair)
            with progress_bar(f"{planner.name} {planner.describe()}", console) as bar:
                examples = tuning.collect(
                    pair,
                    planner,
                    cases,
                    args.max_tokens,
                    sampling,
                    lambda i: bar(cases[i].name, i + 1, len(cases)),
                )
            model, report = tuning.train(
                examples, args.held_out, args.train_seed, hidden=args.hidden, epochs=args.epochs
            )
            meta = {
                "pair": resolved.name,
                "strategy": planner.name,
                "params": planner.describe(),
                "prompts": args.prompts,
                "max_tokens": args.max_tokens,
                "temperature": sampling.temperature,
                "examples": int(examples.y.size),
                "hidden": args.hidden,
                "seed": args.train_seed,
            }
            tuning.save(model, report, path, meta, cases)
            _print_training(console, examples, report, path, resolved.name)
            out.update(training=meta, held_out=report.as_dict(), model_path=str(path))
            compare_cases = tuning.held_out_cases(path, cases)
        elif not path.is_file():
            raise EdgespecError(f"no decision model at {path}: run `edgespec tune` without --no-train first")
        else:
            DecisionModel.load(path)  # fails early, with the loader's message, if it is stale
            compare_cases = tuning.held_out_cases(path, cases)
        if args.compare:
            if args.compare_prompts:
                compare_cases = tuning.load_cases(args.compare_prompts)
            chosen = {v: _variant(v, args, resolved, pair, path) for v in variants}
            tokens = args.compare_tokens or args.max_tokens
            with progress_bar("compare", console) as bar:
                rows = tuning.compare(
                    pair,
                    chosen,
                    compare_cases,
                    tokens,
                    sampling,
                    bar,
                )
            out["compare"] = {"prompts": [c.name for c in compare_cases], "max_tokens": tokens, "rows": rows}
            console.print(tuning.format_table(rows), markup=False, highlight=False)
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
    return 0


def _variant(name: str, args, resolved, pair, model_path: Path | None = None):
    """The planner of a compared variant (``VARIANTS``): MCSD with that early stop (``model`` reads the
    decision model at ``model_path``), or mcsd-target-init."""
    if name == "target-init":
        return _planner(args, resolved, pair, strategy="mcsd-target-init")
    return _planner(args, resolved, pair, name, model_path if name == "model" else None, "mcsd")


def _like(args, variants: list[str], cases, sampling, console: Console) -> int:
    """``--like``: the cost curves, then plain decoding and the variants that need no decision model
    timed on a random-weight target of the shape (nothing trained or stored: acceptance is noise)."""
    from contextlib import ExitStack

    from ..measure.report import profile_table
    from ..profile.attach import PairProfile
    from ..profile.like import TIMING_ONLY, check_like_models, keep_like, open_like

    check_like_models(args.pair, args.target, args.draft)
    if "model" in variants:
        console.print("--like: the 'model' variant is left out (its decision model learns acceptance)")
        variants = [v for v in variants if v != "model"]
    stack = ExitStack()  # the random target's temporary folder, deleted after the pair closes
    like, pair = open_like(args.like, options.engine_settings(args), stack)
    with stack, pair:
        with PairProfile(pair, show_progress=True, home=like.scratch, label="cost profile") as profiled:
            measured = profiled.cost_profile()
        assert measured is not None  # the pair has a draft
        profile = keep_like(measured, like.key)
        chosen = {v: _variant(v, args, like.resolved, pair) for v in variants}
        compare_cases = tuning.load_cases(args.compare_prompts) if args.compare_prompts else cases
        tokens = args.compare_tokens or args.max_tokens
        with progress_bar("compare", console) as bar:
            rows = tuning.compare(pair, chosen, compare_cases, tokens, sampling, bar)
    console.print(profile_table(profile))
    console.print(tuning.format_table(rows), markup=False, highlight=False)
    console.print(f"TIMING ONLY: {TIMING_ONLY}", markup=False, highlight=False)
    if args.json:
        out = {
            "pair": like.resolved.name,
            "like": args.like,
            "timing_only": True,
            "timing_only_why": TIMING_ONLY,
            "cost_profile": {**profile.as_dict(), "timing_only": True},
            "compare": {
                "prompts": [c.name for c in compare_cases],
                "max_tokens": tokens,
                "rows": [{**row, "timing_only": True} for row in rows],
            },
        }
        print(json.dumps(out, ensure_ascii=False))
    return 0


def _print_training(console: Console, examples, report, path: Path, pair_name: str) -> None:
    stats = examples.stats
    tokens = sum(s.tokens for s in stats)
    calls = sum(s.target_calls for s in stats)
    console.print(
        f"collected {examples.y.size} drafted tokens from {len(stats)} prompts "
        f"({tokens} tokens, MAL {tokens / max(calls, 1):.2f}, {examples.y.mean():.1%} of drafted accepted)",
        highlight=False,
    )
    console.print(
        f"held out {report.split}: {report.n_held_out} examples, base rate {report.base_rate:.1%}\n"
        f"  accuracy {report.accuracy:.3f} (always-majority {report.majority_accuracy:.3f})   "
        f"AUC {report.auc:.3f} (draft probability alone {report.auc_draft_prob:.3f})",
        highlight=False,
    )
    console.print(f"saved the decision model to {path}", highlight=False, markup=False)
    default = path == decision_model_path(pair_name)
    flag = "" if default else f" --early-stop-model {path}"
    console.print(f"use it: edgespec generate --strategy mcsd --early-stop model{flag} …", markup=False)
    if math.isnan(report.auc):
        print("warning: the held-out examples are all of one class; AUC is undefined", file=sys.stderr)
