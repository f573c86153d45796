"""Strategy name → planner, and the table of every strategy's parameters.

The table is the single source of truth for parameter names (as in the papers), types, defaults and
help: the CLI generates its ``--k --tau --budget …`` flags from it (``add_parameter_flags``), models.toml
entries are checked against it, and ``make_planner`` builds a planner from any mix of the two.

``budget`` is common: the most draft tokens a step verifies, root excluded (unmerged tokens for GSD;
a cap on the k-configuration's size for MCSD, where 0 means none). The chain planner has γ instead.

    planner = make_planner("gsd", {"tau": 1, "budget": "24"})   # strings are parsed (CLI, TOML)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import EdgespecError
from .auto import AutoPlanner
from .chain import ChainPlanner
from .copy_drafts import HybridPlanner, NGramPlanner
from .dyspec import DySpecPlanner
from .earlystop import DecisionModel
from .gsd import GSDPlanner
from .mcsd import EARLY_STOP_MODES, MCSDPlanner, MCSDTargetInitPlanner
from .opt_tree import OptTreePlanner
from .tree import Planner
from .tsd import TSDPlanner


class StrategyError(EdgespecError):
    """An unknown strategy, or a parameter that is unknown or out of range."""


def parse_k_config(value: Any) -> tuple[int, ...]:
    """``"4,2,2,1"``, ``"4x2x2x1"``, ``"4×2×2×1"`` or a sequence of ints → (4, 2, 2, 1)."""
    if isinstance(value, str):
        parts = value.replace("×", ",").replace("x", ",").replace(" ", "").split(",")
        return tuple(int(p) for p in parts if p)
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


_KINDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    # kind → (how the table names the type, parser from a CLI string or a TOML value)
    "int": ("int", int),
    "float": ("float", float),
    "choice": ("text", str),
    "k_config": ("k-config, e.g. 4,2,2,1", parse_k_config),
    "path": ("path", str),
}


@dataclass(frozen=True)
class Param:
    name: str  # as in the paper, snake_case: the planner's field and the CLI flag (--theta-prob)
    kind: str  # int | float | choice | k_config | path
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def type_name(self) -> str:
        return _KINDS[self.kind][0]

    def parse(self, value: Any) -> Any:
        """A checked value from a CLI string, a TOML value or a Python value; raises StrategyError."""
        if value is None:
            return None
        try:
            parsed = _KINDS[self.kind][1](value)
        except (TypeError, ValueError) as exc:
            raise StrategyError(f"{self.flag}: {value!r} is not a valid {self.type_name}") from exc
        numbers = parsed if self.kind == "k_config" else [parsed] if self.kind in ("int", "float") else []
        bad = []
        for number in numbers:
            if self.minimum is not None and number < self.minimum:
                bad.append(f"≥ {self.minimum:g}")
            if self.maximum is not None and number > self.maximum:
                bad.append(f"≤ {self.maximum:g}")
        if bad:
            limits = " and ".join(sorted(set(bad)))
            raise StrategyError(f"{self.flag}: {value!r} is out of range (must be {limits})")
        if self.kind == "k_config" and not parsed:
            raise StrategyError(f"{self.flag}: give at least one level, e.g. 4,2,2,1")
        if self.choices and parsed not in self.choices:
            raise StrategyError(f"{self.flag}: {value!r} is not one of {', '.join(self.choices)}")
        return parsed


@dataclass(frozen=True)
class Strategy:
    name: str
    summary: str  # one line for help screens
    paper: str  # where the algorithm comes from
    params: tuple[Param, ...]
    build: Callable[[dict[str, Any]], Planner]
    lossy: bool = False

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}


BUDGET_HELP = "most draft tokens verified per step, root excluded"
BUDGET_FLAG_HELP = (
    "most draft tokens verified per step, root excluded (gsd: unmerged tokens; opt-tree: n; "
    "mcsd: a cap on the k-configuration, 0 = none)"
)
_METAVARS = {"int": "N", "float": "X", "k_config": "K,K,…", "path": "PATH"}


def _budget(default: int, help: str = BUDGET_HELP, minimum: int = 1) -> Param:
    return Param("budget", "int", default, help, minimum=minimum)


def _k(default: int = 4) -> Param:
    return Param(
        "k", "int", default, "maximum out-degree: the draft's top-k children per expanded node", minimum=1
    )


_THETA_PROB = Param(
    "theta_prob",
    "float",
    0.2,
    "θ_prob: a child with draft probability below it becomes a leaf",
    minimum=0,
    maximum=1,
)
_THETA_SIB = Param(
    "theta_sib",
    "float",
    0.3,
    "θ_sib: a child below θ_sib × its best sibling's probability becomes a leaf",
    minimum=0,
    maximum=1,
)
_MAX_DEPTH = Param("max_depth", "int", 10, "maximum drafting steps (tree levels)", minimum=1)
_EARLY_STOP = Param(
    "early_stop",
    "choice",
    "off",
    "stop drafting when every branch's predicted acceptance < β: "
    "threshold (the draft probability) or model (the decision model)",
    choices=EARLY_STOP_MODES,
)
_BETA = Param("beta", "float", 0.4, "β: the early-stop threshold", minimum=0, maximum=1)
_NGRAM_MAX = Param("ngram_max", "int", 8, "longest suffix matched against the conversation", minimum=1)
_MATCHES = Param("matches", "int", 8, "earlier occurrences (continuations) looked up per step", minimum=1)
_STOP_MODEL = Param("early_stop_model", "path", "", "decision model (.npz) for --early-stop model")


def _load_model(values: dict[str, Any]) -> DecisionModel | None:
    if values["early_stop"] != "model":
        return None
    path = values["early_stop_model"]
    if not path:
        raise StrategyError(
            "--early-stop model needs a decision model: train one for the pair with `edgespec tune`, "
            "or pass --early-stop-model PATH (an .npz)"
        )
    try:
        return DecisionModel.load(path)
    except (OSError, KeyError, ValueError) as exc:
        raise StrategyError(f"cannot load the early-stop model {path}: {exc}") from exc


def _mcsd(values: dict[str, Any]) -> Planner:
    return MCSDPlanner(
        k_config=values["k_config"],
        early_stop=values["early_stop"],
        beta=values["beta"],
        budget=values["budget"],
        model=_load_model(values),
    )


def _mcsd_target_init(values: dict[str, Any]) -> Planner:
    return MCSDTargetInitPlanner(
        w=values["w"],
        k_config=values["k_config"],
        early_stop=values["early_stop"],
        beta=values["beta"],
        budget=values["budget"],
        model=_load_model(values),
    )


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "chain",
            "one draft token after another (γ per step)",
            "Leviathan et al. 2023; Chen et al. 2023",
            (
                Param("gamma", "int", 4, "γ: draft tokens per step", minimum=1),
                Param(
                    "p_min",
                    "float",
                    0.0,
                    "stop drafting when the draft's probability of its token is below it (0: off)",
                    minimum=0,
                    maximum=1,
                ),
            ),
            lambda v: ChainPlanner(gamma=v["gamma"], p_min=v["p_min"]),
        ),
        Strategy(
            "tsd",
            "draft tree with probability and sibling pruning",
            "Gong et al. 2024 (GSD paper), §4",
            (_k(), _THETA_PROB, _THETA_SIB, _MAX_DEPTH, _budget(32)),
            lambda v: TSDPlanner(**v),
        ),
        Strategy(
            "gsd",
            "draft graph: τ-redundant nodes merged and their subtrees shared",
            "Gong et al. 2024, §5",
            (
                _k(),
                Param(
                    "tau",
                    "int",
                    2,
                    "τ: a node whose last τ path tokens already end at an earlier node is merged into it",
                    minimum=1,
                ),
                _THETA_PROB,
                _THETA_SIB,
                _MAX_DEPTH,
                _budget(32, "most verified (unmerged) draft tokens per step, root excluded"),
            ),
            lambda v: GSDPlanner(**v),
        ),
        Strategy(
            "opt-tree",
            "the n nodes of largest path probability, deepened while E(A) grows by ≥ δ",
            "Wang et al. 2024 (OPT-Tree)",
            (
                _budget(24, "n: draft tokens in the tree, root excluded"),
                Param(
                    "mu",
                    "float",
                    None,
                    "μ: draft level time / target step time (default: measured per level from the "
                    "pair's cost profile, c_d(level size) / c_t(n + 1); 0.15 without one)",
                    minimum=0,
                ),
                Param("delta", "float", None, "δ: stop deepening when E(A) grows by less (default: μ)"),
                _MAX_DEPTH,
            ),
            lambda v: OptTreePlanner(**v),
        ),
        Strategy(
            "dyspec",
            "greedy dynamic tree: expand the draws of highest estimated acceptance",
            "Xiong et al. 2024 (DySpec), Alg. 1 and 2",
            (
                _budget(32),
                Param(
                    "threshold",
                    "float",
                    0.0,
                    "t: 0 → fixed budget (Alg. 1); > 0 → draw every slot of value ≥ t, "
                    "layer by layer (Alg. 2)",
                    minimum=0,
                    maximum=1,
                ),
            ),
            lambda v: DySpecPlanner(**v),
        ),
        Strategy(
            "mcsd",
            "static k-configuration: k_i candidates per node at depth i",
            "Yang et al. 2024; Lu et al. 2024",
            (
                Param("k_config", "k_config", (4, 2, 2, 1), "children per node at each depth", minimum=1),
                _EARLY_STOP,
                _BETA,
                _STOP_MODEL,
                _budget(
                    0,
                    "cap on draft tokens per step, root excluded (0: the k-configuration's size)",
                    minimum=0,
                ),
            ),
            _mcsd,
        ),
        Strategy(
            "ngram",
            "copies from the conversation (n-gram matches, several per suffix) as the tree; no draft model",
            "edgespec; cf. prompt lookup (Saxena 2023), llama.cpp ngram-simple / ngram-map-k",
            (
                _budget(16, "most copied tokens verified per step, root excluded"),
                _NGRAM_MAX,
                _MATCHES,
                Param(
                    "min_accept",
                    "float",
                    0.1,
                    "copies with estimated acceptance p̂ below it are left out (without a cost profile)",
                    minimum=0,
                    maximum=1,
                ),
            ),
            lambda v: NGramPlanner(**v),
        ),
        Strategy(
            "hybrid",
            "copies from the conversation and the draft's tree in one token graph, grown by p̂",
            "edgespec: OPT-Tree growth over GSD-style merged copy + draft candidates",
            (
                _budget(24, "most draft + copied tokens verified per step, root excluded"),
                _k(),
                _MAX_DEPTH,
                _NGRAM_MAX,
                _MATCHES,
                Param(
                    "mu",
                    "float",
                    None,
                    "μ: draft step time / target step time (default: measured, from the pair's "
                    "cost profile; 0.15 without one)",
                    minimum=0,
                ),
            ),
            lambda v: HybridPlanner(**v),
        ),
        Strategy(
            "mcsd-target-init",
            "MCSD below the target's own w first tokens; the branch accepted longest wins (lossy)",
            "Lu et al. 2024, §3.1",
            (
                Param(
                    "w",
                    "int",
                    2,
                    "w: candidates the target's own distribution supplies at the root",
                    minimum=1,
                ),
                Param(
                    "k_config",
                    "k_config",
                    (4, 3, 1, 1),
                    "draft children per node at each depth below them",
                    minimum=1,
                ),
                _EARLY_STOP,
                _BETA,
                _STOP_MODEL,
                _budget(
                    0, "cap on draft tokens per step, root excluded (0: the configuration's size)", minimum=0
                ),
            ),
            _mcsd_target_init,
            lossy=True,
        ),
    )
}

STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)

# `auto` is not a paper's strategy: per step it picks plain decoding or a cost-aware tree from the pair's
# measured cost curves (attached by `edgespec.costs.attach`; without them it decodes plainly).
AUTO = Strategy(
    "auto",
    "plain decoding or a best-first tree sized by the measured cost curves, chosen per step",
    "edgespec (cost profile: `edgespec bench --profile`)",
    (
        _budget(48, "most draft tokens per step, root excluded (the cost curves usually pick fewer)"),
        _MAX_DEPTH,
        Param(
            "probe_budget",
            "float",
            0.01,
            "most of the time auto may lose to probes that re-check the acceptance rate (fraction)",
            minimum=0,
            maximum=0.5,
        ),
    ),
    lambda v: AutoPlanner(**v),
)
_WITH_AUTO: dict[str, Strategy] = {**STRATEGIES, AUTO.name: AUTO}


def _all_params() -> dict[str, list[tuple[str, Param]]]:
    """Parameter name → [(strategy, its Param)], in order of first appearance."""
    table: dict[str, list[tuple[str, Param]]] = {}
    for strategy in _WITH_AUTO.values():
        for p in strategy.params:
            table.setdefault(p.name, []).append((strategy.name, p))
    return table


PARAM_NAMES: tuple[str, ...] = tuple(_all_params())


def make_planner(name: str, params: Mapping[str, Any] | None = None) -> Planner:
    """The planner for strategy ``name``: its defaults, overridden by ``params``.

    Values may be strings (CLI, TOML) or Python values; None means "not set". Parameters of *other*
    strategies are ignored (a pair's defaults may name several), unknown names are an error.
    """
    strategy = _WITH_AUTO.get(name)
    if strategy is None:
        raise StrategyError(f"unknown strategy {name!r}; choose one of: {', '.join(_WITH_AUTO)}")
    params = {key.replace("-", "_"): raw for key, raw in (params or {}).items()}
    if name == "chain" and params.get("gamma") is None and params.get("budget") is not None:
        params["gamma"] = params.pop("budget")  # a chain's budget is its γ (pair defaults, --budget)
    values = strategy.defaults
    for key, raw in params.items():
        if raw is None:
            continue
        if key not in values:
            if key in PARAM_NAMES:
                continue  # another strategy's parameter
            raise StrategyError(
                f"unknown strategy parameter {key!r}; {name} takes: {', '.join(values)}"
                f" (all strategies: {', '.join(PARAM_NAMES)})"
            )
        values[key] = strategy.param(key).parse(raw)
    try:
        return strategy.build(values)
    except ValueError as exc:
        raise StrategyError(f"{name}: {exc}") from exc


def needs_draft(name: str) -> bool:
    """Whether strategy ``name`` drafts with the draft model (``ngram`` copies and needs none): the
    planner's own declaration, so the CLI and the TUI load a draft only when it will be used."""
    return make_planner(name).needs_draft


def parameter_table() -> list[dict[str, Any]]:
    """One row per (strategy, parameter): strategy, name, flag, type, default, help — for docs and --help."""
    return [
        {
            "strategy": s.name,
            "name": p.name,
            "flag": p.flag,
            "type": p.type_name,
            "default": p.default,
            "help": p.help,
        }
        for s in _WITH_AUTO.values()
        for p in s.params
    ]


def _format_default(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if value is None or value == "":
        return "unset"
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_parameter_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """One ``--flag`` per parameter name (default None: "not given"); the help names the strategies it
    applies to and their defaults."""
    for name, owners in _all_params().items():
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
            type=str if param.kind == "k_config" else _KINDS[param.kind][1],
            choices=param.choices or None,
            metavar=None if param.choices else _METAVARS[param.kind],
            help=text,
        )


def parameters_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The strategy parameters given on the command line (unset flags left out)."""
    return {name: getattr(args, name) for name in PARAM_NAMES if getattr(args, name, None) is not None}
