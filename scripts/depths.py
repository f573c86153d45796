"""Acceptance by tree depth: how often a step's accepted path reached depth d.

For ParallelSpec, depth 1 comes from the root's own row and depth k + 1 from [MASK]_k's, so the rate
at depth k + 1 over the rate at depth k is how well mask k predicts given the earlier ones held —
the figure training the masks should raise. MAL = 1 + Σ_d P(reached depth d) (the bonus token).

A development tool (lab/scripts/parallel_positions.py measures with it), not part of the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.events import GenerationStats, StepEvent
from edgespec.measure.prompts import PromptCase


@dataclass
class DepthAcceptance:
    """Steps that verified a tree, and how deep their accepted paths went."""

    stats: GenerationStats = field(default_factory=GenerationStats)
    steps: int = 0  # steps that verified a tree (drafted at least one token)
    reached: list[int] = field(default_factory=list)  # [d − 1]: steps whose accepted path reached depth d

    def add(self, event: StepEvent) -> None:
        self.stats.add(event)
        if event.tree is None or event.drafted == 0:
            return
        self.steps += 1
        depth = int(event.tree.depth.max())  # the deepest depth drafted so far gets a rate, even 0
        self.reached.extend([0] * (depth - len(self.reached)))
        for d in range(event.accepted):
            self.reached[d] += 1

    def rates(self) -> list[float]:
        """P(the accepted path reaches depth d), d = 1, 2, … (over steps that verified a tree)."""
        return [count / self.steps for count in self.reached]

    def conditional(self) -> list[float]:
        """P(depth d accepted | depth d − 1 was): how well depth d's distribution (mask d − 1's) predicts
        once the path above it held."""
        above = [self.steps, *self.reached[:-1]]
        return [count / prior if prior else 0.0 for count, prior in zip(self.reached, above)]

    def as_dict(self) -> dict:
        calls = self.stats.target_calls or 1
        return {
            "steps": self.stats.target_calls,
            "tree_steps": self.steps,
            "mal": self.stats.mean_accepted_length,
            "verified_per_step": self.stats.verified_nodes / calls,
            "draft_passes_per_step": self.stats.draft_decodes / calls,
            "reached_by_depth": self.rates(),
            "accepted_given_parent": self.conditional(),
            "tokens_per_second": self.stats.tokens_per_second,
        }


def measure(pair, planner, prompts: Sequence[PromptCase], max_tokens: int = 128) -> DepthAcceptance:
    """Greedy generation of each prompt with ``planner``; the depth acceptance over all of them."""
    out = DepthAcceptance()
    for case in prompts:
        messages = [Message(role, content) for role, content in case.messages]
        tokens, _ = prompt_tokens(pair, messages, ChatSettings(max_tokens=max_tokens))
        for event in generate(pair, planner, Request(prompt=tokens, max_tokens=max_tokens)):
            out.add(event)
    return out


def report(label: str, result: DepthAcceptance) -> str:
    """One line: MAL, verified tokens and draft passes per step, then P(reached depth d) by depth."""
    d = result.as_dict()
    pairs = zip(d["reached_by_depth"], d["accepted_given_parent"])
    depths = " ".join(f"d{i + 1}={r:.2f} ({c:.2f})" for i, (r, c) in enumerate(pairs))
    return (
        f"{label}: MAL {d['mal']:.2f}, verified/step {d['verified_per_step']:.1f}, draft passes/step "
        f"{d['draft_passes_per_step']:.2f}, {d['tokens_per_second']:.1f} tok/s, {d['steps']} steps; "
        f"reached (given the depth above): {depths}"
    )
