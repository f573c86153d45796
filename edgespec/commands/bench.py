"""`edgespec bench`: speed of every strategy against plain decoding, paired prompt by prompt."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from .. import options
from ..decoding import checks
from ..errors import EdgespecError
from ..measure.prompts import set_names
from ..planner import strategies
from ..strategy import StrategyChoice, make_planner

DEFAULT_STRATEGIES = "chain,tsd,gsd,opt-tree,dyspec,mcsd,ngram,hybrid,auto"
# auto runs three times per prompt: its claim (never slower than plain decoding) is a ±2 % one, and
# on a shared machine one pair of runs per prompt is noisier than that
QUICK_STRATEGIES = "chain,tsd:8,dyspec:8,ngram,auto@3"
QUICK_MAX_TOKENS = 48
DEFAULT_MAX_TOKENS = 128


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="measure strategies against plain decoding (tokens/s, speedup, MAL, acceptance)",
        description="Runs plain decoding and each strategy on the same prompts, interleaved per prompt "
        "(P S1 P S2 P …) after a warm-up, and reports each strategy's tokens/s relative to the plain runs "
        "right before and after it (paired ratios: drift and background load cancel to first order).",
    )
    p.add_argument(
        "--strategies",
        help="comma-separated strategies, each NAME[:BUDGET][@RUNS] (RUNS: runs per prompt, each between "
        f"two plain runs; default --repeats) (default: {DEFAULT_STRATEGIES}; --quick: {QUICK_STRATEGIES})",
    )
    p.add_argument("--repeats", type=int, default=1, help="runs per prompt of every strategy (default 1)")
    p.add_argument(
        "--budgets", help="comma-separated budgets; every strategy runs at each (chain: γ; auto: its cap)"
    )
    p.add_argument(
        "--prompts",
        help='a .jsonl file ({"prompt": …} or {"messages": […]} per line) or built-in sets: '
        f"{', '.join(set_names())} (default: all; --quick: quick)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"6 short prompts (one per paper-style set, one edit), {QUICK_MAX_TOKENS} tokens, "
        f"strategies {QUICK_STRATEGIES}",
    )
    p.add_argument("--max-tokens", type=int, help=f"tokens per answer (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--warmup-tokens", type=int, default=8, help="tokens per variant in the warm-up")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="write a PNG of speedup and MAL per strategy")
    p.add_argument(
        "--compare", nargs=2, metavar=("A.json", "B.json"), help="print the differences of two JSON runs"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="print this pair's cost profile (measured if not cached) and exit",
    )
    p.add_argument(
        "--reprofile", action="store_true", help="measure the cost profile again (replaces the cached one)"
    )
    p.add_argument(
        "--like",
        metavar="SHAPE",
        help="time a random-weight target of a model's shape (qwen2.5-7b, qwen2.5-coder-14b, a registry "
        "name; NAME:layers=N,… to shrink it) with the bundled draft, written to a temporary folder and "
        "deleted after: cost curves and tokens/s only, marked timing only (random weights make acceptance "
        "meaningless)",
    )
    server = p.add_argument_group(
        "a running server",
        "--server URL measures any OpenAI-compatible server (edgespec serve, llama-server …) from a client: "
        "the --prompts set, a 6-turn conversation sent whole each turn (time to first token, prompt tokens "
        "decoded and cached) and a tool-call exchange; nothing is loaded here",
    )
    server.add_argument(
        "--server", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8080/v1"
    )
    server.add_argument(
        "--sets",
        default="prompts,conversation,tools",
        help="with --server: what to measure: prompts, conversation, tools (default: all)",
    )
    server.add_argument("--api-key", help="with --server: sent as 'Authorization: Bearer KEY'")
    server.add_argument(
        "--model", help="with --server: the model id to send (edgespec and llama-server take any)"
    )
    options.add_run_args(p, strategy=False)
    options.add_parameter_flags(p.add_argument_group("strategy parameters"))
    p.set_defaults(run=run)


def parse_variants(text: str, budgets: str | None, repeats: int = 1) -> list[tuple[str, int | None, int]]:
    """``"chain,tsd:8,auto@3"`` and ``"4,8"`` → [(name, budget or None, runs per prompt)], each strategy
    at each budget."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    try:
        extra = [int(b) for b in budgets.split(",") if b.strip()] if budgets else []
    except ValueError:
        raise EdgespecError(f"--budgets: {budgets[:80]!r} is not a list of whole numbers like 4,8") from None
    out: list[tuple[str, int | None, int]] = []
    for item in names:
        spec, _, runs = item.partition("@")
        name, _, budget = spec.partition(":")
        if name == "none" or name == "plain":
            continue  # plain decoding always runs: it is the baseline
        if name not in strategies.STRATEGIES:
            raise EdgespecError(f"unknown strategy {name!r}; choose from {', '.join(strategies.STRATEGIES)}")
        try:
            count = int(runs) if runs else repeats
            budget_list = [int(budget)] if budget else extra or [None]
        except ValueError as exc:
            raise EdgespecError(f"--strategies: {item!r} is not NAME[:BUDGET][@RUNS]") from exc
        if count < 1:
            raise EdgespecError(f"--strategies: {item!r} needs at least one run per prompt")
        out.extend((name, b, count) for b in budget_list)
    keys = [(name, budget) for name, budget, _ in out]
    if len(set(keys)) != len(keys):
        raise EdgespecError(f"--strategies lists a strategy twice at the same budget: {text}")
    return out


