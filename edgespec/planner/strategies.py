"""The strategy table: name → planner class, with its parameters read from the planner's own fields.

Every user-facing list of strategies, every parameter flag and every default comes from here (the CLI
builds its flags from ``parameters()``; models.toml entries are checked against it); ``build`` turns a
name and any mix of string (CLI, TOML) and Python values into a planner. Pure: no argparse, no
models — ``edgespec.strategy`` adds what a loaded pair contributes (its defaults, decision model,
cost profile).

``budget`` is common: the most draft tokens a step verifies, root excluded (unmerged tokens for GSD;
a cap on the k-configuration's size for MCSD, where 0 means none). The chain's is its γ: ``budget``
is an alias of ``gamma`` there.

    planner = build("gsd", {"tau": 1, "budget": "24"})   # strings are parsed (CLI, TOML)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .auto import AutoPlanner
from .base import Planner
from .chain import ChainPlanner
from .copy_drafts import HybridPlanner, NGramPlanner
from .dyspec import DySpecPlanner
from .gsd import GSDPlanner
from .mcsd import MCSDPlanner, MCSDTargetInitPlanner
from .opt_tree import OptTreePlanner
from .parallel import ParallelSpecPlanner
from .params import Param, StrategyError, params_of
from .tsd import TSDPlanner


@dataclass(frozen=True)
class Strategy:
    planner: type[Planner]  # a dataclass whose ``param`` fields are the strategy's parameters
    summary: str  # one line for help screens
    paper: str  # where the algorithm comes from
    aliases: Mapping[str, str] = field(default_factory=dict)  # common name → this strategy's own

    @property
    def name(self) -> str:
        return self.planner.name

    @property
    def params(self) -> tuple[Param, ...]:
        return params_of(self.planner)

    @property
    def budget_param(self) -> str:
        """The parameter that sizes the tree (``budget``; the chain's γ)."""
        return self.aliases.get("budget", "budget")

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


_TABLE = (
    Strategy(
        ChainPlanner,
        "one draft token after another (γ per step)",
        "Leviathan et al. 2023; Chen et al. 2023",
        aliases={"budget": "gamma"},
    ),
    Strategy(
        TSDPlanner, "draft tree with probability and sibling pruning", "Gong et al. 2024 (GSD paper), §4"
    ),
    Strategy(
        GSDPlanner, "draft graph: τ-redundant nodes merged and their subtrees shared", "Gong et al. 2024, §5"
    ),
    Strategy(
        OptTreePlanner,
        "the n nodes of largest path probability, deepened while E(A) grows by ≥ δ",
        "Wang et al. 2024 (OPT-Tree)",
    ),
    Strategy(
        DySpecPlanner,
        "greedy dynamic tree: expand the draws of highest estimated acceptance",
        "Xiong et al. 2024 (DySpec), Alg. 1 and 2",
    ),
    Strategy(
        MCSDPlanner,
        "static k-configuration: k_i candidates per node at depth i",
        "Yang et al. 2024; Lu et al. 2024",
    ),
    Strategy(
        NGramPlanner,
        "copies from the conversation (n-gram matches, several per suffix) as the tree; no draft model",
        "edgespec; cf. prompt lookup (Saxena 2023), llama.cpp ngram-simple / ngram-map-k",
    ),
    Strategy(
        HybridPlanner,
        "copies from the conversation and the draft's tree in one token graph, grown by p̂",
        "edgespec: OPT-Tree growth over GSD-style merged copy + draft candidates",
    ),
    Strategy(
        ParallelSpecPlanner,
        "one draft pass reads K [MASK] tokens: K + 1 distributions, the tree is their best product paths",
        "Xiao et al. 2024 (ParallelSpec), Alg. 1 and §4.2",
    ),
    Strategy(
        MCSDTargetInitPlanner,
        "MCSD below the target's own w first tokens; the branch accepted longest wins (lossy)",
        "Lu et al. 2024, §3.1",
    ),
    # `auto` is not a paper's strategy: per step it picks plain decoding or a cost-aware tree from the
    # pair's measured cost curves (without them it decodes plainly).
    Strategy(
        AutoPlanner,
        "plain decoding or a best-first tree sized by the measured cost curves, chosen per step",
        "edgespec (cost profile: `edgespec bench --profile`)",
    ),
)
STRATEGIES: dict[str, Strategy] = {s.name: s for s in _TABLE}
STRATEGY_NAMES: tuple[str, ...] = tuple(name for name in STRATEGIES if name != "auto")  # the papers'
CHOICES: tuple[str, ...] = ("none", *STRATEGY_NAMES, "auto")  # what a user may pick; none: plain decoding


def strategy(name: str) -> Strategy:
    found = STRATEGIES.get(name)
    if found is None:
        raise StrategyError(f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGIES)}")
    return found


def parameters() -> dict[str, list[tuple[str, Param]]]:
    """Parameter name → [(strategy, its Param)], in order of first appearance (one CLI flag each)."""
    table: dict[str, list[tuple[str, Param]]] = {}
    for s in STRATEGIES.values():
        for p in s.params:
            table.setdefault(p.name, []).append((s.name, p))
    return table


PARAM_NAMES: tuple[str, ...] = tuple(parameters())


def build(name: str, params: Mapping[str, Any] | None = None) -> Planner:
    """The planner for strategy ``name``: its defaults, overridden by ``params``.

    Values may be strings (CLI, TOML) or Python values; None means "not set". Aliases are resolved
    (a chain's ``budget`` is its γ); parameters of *other* strategies are ignored (a pair's defaults
    may name several); unknown names are an error.
    """
    chosen = strategy(name)
    given = {key.replace("-", "_"): raw for key, raw in (params or {}).items() if raw is not None}
    for common, own in chosen.aliases.items():
        if common in given:
            alias = given.pop(common)
            given.setdefault(own, alias)  # the strategy's own name wins when both are given
    own_params = {p.name: p for p in chosen.params}
    values = {}
    for key, raw in given.items():
        if key in own_params:
            values[key] = own_params[key].parse(raw)
        elif key not in PARAM_NAMES:
            raise StrategyError(
                f"unknown strategy parameter {key!r}; {name} takes: {', '.join(own_params)}"
                f" (all strategies: {', '.join(PARAM_NAMES)})"
            )
    try:
        return chosen.planner(**values)
    except ValueError as exc:
        raise StrategyError(f"{name}: {exc}") from exc


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
        for s in STRATEGIES.values()
        for p in s.params
    ]
