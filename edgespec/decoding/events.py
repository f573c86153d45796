"""What the decoding loop yields: small dataclasses, consumed by the CLI, the TUI and the bench."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ..planner.tree import DraftTree, SparseDist


class Provenance(str, Enum):
    DRAFT = "draft"  # a draft token the target accepted
    MERGED = "merged"  # an accepted draft token that came from a GSD-merged (reused) node
    COPIED = "copied"  # an accepted token copied from the conversation (n-gram match): no draft decode
    TARGET = "target"  # chosen by the target itself (correction or bonus token, or plain decoding)


@dataclass(frozen=True)
class EmittedToken:
    id: int
    provenance: Provenance
    margin: float  # target's top-1 minus top-2 logit where this token was decided (fragility)


@dataclass(frozen=True)
class StepTimings:
    """Seconds spent in one step, split by what did the work."""

    draft: float = 0.0  # draft model decodes
    plan: float = 0.0  # planner Python/numpy work besides the draft decodes
    verify: float = 0.0  # the one target decode of the packed tree
    bookkeeping: float = 0.0  # verification rule, KV commit, detokenisation
    # Another cut of the same step, not part of ``total``: its wall time minus the time inside both
    # models' llama_decode calls — what edgespec's own Python/numpy costs per step (batch packing,
    # top-k reduction, planning, verification, KV bookkeeping), whatever the hardware's decode speed.
    python: float = 0.0

    @property
    def total(self) -> float:
        return self.draft + self.plan + self.verify + self.bookkeeping

    def __add__(self, other: StepTimings) -> StepTimings:
        return StepTimings(
            self.draft + other.draft,
            self.plan + other.plan,
            self.verify + other.verify,
            self.bookkeeping + other.bookkeeping,
            self.python + other.python,
        )


@dataclass(frozen=True)
class StepEvent:
    """One target decode's worth of output."""

    tokens: tuple[EmittedToken, ...]  # committed this step, in order (accepted drafts, then the target's)
    text: str  # the text these tokens complete (may lag a token when a UTF-8 character is split)
    drafted: int  # draft tokens proposed (tree size minus the root)
    accepted: int  # draft tokens accepted
    timings: StepTimings
    tree: DraftTree | None = None  # the verified tree (None for plain decoding)
    accepted_path: tuple[int, ...] = ()  # tree node indices of the accepted path, root first
    verified_nodes: int = 1  # tokens in the target's batch
    draft_decodes: int = 0
    reused: int = 0  # drafted nodes the draft had decoded already, looking ahead during the last verify
    # a step that drafted nothing, over RPC: the draft's distribution at the root, decoded meanwhile
    guess: SparseDist | None = None
    depth: int = 0
    leaves: int = 0
    expected_accept: float = 0.0  # planner's E[A] (predicted accepted draft tokens)
    merges: int = 0  # GSD merges in this step's graph
    graph_success: bool = False  # GSD: the accepted path went through a merged node
    finish_reason: str | None = None  # set on the last event: "stop", "length", "cancelled", "context"
    prefill_seconds: float = 0.0  # first event only: decoding the prompt into both caches
    cached_tokens: int = 0  # first event only: prompt tokens the target's cache held already (not decoded)
    committed: int = 0  # tokens the step committed, before cuts at end-of-turn or max tokens

    @property
    def token_ids(self) -> list[int]:
        return [t.id for t in self.tokens]


@dataclass
class GenerationStats:
    """Running totals over a generation (the numbers `generate --json` and the status bar show)."""

    tokens: int = 0
    committed: int = 0  # tokens committed by the target decodes (shown ones + end-of-turn/cut ones)
    target_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    verified_nodes: int = 0
    draft_decodes: int = 0
    merges: int = 0
    graph_successes: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of those, the ones the target's cache held (prompt_tokens − this were decoded)
    dropped_messages: int = 0  # earlier turns left out to fit the context window
    prefill_seconds: float = 0.0
    timings: StepTimings = field(default_factory=StepTimings)

    def add(self, event: StepEvent) -> None:
        self.tokens += len(event.tokens)
        self.committed += max(event.committed, len(event.tokens))
        self.target_calls += 1
        self.drafted += event.drafted
        self.accepted += event.accepted
        self.verified_nodes += event.verified_nodes
        self.draft_decodes += event.draft_decodes
        self.merges += event.merges
        self.graph_successes += int(event.graph_success)
        self.prefill_seconds += event.prefill_seconds
        self.cached_tokens += event.cached_tokens
        self.timings = self.timings + event.timings

    @property
    def mean_accepted_length(self) -> float:
        """MAL: tokens committed per target decode (1.0 for plain decoding)."""
        return self.committed / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        total = self.timings.total
        return self.tokens / total if total > 0 else 0.0

    def as_dict(self) -> dict:
        t = self.timings
        return {
            "tokens": self.tokens,
            "committed": self.committed,
            "tokens_per_second": self.tokens_per_second,
            "target_calls": self.target_calls,
            "mean_accepted_length": self.mean_accepted_length,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "verified_nodes": self.verified_nodes,
            "draft_decodes": self.draft_decodes,
            "merges": self.merges,
            "graph_successes": self.graph_successes,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "dropped_messages": self.dropped_messages,
            "prefill_seconds": self.prefill_seconds,
            "time_split": {
                "draft": t.draft,
                "plan": t.plan,
                "verify": t.verify,
                "bookkeeping": t.bookkeeping,
                "total": t.total,
                "python": t.python,
            },
        }
