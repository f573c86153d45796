"""MCSD — multi-candidate speculative decoding with a static k-configuration (Yang et al. 2024), and
the target-initialised variant with early stopping (Lu et al. 2024).

**Static (``mcsd``).** A k-configuration (k_1, k_2, …) gives every node at depth i−1 exactly k_i
children: drawn without replacement from the draft's q when the target samples (verified with the
residual rule, ``ChildRule.SAMPLED``), the top k_i when it is greedy (``ChildRule.TOP``). One draft
decode per level. Default (4, 2, 2, 1), the configuration Lu et al. found best (§4.1). A level is cut
short by ``budget`` (or the context's node limit), and a node gets fewer children when its
distribution has fewer than k_i candidates.

**Target-initialised (``mcsd-target-init``, the paper's (w, k_1, k_2, …)); LOSSY.** The target
decodes the root alone first (the paper's "one more target forward pass"; the decoder does this for a
planner that ``needs_target_root`` and passes its candidates as ``PlanContext.root_dist``); its w most
likely tokens (greedy), or w tokens sampled from its distribution, become the root's children, and
the draft grows the k-configuration below each. The verifier checks every branch below its target
token with the usual rules and keeps the branch accepted longest (``ChildRule.LONGEST``). Which first
token is emitted then depends on how well the draft continues it — the output is no longer the
target's (the paper's Table 1; under greedy the emitted token may not be the target's argmax).

**Early stop (§3.3).** Before each draft decode below the first level, every branch's acceptance is
predicted; if all predictions are below β (0.4 in the paper), drafting stops. ``threshold``: the
prediction is the node's own draft probability; ``model``: a ``DecisionModel`` on the features of
the distribution the node was drawn from (its top-k probabilities, entropy, the chosen probability).

The paper's sliced topology-aware mask (§3.2) is not built here: the planners only output the tree.
The engine turns any tree into llama.cpp sequence ids and positions and caches that layout per tree
shape (``edgespec.engine.layout``), so a recurring k-configuration, stopped early or not, costs its
layout once.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import EdgespecError
from . import params
from .base import Planner
from .earlystop import DecisionModel, feature_matrix
from .inputs import Drafter, PlanContext, sample_without_replacement
from .params import param
from .tree import ChildRule, DraftTree, PlanStats, SparseDist, TreeBuilder

EARLY_STOP_MODES = ("off", "threshold", "model")


def _load_decision_model(path: str) -> DecisionModel:
    if not path:
        raise ValueError(
            "--early-stop model needs a decision model: train one for the pair with `edgespec tune`, "
            "or pass --early-stop-model PATH (an .npz)"
        )
    try:
        return DecisionModel.load(path)
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"cannot load the early-stop model {path}: {exc}") from exc


# -- planners ---------------------------------------------------------------------------------------
@dataclass
class MCSDPlanner(Planner):
    k_config: tuple[int, ...] = param((4, 2, 2, 1), "children per node at each depth", minimum=1)
    early_stop: str = param("off", params.EARLY_STOP, choices=EARLY_STOP_MODES)
    beta: float = param(0.4, params.BETA, minimum=0, maximum=1)
    early_stop_model: str = param("", params.EARLY_STOP_MODEL)
    budget: int = param(
        0, "cap on draft tokens per step, root excluded (0: the k-configuration's size)", minimum=0
    )
    # the decision model for early_stop="model" (loaded from early_stop_model unless given)
    model: DecisionModel | None = field(default=None, compare=False, repr=False)
    name = "mcsd"

    def __post_init__(self) -> None:
        self.k_config = tuple(int(k) for k in self.k_config)
        if not self.k_config or any(k < 1 for k in self.k_config):
            raise ValueError(f"k_config needs at least one level and every k ≥ 1, got {self.k_config}")
        if self.early_stop not in EARLY_STOP_MODES:
            raise ValueError(
                f"early_stop must be one of {', '.join(EARLY_STOP_MODES)}, got {self.early_stop!r}"
            )
        if self.early_stop == "model" and self.model is None:
            self.model = _load_decision_model(self.early_stop_model)

    @property
    def full_config(self) -> tuple[int, ...]:
        """Children per level of the full tree, root level first."""
        return self.k_config

    def describe(self) -> str:
        text = "k=" + "×".join(str(k) for k in self.full_config)
        if self.early_stop != "off":
            text += f" early-stop={self.early_stop} β={self.beta:g}"
        return text + (f" budget={self.budget}" if self.budget > 0 else "")

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        tree = TreeBuilder(root_token)
        rng = ctx.rng if ctx.sampling else None
        decodes, evaluated = self._grow(tree, [0], self.k_config, drafter, rng, self._cap(ctx))
        return self._finish(tree, decodes, evaluated)

    # -- shared by both variants --------------------------------------------------------------------
    def _cap(self, ctx: PlanContext) -> int:
        cap = ctx.max_nodes - 1
        return min(self.budget, cap) if self.budget > 0 else cap

    @staticmethod
    def _children(
        tree: TreeBuilder, node: int, dist: SparseDist, k: int, rng: np.random.Generator | None, cap: int
    ) -> list[int]:
        """Give ``node`` up to k children from ``dist``: drawn without replacement from q when sampling
        (``rng`` given: the decoder's stream; the draws are fresh, whatever else used it), else the top k."""
        if rng is not None:
            picks, rule = sample_without_replacement(dist, k, rng), ChildRule.SAMPLED
        else:
            picks, rule = list(range(min(k, int(np.count_nonzero(dist.probs > 0.0))))), ChildRule.TOP
        added = []
        for pos in picks[: max(0, cap - (tree.size - 1))]:  # a prefix of the draws stays a valid draw
            added.append(tree.add(node, int(dist.ids[pos]), float(dist.probs[pos])))
        if added:
            tree.set_children_rule(node, rule)
        return added

    def _grow(
        self,
        tree: TreeBuilder,
        level: list[int],
        config: Sequence[int],
        drafter: Drafter,
        rng: np.random.Generator | None,
        cap: int,
    ) -> tuple[int, int]:
        """Expand ``level`` and its descendants by ``config``, one draft decode per level.

        The first level (the root, or the target's own tokens) is always expanded; early stopping
        applies to the draft's tokens below it.
        """
        decodes = evaluated = 0
        for i, k in enumerate(config):
            if not level or tree.size - 1 >= cap:
                break
            if i > 0 and self._stop_early(tree, level):
                break
            level = level[: cap - (tree.size - 1)]  # a node that cannot get a child is not worth evaluating
            dists = drafter.expand(tree, level)
            decodes, evaluated = decodes + 1, evaluated + len(level)
            nxt = []
            for node, dist in zip(level, dists):
                nxt.extend(self._children(tree, node, dist, k, rng, cap))
            level = nxt
        return decodes, evaluated

    @property
    def _decision_model(self) -> DecisionModel:
        """``model``, which ``__post_init__`` loads for ``early_stop="model"``."""
        if self.model is None:
            raise RuntimeError("mcsd: early_stop='model' without a decision model (set after construction?)")
        return self.model

    def predicted_acceptance(self, tree: TreeBuilder, nodes: Sequence[int]) -> np.ndarray:
        """(len(nodes),) each branch's predicted acceptance, as the early-stop mode defines it."""
        if self.early_stop == "model":
            drawn_from = [tree.dists[tree.parents[u]] for u in nodes]  # the distribution each node came from
            x = feature_matrix(drawn_from, [tree.draft_prob[u] for u in nodes])
            return self._decision_model.predict_proba(x)
        return np.asarray([tree.draft_prob[u] for u in nodes])  # "threshold": the node's draft probability

    def _stop_early(self, tree: TreeBuilder, level: Sequence[int]) -> bool:
        if self.early_stop == "off":
            return False
        return bool(np.all(self.predicted_acceptance(tree, level) < self.beta))

    @staticmethod
    def _finish(tree: TreeBuilder, decodes: int, evaluated: int) -> DraftTree:
        stats = PlanStats(
            draft_decodes=decodes, drafted_nodes=evaluated, expected_accept=sum(tree.path_prob[1:])
        )
        return tree.freeze(stats)


@dataclass
class MCSDTargetInitPlanner(MCSDPlanner):
    # draft levels below the target's tokens: (2, 4, 3, 1, 1) in all
    k_config: tuple[int, ...] = param(
        (4, 3, 1, 1), "draft children per node at each depth below the target's own", minimum=1
    )
    w: int = param(2, "w: candidates the target's own distribution supplies at the root", minimum=1)
    name = "mcsd-target-init"
    lossy = True
    needs_target_root = True  # tells the decoder to decode the root first and pass ctx.root_dist

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.w < 1:
            raise ValueError(f"w must be ≥ 1, got {self.w}")

    @property
    def full_config(self) -> tuple[int, ...]:
        return (self.w, *self.k_config)

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        root_dist = ctx.root_dist
        if root_dist is None:
            raise EdgespecError(
                "mcsd-target-init needs the target's distribution after the root token "
                "(PlanContext.root_dist); this decoder does not provide it — use --strategy mcsd instead."
            )
        tree = TreeBuilder(root_token)
        drafter.expand(tree, [0])  # the draft must still decode the root; its own q is not used here
        tree.dists[0] = root_dist  # the distribution the root's children are taken from
        rng, cap = (ctx.rng if ctx.sampling else None), self._cap(ctx)
        level = self._children(tree, 0, root_dist, self.w, rng, cap)  # the target's top w, or w draws
        if level:
            tree.set_children_rule(0, ChildRule.LONGEST)  # the verifier keeps the longest accepted branch
        decodes, evaluated = self._grow(tree, level, self.k_config, drafter, rng, cap)
        return self._finish(tree, decodes + 1, evaluated + 1)