def build_variants(args, resolved) -> list:
    """One variant per strategy and budget (the command line's parameters for all, ``:BUDGET`` for
    one); the planners ask the pair's profile for what they need afterwards (``profile.attach``)."""
    from ..measure import Variant

    given = options.parameters_from_args(args)
    variants = []
    for name, budget, runs in parse_variants(args.strategies, args.budgets, args.repeats):
        choice = StrategyChoice(name, given)
        if budget is not None:
            choice = choice.with_budget(budget)
        planner = make_planner(choice, resolved.defaults)
        if planner.lossy:
            raise EdgespecError(f"{name} changes the output distribution; bench compares lossless strategies")
        size = getattr(planner, strategies.strategy(name).budget_param)  # the declared sizing field
        key = name if budget is None else f"{name}:{budget}"
        variants.append(Variant(key, name, size, planner, runs))
    return variants


def run(args) -> int:
    from ..measure import document, report

    console = Console() if sys.stdout.isatty() else Console(width=160)  # files and pipes get whole tables
    if args.compare:
        a, b = (document.read_json(path) for path in args.compare)
        table, notes = report.compare(a, b, names=("A", "B"))
        console.print(f"A = {args.compare[0]}\nB = {args.compare[1]}")
        console.print(table)
        for note in notes:
            console.print(f"differs: {note}")
        return 0
    if args.server:
        args.prompts = args.prompts or "quick"
        args.max_tokens = args.max_tokens or QUICK_MAX_TOKENS
        from ..measure.bench_client import measure  # the server's client: httpx, nothing of the models

        check_outputs(args)
        return measure(args.server, args)
    if args.quick:
        args.strategies = args.strategies or QUICK_STRATEGIES
        args.prompts = args.prompts or "quick"
        args.max_tokens = args.max_tokens or QUICK_MAX_TOKENS
    args.strategies = args.strategies or DEFAULT_STRATEGIES
    args.prompts = args.prompts or "all"
    args.max_tokens = args.max_tokens or DEFAULT_MAX_TOKENS
    check(args)
    return _bench(args, console)


def check(args: argparse.Namespace) -> None:
    """What a bench run would otherwise refuse, or fail to write, only after minutes of measuring."""
    checks.check_max_tokens(args.max_tokens)
    if args.warmup_tokens < 0:
        raise EdgespecError(f"--warmup-tokens must be 0 (no warm-up) or more, not {args.warmup_tokens}.")
    check_outputs(args)


def check_outputs(args: argparse.Namespace) -> None:
    for flag, out in (("--json", args.json), ("--plot", args.plot)):
        folder = Path(out).expanduser().resolve().parent if out else None
        if folder is not None and not folder.is_dir():
            raise EdgespecError(f"{flag} {out}: there is no folder {folder} to write it in; create it first.")


