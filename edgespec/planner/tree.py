"""The data every planner produces and every engine consumes.

A draft tree is rooted at the *pending* token: the token the target chose last, which neither model
has decoded yet. Node 0 is that root; every other node is a drafted token. Parents come before
children (``parents[i] < i``), so a tree can be packed into one llama.cpp batch in index order.

The children of a node are listed in the order they were chosen. That order matters for lossless
verification of several branches: the verifier tries them one after the other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, overload

import numpy as np

if TYPE_CHECKING:
    from .costmodel import CostModel, DraftFit


class ChildRule(IntEnum):
    """How the children of a node were chosen; decides the verification rule that keeps it lossless."""

    NONE = 0  # not expanded (a leaf)
    TOP = 1  # deterministic (top-k of the draft): one-hot rule — accept x with p(x), else p[x] = 0
    SAMPLED = 2  # sampled without replacement from q: residual rule — accept with min(1, p/q)
    LONGEST = 3  # the target's own candidates (mcsd-target-init): keep the one whose subtree is accepted
    # longest — LOSSY: which token is emitted then depends on how well the draft continues it


class SparseDist:
    """The draft's next-token distribution, kept to its top candidates: ``ids`` ((k,) int32 token ids,
    most likely first) and ``probs`` ((k,) float64, descending; read-only).

    ``probs`` are probabilities under the full softmax (so they sum to at most 1), sorted in
    descending order. When the draft *samples*, it samples from ``q = probs / probs.sum()`` — the
    truncated distribution — and the verifier uses that same q, which keeps rejection sampling
    exactly lossless (any draft distribution is fine as long as both sides use the same one).
    """

    __slots__ = ("ids", "probs")

    def __init__(self, ids: np.ndarray, probs: np.ndarray):
        self.ids, self.probs = ids, probs

    def sampling_q(self) -> np.ndarray:
        """q: the distribution the draft samples from (the truncated, renormalised softmax)."""
        return self.probs / self.probs.sum()

    def prob_of(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0


@dataclass(frozen=True)
class PlanStats:
    """What planning cost and what it expects; exposed per step in ``generate --json``."""

    draft_decodes: int = 0  # batched draft decodes (one per level)
    drafted_nodes: int = 0  # nodes the draft model actually evaluated
    merges: int = 0  # GSD: τ-redundant nodes merged into an earlier occurrence
    expected_accept: float = 0.0  # E[A] = Σ p̂ over drafted nodes (predicted accepted draft tokens)


class _Column:
    """A ``DraftTree`` column as a numpy array (dtype ``dtype``), built from its tuple ``source`` on first
    read and kept in the instance, where later reads find it (a non-data descriptor)."""

    def __init__(self, source: str, dtype):
        self.source, self.dtype = source, dtype

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, tree: None, owner: type | None = None) -> _Column: ...
    @overload
    def __get__(self, tree: DraftTree, owner: type | None = None) -> np.ndarray: ...
    def __get__(self, tree: DraftTree | None, owner: type | None = None) -> _Column | np.ndarray:
        if tree is None:  # read on the class: the descriptor itself
            return self
        array = np.asarray(getattr(tree, self.source), dtype=self.dtype)
        tree.__dict__[self.name] = array  # past the frozen dataclass's __setattr__: a cache, not a field
        return array


@dataclass(frozen=True)
class DraftTree:
    """A planner's finished tree. Its columns are tuples of Python numbers — what the step's bookkeeping
    reads between decodes — with numpy arrays of them built on first use (``tokens``, ``parents``, …)
    for the planners and verifiers that compute on whole columns.

    Why both: on a CPU each decode streams the model's weights through the caches and the code after it
    runs cold; there a numpy scalar read or a small reduction costs tens of µs (``depth.max()`` measured
    70 µs right after a target decode, against ~1 µs warm), a tuple read well under one."""

    token_ids: tuple[int, ...]  # token_ids[0] is the pending root token
    parent_ids: tuple[int, ...]  # parent_ids[0] == -1, parent_ids[i] < i
    depths: tuple[int, ...]  # depths[0] == 0
    draft_probs: tuple[float, ...]  # q(token | path to parent) under the draft; 1.0 at the root
    path_probs: tuple[float, ...]  # p̂ = product of draft_prob along the path (root: 1.0)
    merged_flags: tuple[bool, ...]  # GSD: node replicated from a merged subtree, not drafted again
    copied_flags: tuple[bool, ...]  # proposed by copying from the conversation (n-gram match), not the draft
    child_rules: tuple[int, ...]  # ChildRule of each node's children
    dists: dict[int, SparseDist]  # the draft distribution at each expanded node (for the residual rule)
    stats: PlanStats = field(default_factory=PlanStats)
    _children: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        children: list[list[int]] = [[] for _ in self.parent_ids]
        for node in range(1, len(self.parent_ids)):
            children[self.parent_ids[node]].append(node)
        object.__setattr__(self, "_children", tuple(tuple(c) for c in children))

    # The columns as arrays, built once each on first use.
    tokens = _Column("token_ids", np.int32)
    parents = _Column("parent_ids", np.int32)
    depth = _Column("depths", np.int32)
    draft_prob = _Column("draft_probs", np.float64)
    path_prob = _Column("path_probs", np.float64)
    merged = _Column("merged_flags", bool)
    copied = _Column("copied_flags", bool)
    child_rule = _Column("child_rules", np.int8)

    @property
    def size(self) -> int:
        return len(self.token_ids)

    @property
    def height(self) -> int:
        """The deepest node's depth (0 for the root alone)."""
        return max(self.depths)

    def children(self, node: int) -> tuple[int, ...]:
        """Children of ``node`` in the order they were chosen."""
        return self._children[node]

    @property
    def leaves(self) -> list[int]:
        return [node for node, children in enumerate(self._children) if not children]

    def path(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive."""
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = self.parent_ids[node]
        return nodes[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.token_ids[i] for i in self.path(node)]


class TreeBuilder:
    """Mutable tree that planners grow; ``freeze()`` gives the immutable ``DraftTree``."""

    def __init__(self, root_token: int):
        self.tokens: list[int] = [int(root_token)]
        self.parents: list[int] = [-1]
        self.depth: list[int] = [0]
        self.draft_prob: list[float] = [1.0]
        self.path_prob: list[float] = [1.0]
        self.merged: list[bool] = [False]
        self.copied: list[bool] = [False]
        self.child_rule: list[int] = [ChildRule.NONE]
        self.dists: dict[int, SparseDist] = {}

    @property
    def size(self) -> int:
        return len(self.tokens)

    def add(
        self, parent: int, token: int, draft_prob: float, *, merged: bool = False, copied: bool = False
    ) -> int:
        """Append a child of ``parent``; p̂(child) = p̂(parent) · q(token)."""
        if not 0 <= parent < self.size:
            raise ValueError(f"parent {parent} is not a node of this tree (size {self.size})")
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.depth.append(self.depth[parent] + 1)
        self.draft_prob.append(float(draft_prob))
        self.path_prob.append(self.path_prob[parent] * float(draft_prob))
        self.merged.append(bool(merged))
        self.copied.append(bool(copied))
        self.child_rule.append(ChildRule.NONE)
        return self.size - 1

    def set_children_rule(self, node: int, rule: ChildRule) -> None:
        self.child_rule[node] = int(rule)

    def path_tokens(self, node: int) -> list[int]:
        out = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]

    def freeze(self, stats: PlanStats | None = None) -> DraftTree:
        return DraftTree(
            token_ids=tuple(self.tokens),
            parent_ids=tuple(self.parents),
            depths=tuple(self.depth),
            draft_probs=tuple(self.draft_prob),
            path_probs=tuple(self.path_prob),
            merged_flags=tuple(self.merged),
            copied_flags=tuple(self.copied),
            child_rules=tuple(self.child_rule),
            dists=dict(self.dists),
            stats=stats or PlanStats(),
        )


def chain_tree(tokens: Sequence[int]) -> DraftTree:
    """A tree that is one chain: ``tokens[0]`` the root, each next token the child of the one before
    (to time or check verification of a given continuation)."""
    tree = TreeBuilder(tokens[0])
    node = 0
    for token in tokens[1:]:
        node = tree.add(node, token, 1.0)
    return tree.freeze()


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
