"""Options shared by `generate`, `bench`, `chat` and `tune`: which models, how to run them, how to sample,
which strategy. Turns parsed arguments into engine settings, a loaded pair and a planner."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .engine.pair import EngineSettings
from .errors import EdgespecError
from .planner import registry as strategies
from .sampling import SamplingParams

STRATEGY_NAMES = ("none", *strategies.STRATEGY_NAMES, "auto")


def add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("models")
    group.add_argument("--pair", help="model pair from the registry (default: the bundled pair)")
    group.add_argument("--target", help="target model: a registry name or a local .gguf path")
    group.add_argument("--draft", help="draft model: a registry name or a local .gguf path")
    group.add_argument("--ctx", type=int, default=4096, help="context window in tokens (default 4096)")
    group.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    group.add_argument(
        "--target-gpu-layers", type=int, default=0, help="target layers offloaded to the GPU (-1: all)"
    )
    group.add_argument(
        "--draft-gpu-layers", type=int, default=0, help="draft layers offloaded to the GPU (-1: all)"
    )
    group.add_argument(
        "--max-tree-nodes",
        type=int,
        default=64,
        help="largest draft tree per step (≤ 255; sets the sequence count)",
    )
    group.add_argument(
        "--no-repack",
        action="store_true",
        help="turn off llama.cpp's CPU weight repacking (slower; the first row of a batch of up to 8 "
        "tokens then computes like a single token)",
    )


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    group.add_argument("--top-k", type=int, default=0, help="0 disables")
    group.add_argument("--top-p", type=float, default=1.0, help="1 disables")
    group.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")


def add_strategy_args(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    group = parser.add_argument_group(
        "strategy",
        "parameters are named as in the papers; unset ones use the "
        "pair's defaults from models.toml, then the paper's",
    )
    group.add_argument("--strategy", choices=STRATEGY_NAMES, default=default, help=f"default: {default}")
    strategies.add_parameter_flags(group)


def needs_draft(strategy: str) -> bool:
    """Whether ``--strategy`` needs the draft model loaded (not for plain decoding, nor for copying)."""
    return strategy != "none" and strategies.needs_draft(strategy)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def engine_settings(args: argparse.Namespace) -> EngineSettings:
    return EngineSettings(
        n_ctx=args.ctx,
        target_gpu_layers=args.target_gpu_layers,
        draft_gpu_layers=args.draft_gpu_layers,
        threads=args.threads,
        max_tree_nodes=args.max_tree_nodes,
        repack=not args.no_repack,
    )


@dataclass(frozen=True)
class ResolvedPair:
    name: str
    target_path: str
    draft_path: str | None
    strategy_defaults: dict  # from models.toml: {"strategy": ..., "budget": ..., params...}


def resolve_pair(args: argparse.Namespace, need_draft: bool = True) -> ResolvedPair:
    """Model files for the arguments, assembling or checking them in the store as needed."""
    from .store import ModelStore

    store = ModelStore()
    if args.target:
        if need_draft and not args.draft:
            raise EdgespecError(
                "--target needs --draft too (or use --strategy none for plain decoding, or ngram to copy "
                "from the conversation)."
            )
        target = str(store.ensure(args.target))
        draft = str(store.ensure(args.draft)) if need_draft and args.draft else None
        return ResolvedPair(f"{args.target}+{args.draft}", target, draft, {})
    target_path, draft_path, spec = store.ensure_pair(args.pair)
    defaults = {"strategy": spec.strategy, "budget": spec.budget, **dict(spec.params)}
    return ResolvedPair(spec.name, str(target_path), str(draft_path) if need_draft else None, defaults)


def open_pair(args: argparse.Namespace, need_draft: bool = True):
    from .engine.pair import ModelPair

    resolved = resolve_pair(args, need_draft)
    return resolved, ModelPair(resolved.target_path, resolved.draft_path, engine_settings(args))


def make_planner(args: argparse.Namespace, resolved: ResolvedPair, strategy: str | None = None, pair=None):
    """The planner for ``--strategy`` (None for plain decoding), CLI flags over the pair's defaults.

    With the loaded ``pair``, ``auto`` gets the pair's cost profile (measured once, then cached);
    without it, ``auto`` decodes plainly.
    """
    name = strategy or args.strategy
    if name == "none":
        return None
    params = {k: v for k, v in resolved.strategy_defaults.items() if k != "strategy"}
    if name != resolved.strategy_defaults.get("strategy"):
        # the pair's budget is for its recommended strategy (a chain's γ is not a tree's n)
        params.pop("budget", None)
    params.update(strategies.parameters_from_args(args))
    if params.get("early_stop") == "model" and not params.get("early_stop_model"):
        from .tune import decision_model_path  # the pair's model from `edgespec tune`, if trained

        if decision_model_path(resolved.name).is_file():
            params["early_stop_model"] = str(decision_model_path(resolved.name))
    planner = strategies.make_planner(name, params)
    if pair is not None:
        from .costs import attach

        attach(planner, pair, show_progress=True)
    return planner