def _bench(args: argparse.Namespace, console: Console) -> int:
    from ..measure import BenchConfig, document, report, run_bench, summarise
    from ..measure.prompts import load_prompts
    from ..profile.attach import PairProfile, attach
    from ..profile.like import TIMING_ONLY, keep_like
    from ..profile.store import profile_path
    from ..progress import progress_bar

    cases = load_prompts(args.prompts)
    parse_variants(args.strategies, args.budgets, args.repeats)  # fail on typos before loading the models
    stack = ExitStack()  # --like: the random target's temporary folder, deleted after the pair closes
    resolved, pair, like = _load(args, stack)
    with stack, pair:
        variants = [] if args.profile else build_variants(args, resolved)  # --profile: print it, nothing else
        shown = args.profile or args.reprofile  # measured on every size (``--reprofile``: again)
        # one profile for every variant: measured (or loaded) when the first asks (auto, OPT-Tree, …)
        with PairProfile(
            pair,
            show_progress=True,
            refresh=args.reprofile,
            quick=not shown,
            label="cost profile",
            home=like.scratch if like else None,  # --like: profiles by the temporary file go with it
        ) as pair_profile:
            if shown:
                table = pair_profile.cost_profile()
                console.print(report.profile_table(table))
                console.print(f"[dim]cached in {profile_path(table.key)}[/dim]")
            if args.profile:
                return 0
            for variant in variants:
                attach(variant.planner, pair_profile)
        profile = pair_profile.asked  # None when no planner asked for it
        if profile is not None and like:  # the shape's curves, for the next --like and `models advise`
            profile = keep_like(profile, like.key)
        config = BenchConfig(
            max_tokens=args.max_tokens,
            sampling=options.sampling_params(args),
            warmup_tokens=args.warmup_tokens,
            seed=args.seed if args.seed is not None else 1234,
        )
        runs = 1 + 2 * sum(v.repeats for v in variants)
        with progress_bar(f"bench ({len(cases)} prompts × {runs} runs)") as bar:
            result = run_bench(pair, cases, variants, config, progress=bar)
        settings = pair.settings
        doc = document.document(
            summarise(result),
            pair={
                "name": resolved.name,
                "target": document.model_info(resolved.target_path, _registry_sha(resolved, "target")),
                "draft": document.model_info(resolved.draft_path, _registry_sha(resolved, "draft")),
            },
            settings={
                "quick": bool(args.quick),
                "max_tokens": args.max_tokens,
                "temperature": args.temperature,
                "top_k": args.top_k,
                "top_p": args.top_p,
                "seed": config.seed,
                "prompts": args.prompts,
                "prompt_names": [p.case.name for p in result.prompts],  # fewer when stopped early
                "stopped_early": result.stopped,
                "strategies": [v.key for v in variants],
                "repeats": {v.key: v.repeats for v in variants},
                "warmup_tokens": args.warmup_tokens,
                "warmup_seconds": result.warmup_seconds,
                "n_ctx": settings.n_ctx,
                "max_tree_nodes": settings.max_tree_nodes,
                "repack": settings.repack,
                "reductions": pair.reductions,
                "runs_on": pair.runs_on_json(),
            },
            hardware=document.hardware_info(settings),
            cost_profile=profile.as_dict() if profile is not None else None,
        )
        if like:
            doc["settings"]["like"] = args.like
            document.mark_timing_only(doc, TIMING_ONLY)
    report.print_report(doc, console)
    if args.json:
        document.write_json(doc, args.json)
        console.print(f"[dim]wrote {args.json}[/dim]")
    if args.plot:
        report.plot(doc, args.plot)
        console.print(f"[dim]wrote {args.plot}[/dim]")
    if result.stopped:  # Ctrl-C: what was measured is kept, and the exit status says it was cut short
        console.print(
            f"[yellow]stopped after {len(result.prompts)} of {result.of_prompts} prompts: the figures above"
            f"{' and the files written' if args.json or args.plot else ''} cover those prompts only[/yellow]"
        )
        return 130
    return 0


def _load(args: argparse.Namespace, stack: ExitStack):
    """(resolved pair, loaded pair, None) for the model flags; with ``--like``, the random target's pair
    and its ``LikeRun`` (the temporary folder is ``stack``'s)."""
    from ..profile.like import check_like_models, open_like

    if not args.like:
        return (*options.load(args, need_draft=True), None)
    check_like_models(args.pair, args.target, args.draft)
    like, pair = open_like(args.like, options.engine_settings(args), stack)
    return like.resolved, pair, like


def _registry_sha(resolved, role: str) -> str | None:
    """The registry's sha256 of the pair's model (when the pair came from the registry)."""
    try:
        from ..models.registry import load_registry

        spec = load_registry().pair(resolved.name)
        return getattr(spec, role).sha256
    except Exception:  # noqa: BLE001 - a local file pair has no registry entry
        return None
