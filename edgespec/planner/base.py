"""The planner: a drafting strategy's interface and its declared capabilities (``Planner``). What it is
given to plan with is in ``inputs.py``; the tree it returns, in ``tree.py``."""

from __future__ import annotations

from typing import ClassVar

from .inputs import Drafter, DraftSetup, PlanContext, Profile, StepOutcome
from .tree import DraftTree


class Planner:
    """A drafting strategy: grows a tree from the pending root token. Planners are dataclasses that
    derive from this class; their user-settable fields are ``params.param`` fields.

    Capabilities are declared here, with the defaults most planners have, so the decoder, the cost
    profile and the CLI read them instead of guessing:

    - ``needs_draft``: False → never calls the drafter (copies from the context); the pair may have none.
    - ``needs_target_root``: the target decodes the root alone first and ``plan`` gets its candidates as
      ``root_dist`` (mcsd-target-init).
    - ``prepare``: asks the pair's run-time profile for what it needs before it drafts (auto, OPT-Tree,
      n-gram, hybrid: the cost curves; auto also the draft's fit); by default asks for nothing.
    - ``observe``: sees every finished step (planners that learn from outcomes); by default ignores it.
    - ``draft_setup``: the draft model it needs (the plain draft, or a parallel drafter with masks).
    """

    name: ClassVar[str]
    lossy: ClassVar[bool] = False  # True only for variants that change the output distribution
    needs_draft: ClassVar[bool] = True
    needs_target_root: ClassVar[bool] = False

    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        raise NotImplementedError

    @property
    def may_draft(self) -> bool:
        """Whether it may still call the draft model (False: the draft need not keep up with the
        conversation between replies)."""
        return self.needs_draft

    @property
    def may_look_ahead(self) -> bool:
        """Whether the draft should work while a target on RPC servers verifies (``Draft.look_ahead``)."""
        return self.may_draft

    def describe(self) -> str:
        """Short parameter summary for status bars and bench tables, e.g. 'k=4 τ=2 budget=16'."""
        raise NotImplementedError

    def prepare(self, profile: Profile) -> None:
        """Ask the pair's run-time profile for what this planner needs, once, before it drafts (called
        by ``edgespec.profile.attach``). Most planners need nothing: they ask nothing, and nothing is
        measured for them."""

    def observe(self, event: StepOutcome) -> None:
        """Learn from a finished step (its tree, accepted path and timings). Most planners do not."""

    def draft_setup(self) -> DraftSetup:
        """The draft model this planner drafts with (set up by the engine before each answer)."""
        return DraftSetup()
