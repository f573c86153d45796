"""Options shared by `generate`, `bench`, `chat`, `serve` and `tune`: which models, how to run them,
how to sample, which strategy. The CLI side of the one path: flags are generated from the strategy
table, and parsed arguments become engine settings, a resolved pair and a ``StrategyChoice``
(``edgespec.strategy.make_planner`` does the rest)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .decoding.checks import check_sampling
from .decoding.sampling import SamplingParams
from .engine.pair import EngineSettings, reductions_from_env
from .errors import EdgespecError
from .models.pairs import ResolvedPair, open_pair, resolve_pair
from .planner import strategies
from .planner.params import KINDS
from .strategy import CHOICES, StrategyChoice


def add_run_args(parser: argparse.ArgumentParser, strategy: bool = True) -> None:
    """The flags of every command that runs a pair: models, sampling and (``strategy``) the strategy
    with its parameters (bench and tune choose strategies their own way and add the flags they take)."""
    add_model_args(parser)
    add_sampling_args(parser)
    if strategy:
        add_strategy_args(parser)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("models")
    group.add_argument("--pair", help="model pair from the registry (default: the bundled pair)")
    group.add_argument("--target", help="target model: a registry name or a local .gguf path")
    group.add_argument("--draft", help="draft model: a registry name or a local .gguf path")
    group.add_argument("--ctx", type=int, default=4096, help="context window in tokens (default 4096)")
    group.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    for model in ("target", "draft"):
        group.add_argument(
            f"--{model}-gpu-layers",
            type=gpu_layers,
            default="auto",
            help=f"{model} layers offloaded to the GPU: auto (the default: the draft whole first, then as "
            "many target layers as fit in free GPU memory; none without a GPU), a count, or -1 (all)",
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
    group.add_argument(
        "--flash-attn",
        choices=("auto", "on", "off"),
        default="auto",
        help="llama.cpp's fused attention (auto, the default: off for a model wholly on the CPU, whose "
        "trees verify faster without it, llama.cpp's choice with GPU layers; on: less memory at long "
        "contexts — the 1.5B's buffers at --ctx 32768: 97 MiB instead of 848)",
    )
    group.add_argument(
        "--reductions",
        choices=("auto", "numpy", "backend"),
        default=None,
        help="where the target's output rows are reduced: numpy (whole rows copied), backend (llama.cpp's "
        "samplers in the decode; numpy on RPC servers) or auto (the default: backend where the target has "
        "GPU layers, numpy on a CPU; default: $EDGESPEC_REDUCTIONS, else auto)",
    )
    add_rpc_args(parser)


def add_rpc_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the target across machines (llama.cpp RPC; see `edgespec rpc-server`)")
    group.add_argument(
        "--rpc",
        metavar="HOST:PORT[,…]",
        help="RPC servers that hold the target's layers with this machine, which keeps its share, the output "
        "layer and the logits; the draft stays here (default: $EDGESPEC_RPC, else the pair's models.toml "
        "entry; 'none': this machine only)",
    )
    group.add_argument(
        "--tensor-split",
        type=_shares,
        default=(),
        metavar="X,Y,…",
        help="the target's share per device: each RPC server's devices in --rpc order, then this machine's "
        "(0: no layers here); default: by free memory",
    )
    group.add_argument(
        "--rpc-timeout",
        type=_seconds,
        default=120.0,
        metavar="SECONDS",
        help="longest a call to the RPC servers may take before they count as lost (default 120)",
    )


def _shares(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers like 3,1,1") from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def rpc_servers(args: argparse.Namespace) -> tuple[str, ...] | None:
    """``--rpc``, else ``$EDGESPEC_RPC``: the servers named (checked when the pair loads), () for
    'none', None when neither is set (the pair's models.toml entry decides)."""
    text = getattr(args, "rpc", None)
    text = text if text is not None else os.environ.get("EDGESPEC_RPC") or None
    if text is None:
        return None
    if text.strip().lower() == "none":
        return ()
    return tuple(p.strip() for p in text.split(",") if p.strip())


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
    group.add_argument("--strategy", choices=CHOICES, default=default, help=f"default: {default}")
    add_parameter_flags(group, strategies.STRATEGIES)


_METAVARS = {"int": "N", "float": "X", "k_config": "K,K,…", "path": "PATH"}
BUDGET_FLAG_HELP = (
    "most draft tokens verified per step, root excluded (chain: γ; gsd: unmerged tokens; opt-tree: n; "
    "mcsd: a cap on the k-configuration, 0 = none)"
)


def _format_default(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if value is None or value == "":
        return "unset"
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_parameter_flags(parser, among=None) -> None:
    """One ``--flag`` per parameter name of the strategies ``among`` (default: all), from the
    planners' own fields (default None: "not given"); the help names the strategies it applies to
    and their defaults."""
    names = set(among or strategies.STRATEGIES)
    for name, owners in strategies.parameters().items():
        owners = [(strategy, p) for strategy, p in owners if strategy in names]
        if not owners:
            continue
        param = owners[0][1]
        defaults: dict[str, list[str]] = {}
        for strategy, p in owners:
            defaults.setdefault(_format_default(p.default), []).append(strategy)
        where = "; ".join(f"{'/'.join(names)}: {value}" for value, names in defaults.items())
        text = f"{BUDGET_FLAG_HELP if name == 'budget' else param.help} [{where}]".replace("%", "%%")
        parser.add_argument(
            param.flag,
            dest=name,
            default=None,
            type=str if param.kind == "k_config" else KINDS[param.kind][1],
            choices=param.choices or None,
            metavar=None if param.choices else _METAVARS[param.kind],
            help=text,
        )


def parameters_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The strategy parameters given on the command line (unset flags left out)."""
    return {
        name: getattr(args, name) for name in strategies.PARAM_NAMES if getattr(args, name, None) is not None
    }


def strategy_choice(args: argparse.Namespace, name: str | None = None) -> StrategyChoice:
    """``--strategy`` (or ``name``) with the parameters given on the command line."""
    return StrategyChoice(name or args.strategy, parameters_from_args(args))


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The sampling flags, checked as the server and the chat app check them (``SettingError``)."""
    check_sampling(args.temperature, args.top_p, args.top_k, args.seed)
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def check_model_flags(args: argparse.Namespace) -> None:
    """``--pair``, ``--target`` and ``--draft`` name one pair: a draft goes with a target, and a pair
    is not given beside models (neither is silently dropped)."""
    pair, target, draft = (getattr(args, name, None) for name in ("pair", "target", "draft"))
    if draft and not target:
        raise EdgespecError(
            "--draft needs --target too: give both model files or names, or --pair NAME alone "
            "for a pair from the registry (`edgespec models list`)."
        )
    if pair and target:
        raise EdgespecError(
            f"--pair {pair} and --target name two different pairs: give --pair alone, or --target "
            "with --draft."
        )


def gpu_layers(text: str) -> int | str:
    """A ``--*-gpu-layers`` value: ``auto`` or a whole number from -1."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be auto, -1 (all) or a number of layers, not {text!r}"
        ) from None


def engine_settings(args: argparse.Namespace) -> EngineSettings:
    """The engine flags as settings; every command that loads a pair asks for them first, so the
    model flags are checked here too (``check_model_flags``)."""
    check_model_flags(args)
    return EngineSettings(
        n_ctx=args.ctx,
        target_gpu_layers=args.target_gpu_layers,
        draft_gpu_layers=args.draft_gpu_layers,
        threads=args.threads,
        max_tree_nodes=args.max_tree_nodes,
        repack=not args.no_repack,
        flash_attn={"auto": None, "on": True, "off": False}[args.flash_attn],
        reductions=args.reductions or reductions_from_env(),
        rpc=rpc_servers(args),
        tensor_split=args.tensor_split,
        rpc_timeout=args.rpc_timeout,
    )


def resolve(args: argparse.Namespace, need_draft: bool = True) -> ResolvedPair:
    """The model files ``--pair`` / ``--target`` / ``--draft`` name (assembling bundled ones)."""
    check_model_flags(args)
    return resolve_pair(args.pair, args.target, args.draft, need_draft)


def load(args: argparse.Namespace, need_draft: bool = True):
    """(resolved pair, loaded ``ModelPair``) for the arguments."""
    resolved = resolve(args, need_draft)
    return resolved, open_pair(resolved, engine_settings(args))
