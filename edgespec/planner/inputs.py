"""What a planner is given, and its seeded draws: the draft model (``Drafter``), the step's context
(``PlanContext``, with what RPC ``Prepaid``), the pair's run-time profile (``Profile``), the finished step it
may learn from (``StepOutcome``), the draft model it may ask for (``DraftSetup``); ``node_rng``,
``step_seed`` and ``sample_without_replacement`` draw so that verification stays lossless.

All declared here, in the planner layer, as Protocols: what implements them (the engine's draft, the
decoder's events, ``edgespec.profile``) sits above it. ``Planner`` itself is in ``tree.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from .costmodel import CostModel, DraftFit
    from .tree import DraftTree, SparseDist, TreeBuilder


class StepOutcome(Protocol):
    """What ``Planner.observe`` sees of a finished step: the decoder's ``StepEvent``, as far as planners
    read it (declared here: the planners sit below the loop that makes the events)."""

    @property
    def drafted(self) -> int: ...  # draft tokens proposed (tree size minus the root)
    @property
    def accepted(self) -> int: ...  # draft tokens accepted
    @property
    def timings(self) -> Any: ...  # the step's seconds: ``.total``, ``.draft``, ``.verify``, …
    @property
    def tree(self) -> DraftTree | None: ...  # the verified tree (None for plain decoding)
    @property
    def accepted_path(self) -> tuple[int, ...]: ...  # tree node indices of the accepted path, root first
    @property
    def verified_nodes(self) -> int: ...  # tokens in the target's batch
    @property
    def draft_decodes(self) -> int: ...
    @property
    def expected_accept(self) -> float: ...  # the planner's E[A]
    @property
    def depth(self) -> int: ...  # the verified tree's height
    @property
    def guess(self) -> SparseDist | None: ...  # a step that drafted nothing: the draft's guess of its token
    @property
    def token_ids(self) -> list[int]: ...


class Drafter(Protocol):
    """The draft model as planners see it.

    ``expand`` evaluates the given nodes in **one** batched draft decode and returns, for each, the
    draft's distribution over the next token given the path to that node. Every node's parent must
    have been expanded by an earlier call (this is what makes drafting level by level). The
    distributions are also stored in ``tree.dists``.
    """

    @property
    def pending(self) -> Sequence[int]: ...  # committed tokens the draft has yet to decode (its root's cost)

    def expand(self, tree: TreeBuilder, nodes: Sequence[int]) -> list[SparseDist]: ...

    def piece(self, token: int) -> bytes:
        """The text of ``token`` as the draft's vocabulary spells it (UTF-8 bytes: maybe part of a
        character). The worked example of a new draft capability (docs/architecture.md)."""
        ...

    def parallel_dists(self, tree: TreeBuilder, k: int) -> list[SparseDist]:
        """ParallelSpec: one draft decode of the root and k [MASK] tokens after it; the k + 1
        distributions of depths 1 … k + 1 (the root's row, then [MASK]_1 … [MASK]_k's). Called on a
        tree holding only the root, instead of ``expand``; nothing is stored in ``tree.dists``."""
        ...


def _nothing_drafted(path: Sequence[int]) -> bool:
    return False


@dataclass(frozen=True)
class Prepaid:
    """Work done before this step that makes parts of it cheaper than the cost curves say: what a
    planner that prices its tree (auto) takes off the price. Where the target runs on RPC servers the
    draft decodes while the target verifies (its look-ahead), and the first decode of a batch size pays
    one-off round trips (ggml's RPC client asks each server what every new matrix product needs)."""

    # the draft's distribution after this token path (root first) is at hand: expanding it costs no decode
    drafted: Callable[[Sequence[int]], bool] = _nothing_drafted
    sizes: Collection[int] = frozenset()  # batch sizes the target has decoded before (read-only)


class Profile(Protocol):
    """The pair's run-time profile on this machine, as ``Planner.prepare`` may ask for it (declared
    here: the planners sit below what measures it; ``edgespec.profile.attach.PairProfile`` is the one
    over a loaded pair). Each part is measured on first ask (then cached per pair and machine), so a
    planner that asks for nothing costs nothing."""

    def costs(self) -> CostModel | None:
        """The pair's measured cost curves c_t(n), c_d(n), c_k(n) (None: no draft to measure them with)."""
        ...

    def fit(self) -> DraftFit | None:
        """How well the draft predicts the target, measured once per pair (None: nothing to measure it
        on, or no draft)."""
        ...


@dataclass(frozen=True)
class PlanContext:
    """Per-step inputs a planner may use besides the drafter."""

    sampling: bool  # True when the target samples (temperature > 0): children must then be drawn so
    # that a lossless rule exists (sampled from q, or deterministic with the one-hot rule)
    rng: np.random.Generator
    max_nodes: int = 256  # hard cap from the engine (sequence / batch limits), root included
    # The conversation so far, before the root: system prompt, earlier turns, the prompt, the answer so
    # far (the target's committed tokens, not copied: read it during ``plan`` only). Within a request it
    # only grows; ``fresh`` marks a request's first step, where it may differ anywhere from the last one.
    history: Sequence[int] = ()
    fresh: bool = True
    # End-of-turn and chat-template tokens: a copy never runs past one (what follows it in the history
    # is the next turn, not what this answer will say).
    turn_tokens: frozenset[int] = frozenset()
    prepaid: Prepaid = Prepaid()  # over RPC: what the draft decoded meanwhile, the sizes paid for
    # mcsd-target-init (``Planner.needs_target_root``): the target decoded the root alone first; its
    # candidates after the root, which the root's children are taken from
    root_dist: SparseDist | None = None


@dataclass(frozen=True)
class DraftSetup:
    """What a planner needs the draft model to be for it: the plain draft (the default), or a
    parallel drafter (ParallelSpec) with ``masks`` [MASK] tokens per pass and, when trained, the GGUF
    LoRA ``adapter`` that taught it to read them ("": untrained masks)."""

    masks: int = 0
    adapter: str = ""


def node_rng(step_seed: int, path: Sequence[int]) -> np.random.Generator:
    """The random stream of one tree node: a function of the step's seed and the node's token path only,
    so draws do not depend on the order in which a planner visits nodes (DySpec; any planner whose
    draws must not depend on that order — planners that draw in one fixed order may simply use
    ``ctx.rng``, whose draws are fresh whatever else used it).

    The seed words must be unambiguous. numpy pads a seed with zero words, so ``[seed, *path]`` gives a
    depth-1 node whose token id is 0 the root's own stream (issue 11) — its draws are then correlated
    with the draws that decide whether it is accepted, and verification is no longer lossless. Here the
    words are: the step seed as two fixed 32-bit words, the path's length, then every id + 1. Distinct
    (seed, path) give distinct word lists, and the last word is never 0, so no two pad to the same.
    """
    if not 0 <= step_seed < 2**64:
        raise ValueError(f"step seed {step_seed} is not a 64-bit unsigned integer")
    words = [step_seed & 0xFFFFFFFF, step_seed >> 32, len(path), *(int(t) + 1 for t in path)]
    return np.random.default_rng(words)


def step_seed(ctx: PlanContext) -> int:
    """One seed per planning step, from the decoder's generator; the nodes' streams derive from it."""
    return int(ctx.rng.integers(2**63))


def sample_without_replacement(dist: SparseDist, k: int, rng: np.random.Generator) -> list[int]:
    """Draw up to k distinct positions of ``dist`` sequentially from q, removing each one drawn.

    The i-th draw is from q with the earlier draws removed and renormalised — the order the
    residual verification rule (DySpec Alg. 3, SpecInfer) undoes.
    """
    q = dist.sampling_q().copy()
    chosen: list[int] = []
    for _ in range(min(k, int(np.count_nonzero(q)))):
        cdf = np.cumsum(q)  # inverse-CDF draw from the remaining (unnormalised) q
        j = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), q.shape[0] - 1)
        chosen.append(j)
        q[j] = 0.0
    return chosen
