"""Strategy parameters, declared once: on the planner's own dataclass fields.

A planner field that users may set is written with ``param``::

    budget: int = param(16, "most draft tokens verified per step, root excluded", minimum=1)

which is an ordinary dataclass field (its default is the planner's default) carrying a ``Param`` in
its metadata: the name (as in the paper, snake_case), kind, limits and help. The strategy table
(``strategies``), the CLI flags, models.toml checks and the docs all read them from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import EdgespecError


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


KINDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    # kind → (how help and errors name the type, parser from a CLI string or a TOML value)
    "int": ("int", int),
    "float": ("float", float),
    "choice": ("text", str),
    "k_config": ("k-config, e.g. 4,2,2,1", parse_k_config),
    "path": ("path", str),
}


@dataclass(frozen=True)
class Param:
    name: str  # the planner's field, as in the paper; the CLI flag is --name-with-dashes
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
        return KINDS[self.kind][0]

    def parse(self, value: Any) -> Any:
        """A checked value from a CLI string, a TOML value or a Python value; raises StrategyError."""
        if value is None:
            return None
        try:
            parsed = KINDS[self.kind][1](value)
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


def _kind_of(default: Any, choices: tuple[str, ...]) -> str:
    if choices:
        return "choice"
    for kind, python_type in (("int", int), ("float", float), ("k_config", tuple), ("path", str)):
        if type(default) is python_type:
            return kind
    raise TypeError(f"give the kind of a parameter whose default is {default!r}")


def param(
    default: Any,
    help: str,
    *,
    kind: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] = (),
) -> Any:
    """A dataclass field that is a user-settable strategy parameter (its name comes from the field)."""
    spec = dict(kind=kind or _kind_of(default, choices), help=help, minimum=minimum, maximum=maximum)
    return dataclasses.field(default=default, metadata={"param": {**spec, "choices": choices}})


def params_of(planner_class: type) -> tuple[Param, ...]:
    """The user-settable parameters of a planner dataclass, in field order."""
    return tuple(
        Param(name=f.name, default=f.default, **f.metadata["param"])
        for f in dataclasses.fields(planner_class)
        if "param" in f.metadata
    )


# Help shared by several strategies' fields (each planner still writes its own default).
BUDGET = "most draft tokens verified per step, root excluded"
K = "maximum out-degree: the draft's top-k children per expanded node"
THETA_PROB = "θ_prob: a child with draft probability below it becomes a leaf"
THETA_SIB = "θ_sib: a child below θ_sib × its best sibling's probability becomes a leaf"
MAX_DEPTH = "maximum drafting steps (tree levels)"
NGRAM_MAX = "longest suffix matched against the conversation"
MATCHES = "earlier occurrences (continuations) looked up per step"
MU = (
    "μ: draft level time / target step time (default: measured from the pair's cost profile, "
    "c_d(level size) / c_t(n + 1); 0.15 without one)"
)
EARLY_STOP = (
    "stop drafting when every branch's predicted acceptance < β: threshold (the draft probability) or "
    "model (the decision model)"
)
BETA = "β: the early-stop threshold"
EARLY_STOP_MODEL = "decision model (.npz) for --early-stop model (default: the pair's, from `edgespec tune`)"
