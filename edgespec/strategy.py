"""From a user's strategy choice to a running planner: the one path `generate`, `chat`, `bench`,
`tune` and `serve` share.

A ``StrategyChoice`` is what the user picked (a name and the parameters given: CLI flags, the TUI's
dialog). ``make_planner`` turns it into a ready planner for a resolved pair: the strategy's defaults,
under the pair's defaults from models.toml (its budget only for its own recommended strategy), under
the choice; aliases resolved (a chain's budget is its γ); the pair's decision model found for
``--early-stop model``. Nothing here loads or measures: the caller then gives the planner the loaded
pair's profile (``edgespec.profile.attach``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .models.drafters import shipped_adapter
from .models.pairs import PairDefaults  # what a pair contributes to its planners (models.toml)
from .models.paths import decision_model_path
from .planner import strategies
from .planner.base import Planner

CHOICES = strategies.CHOICES  # "none" (plain decoding), the papers' strategies, "auto"


@dataclass(frozen=True)
class StrategyChoice:
    """A drafting strategy and the parameters the user gave (``budget``: draft tokens per step)."""

    name: str  # a strategy name, or "none" for plain decoding
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def budget(self) -> int | None:
        """The tree size given, under the strategy's own name for it (a chain's γ) or ``budget``."""
        names = (
            ("budget",)
            if self.name not in strategies.STRATEGIES
            else (
                strategies.strategy(self.name).budget_param,
                "budget",
            )
        )
        for name in names:
            if self.params.get(name) is not None:
                return int(self.params[name])
        return None

    def with_budget(self, budget: int | None) -> StrategyChoice:
        own = strategies.strategy(self.name).budget_param if self.name in strategies.STRATEGIES else "budget"
        params = {k: v for k, v in self.params.items() if k not in ("budget", own)}
        if budget is not None:
            params["budget"] = budget
        return StrategyChoice(self.name, params)


def needs_draft(name: str) -> bool:
    """Whether strategy ``name`` drafts with the draft model (not plain decoding, nor copying): the
    planner's own declaration, so a draft is loaded only when it will be used."""
    return name != "none" and strategies.strategy(name).planner.needs_draft


def planner_params(choice: StrategyChoice, pair: PairDefaults) -> dict[str, Any]:
    """The parameters ``choice`` runs with: the pair's defaults, then the choice's own values."""
    params = {k: v for k, v in pair.params.items() if k != "budget"}
    if choice.name == pair.strategy and pair.params.get("budget") is not None:
        params["budget"] = pair.params["budget"]  # a chain's γ is not a tree's n: only for its own pick
    params.update({k.replace("-", "_"): v for k, v in choice.params.items() if v is not None})
    if params.get("early_stop") == "model" and not params.get("early_stop_model"):
        # the pair's own decision model, trained by `edgespec tune`
        path = decision_model_path(pair.name)
        if path.is_file():
            params["early_stop_model"] = str(path)
    takes_adapter = "adapter" in {p.name for p in strategies.strategy(choice.name).params}
    if takes_adapter and not params.get("adapter") and pair.draft_sha256:
        # ParallelSpec: the parallel drafter trained for the pair's draft, shipped in the package
        shipped = shipped_adapter(pair.draft_sha256)
        if shipped is not None:
            params["adapter"] = str(shipped.path)
    return params


def make_planner(choice: StrategyChoice, pair: PairDefaults) -> Planner | None:
    """The planner for ``choice`` on ``pair`` (None for plain decoding), not prepared yet: planners that
    use the pair's cost curves or fit get them from ``edgespec.profile.attach.attach``."""
    if choice.name == "none":
        return None
    return strategies.build(choice.name, planner_params(choice, pair))
