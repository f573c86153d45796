"""``auto``: speculate only as much as this hardware pays for — and not at all when it does not.

Per step, three parts, each its own module:

1. **calibration** (``calibration``; the copies' ``copies``): the pair's measured cost
   curves, corrected by what steps really took, and how well the draft's and the copies' estimates
   predict what the target accepts — learned from every step through ``observe``;
2. **policy** (``policy``): plain decoding, copies alone, or a draft tree, whichever the cost
   model forecasts the most tokens per second from — overruled by the **guard** (``guard``),
   which compares what speculative steps actually delivered in this answer with plain decoding's
   measured speed, and stops a kind of speculation that loses (retrying it rarely), so that auto
   does not lose to plain decoding even where the cost model is wrong;
3. **tree builder** (``trees``): the chosen tree, sized for the step's best expected rate —
   grown best-first level by level (``growth``, as OPT-Tree and ``hybrid``), or in one ParallelSpec
   pass, or the conversation's copies alone.

``activity`` says what the last step did ("plain", "copying 12 tokens", "speculating 8 tokens");
``describe`` adds why, and how often each was chosen: the chat's status bar shows it as steps run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import params
from ..base import Planner
from ..costmodel import CostModel
from ..inputs import Drafter, DraftSetup, PlanContext, Profile
from ..ngram import Copier
from ..parallel import ADAPTER_HELP
from ..params import param
from ..tree import DraftTree, TreeBuilder
from .acceptance import Acceptance
from .calibration import Calibration
from .copies import CopySteps
from .guard import Guards
from .policy import DRAFTING, MODES, Mode, Policy
from .trees import AutoGrowth, level_tree, one_pass_tree
from .tuning import TUNING

__all__ = ["AutoPlanner"]

ACTIVITY = {
    Mode.PLAIN: "plain",
    Mode.SPECULATE: "speculating {}",
    Mode.PROBE: "probing {}",
    Mode.COPY: "copying {}",
    Mode.PARALLEL: "one-pass tree of {}",
}


@dataclass
class AutoPlanner(Planner):
    budget: int = param(
        48, "most draft tokens per step, root excluded (the cost curves usually pick fewer)", minimum=1
    )
    max_depth: int = param(10, params.MAX_DEPTH + " (draft decodes per step)", minimum=1)
    probe_budget: float = param(
        0.01,
        "most of the time auto may lose to probes that re-check the acceptance rate (fraction)",
        minimum=0,
        maximum=0.5,
    )
    masks: int = param(
        0,
        "K > 0: also weigh ParallelSpec trees drafted in one pass with K [MASK] tokens (0: off)",
        minimum=0,
    )
    adapter: str = param("", ADAPTER_HELP)
    # the pair's measured curves (``prepare``); None → plain decoding
    costs: CostModel | None = field(default=None, compare=False, repr=False)
    name = "auto"
    calibration: Calibration = field(default_factory=Calibration, repr=False)
    copies: CopySteps = field(default_factory=CopySteps, repr=False)  # the copies' r_c, when alone pays
    guards: Guards = field(default_factory=Guards, repr=False)
    copier: Copier = field(default_factory=Copier, repr=False)  # continuations from the conversation
    steps: dict = field(default_factory=lambda: dict.fromkeys(MODES, 0), repr=False)  # steps per mode
    mode: Mode = field(default=Mode.PLAIN, repr=False)  # the last step's
    size: int = field(default=0, repr=False)  # the last step's draft (or copied) tokens
    policy: Policy = field(init=False, repr=False)
    _evidence: str = field(default="plain", repr=False)  # what the last step tells the guard
    _pending: int = field(default=1, repr=False)  # the tokens the last step's draft caught up on
    _new_size: bool = field(default=False, repr=False)  # the last tree's size: not decoded before

    def __post_init__(self) -> None:
        self.policy = Policy(
            self.calibration, self.copies, self.guards, self.budget, self.max_depth, self.masks,
            self.probe_budget,
        )  # fmt: skip
        if self.costs is not None:
            self.calibration.set_costs(self.costs)

    def prepare(self, profile: Profile) -> None:
        """The pair's measured curves (none: no draft, plain decoding) and then its fit: where the
        acceptance curve and the draft's profile start (none: a typical draft's prior)."""
        costs = profile.costs()
        if costs is None:
            return
        self.costs = costs
        self.calibration.set_costs(costs)
        fit = profile.fit()
        if fit is not None:
            self.calibration.set_fit(fit)

    @property
    def acceptance(self) -> Acceptance:
        """The chance a draft guess is right, by the probability the draft gave it."""
        return self.calibration.acceptance

    @property
    def activity(self) -> str:
        """What the last step did: "plain", "copying 12 tokens", "speculating 8 tokens", …"""
        return ACTIVITY[self.mode].format(f"{self.size} token" + ("s" if self.size != 1 else ""))

    def describe(self) -> str:
        """What auto is doing now (the chat's status bar shows it live), why, and how often it drafted."""
        if self.costs is None:
            return "no cost profile yet: plain decoding"
        total = sum(self.steps.values())
        if total == 0:
            return f"budget≤{self.budget}, deciding per step"
        now = f"plain: {self.policy.why}" if self.mode == Mode.PLAIN and self.policy.why else self.activity
        if self.mode == Mode.PLAIN and self.policy.never_drafts and not self.steps[Mode.COPY]:
            return now  # nothing else to tell: plain decoding for good
        drafted = sum(self.steps[mode] for mode in DRAFTING) / total
        return (
            f"{now} (budget≤{self.budget}, a 50 % guess right {self.acceptance.chance(0.5):.0%}, "
            f"speculated {drafted:.0%}, "
            f"copied {self.steps[Mode.COPY] / total:.0%} of steps)"
        )

    @property
    def may_draft(self) -> bool:
        return not self.policy.never_drafts  # copies and plain steps need no draft

    @property
    def may_look_ahead(self) -> bool:
        return self.policy.free_trees_pay  # False where auto never drafts; else: only slows the target

    def draft_setup(self) -> DraftSetup:
        if not self.masks:
            return DraftSetup()
        return DraftSetup(masks=self.masks, adapter="" if self.adapter == "none" else self.adapter)

    # -- a step: calibration → policy → tree ------------------------------------------------------
    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        cap = min(self.budget, ctx.max_nodes - 1)
        pending = len(drafter.pending) or 1  # tokens the draft has yet to decode
        if ctx.fresh:  # a new answer: its own copies, its own evidence, its own probe credit
            self.copies.restart()
            self.guards.restart()
            self.policy.restart()
        trie = self.copier.propose(root_token, ctx)  # free candidates, whatever is decided
        self.mode, copies = self.policy.choose(trie, pending, cap)
        known = self.costs is not None and ctx.prepaid.drafted((root_token,))
        if self.mode == Mode.PLAIN and not self.policy.why and known:
            # the look-ahead decoded this root during the last decode: a tree on what it decoded needs
            # no drafting, and the growth verifies it only where that pays (``AutoGrowth._free``)
            self.mode = Mode.SPECULATE
        self._pending = pending
        self.steps[self.mode] += 1
        self._evidence = {Mode.PLAIN: "plain", Mode.COPY: "copy"}.get(self.mode, "draft")
        if self.mode in DRAFTING and pending > TUNING.catch_up_free:
            self._evidence = "catch-up"  # a one-off cost after plain steps, no evidence about drafting
        tree = self._tree(root_token, drafter, ctx, trie, cap, pending, copies)
        self.size = tree.size - 1
        self._new_size = tree.size not in ctx.prepaid.sizes
        return tree

    def _tree(self, root_token, drafter, ctx, trie, cap: int, pending: int, copies: int) -> DraftTree:
        cal = self.calibration
        if self.mode == Mode.PLAIN:
            return TreeBuilder(root_token).freeze()  # no draft work at all; the draft catches up later
        if self.mode == Mode.COPY:  # no draft work either
            cal.draft_predicted = 0.0
            return self.copier.copy_tree(trie, trie.best(copies))
        costs = cal.effective
        if self.mode == Mode.PARALLEL:
            tree, spent = one_pass_tree(
                root_token, drafter, ctx, costs, self.masks, cap, pending, cal.par_ratio
            )
        else:  # a probe is optimistic: it drafts what would pay if the draft were good, and sees
            probe = self.mode == Mode.PROBE
            prior = np.maximum(cal.profile, TUNING.probe_profile) if probe else cal.profile
            curve = cal.acceptance
            if probe and curve.chance(float(prior[0])) < float(prior[0]):
                curve = Acceptance()  # the draft as good as it says, at least
            # the draft's catch-up and root, unless its look-ahead decoded the root already
            spent = 0.0 if ctx.prepaid.drafted((root_token,)) else float(costs.k(pending))
            growth = AutoGrowth(
                cal.sizing(ctx.prepaid.sizes),
                curve,
                prior,
                cap,
                self.max_depth,
                spent,
                known=ctx.prepaid.drafted,
            )
            tree, spent = level_tree(root_token, drafter, growth, trie, self.copier), growth.spent
        # as profiled: what learn_costs compares with. What the look-ahead decoded is not in it (those
        # nodes are free in every step they are known), so the factor is what drafting costs when paid.
        cal.draft_predicted = spent / cal.draft_factor
        return tree

    # -- learning ---------------------------------------------------------------------------------
    def observe(self, event) -> None:
        """What the step did (a ``StepEvent``): the decoder calls this after every step."""
        self.copier.observe(event.tree, event.accepted_path)  # the copies' acceptance rates
        self.copies.observe(event, copied=self.mode == Mode.COPY)  # the copy steps' r_c
        cal = self.calibration
        evidence: str | None = self._evidence
        if evidence != "plain" and self._new_size and cal.costs is not None and cal.costs.look_ahead:
            # one-off round trips for a batch size new to the target (traced at 20 ms: a process's first
            # 2-token verify 0.63 s, later ones 0.32 s): no evidence either way
            evidence = None
        guess, written = event.guess, event.token_ids
        known = guess is not None and guess.ids.shape[0] > 0 and len(written) > 0
        right = int(guess.ids[0]) == written[0] if known else None  # the free guess of a plain step's token
        if evidence == "draft":
            self.guards.draft_depth = max(event.depth, 1)
        self.guards.observe(evidence, written, event.timings.total, self._pending, right)
        if self.costs is None or self.policy.never_drafts:
            return  # no draft trees for good: nothing else to learn
        self.policy.learn(event, self.mode, self.guards.plain_seconds or cal.plain_decode)
        if event.guess is not None and event.tokens:  # over RPC, a step that drafted nothing: a free guess
            cal.learn_guess(event.guess, event.tokens[0].id)
        if self.mode == Mode.COPY:
            cal.learn_costs(event, self._new_size)  # the batch's cost, not the draft's calibration
        elif event.drafted == 0 and event.draft_decodes == 0:
            cal.learn_plain(event)
        else:
            cal.learn_costs(event, self._new_size)
            if self.mode == Mode.PARALLEL:
                cal.learn_one_pass(event)  # its own calibration: the masks' rows are not the draft's
            else:
                cal.learn_tree(event)
