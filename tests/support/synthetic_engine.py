"""A synthetic engine for the decoder's own step (``decoding.decoder.speculative_step``): Markov models
instead of llama.cpp, and a virtual clock that the decodes advance by a cost model's seconds.

    engine = SyntheticEngine(target_p, draft_dists, costs)      # target_p: (V, V) p(· | previous token)
    with engine.clock.running():                                # the decoder's perf_counter is the clock
        step = engine.step(planner, root, params, rng)          # plan → verify → decide → commit → observe

The target's row after a node is log p(· | the node's token); the decoder turns it into the target's
sampling distribution (temperature, top-K, top-P: ``engine.rows.target_probs``) itself. The draft's
distribution after a node is ``draft_dists[token]``. Each decode advances the clock by the cost
curves' seconds — c_t(n) for a verify of n tokens, c_d(m) for a draft level of m nodes, c_k(n) for the
draft's catch-up on n pending tokens — so the step's timings are those a machine with these curves
would measure (planning takes no time), deterministic, and the same for ``observe``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from unittest import mock

import numpy as np

from edgespec.decoding import decoder
from edgespec.decoding.sampling import SamplingParams
from edgespec.engine import ports
from edgespec.engine.rows import RowsVerified
from edgespec.engine.sampled import SampledVerified
from edgespec.engine.samplers import kept_per_row
from edgespec.planner.costmodel import CostModel
from edgespec.planner.tree import DraftTree, SparseDist, TreeBuilder


@dataclass
class VirtualClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    @contextmanager
    def running(self) -> Iterator[VirtualClock]:
        """The decoder reads this clock instead of ``time.perf_counter`` (for its step timings)."""
        with mock.patch.object(decoder, "perf_counter", self):
            yield self


@dataclass
class _Ctx:
    decode_seconds: float = 0.0  # the model's time inside its decodes (a running total)


class _Vocab:
    """Token a reads as the text "<a>"; none ends a turn."""

    def piece(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def is_eog(self, token: int) -> bool:
        return False


class SyntheticTarget:
    """The ``ports.Target`` over a Markov target: its output after a node is ``RowsVerified`` of the
    logits rows of the nodes' tokens — or, ``backend``, a ``SampledVerified`` of what llama.cpp's top-k
    sampler would return for them (``_top_k_unordered``), k as ``engine.Target.use_sampling`` chooses."""

    def __init__(self, p: np.ndarray, costs: CostModel, clock: VirtualClock, backend: bool = False):
        self.logits = np.log(p).astype(np.float32)  # row a: the target's logits after token a
        self.costs, self.clock, self.ctx = costs, clock, _Ctx()
        self.backend = backend
        self._kept: int | None = None  # ids the emulated sampler keeps per row (None: whole rows)
        self.model = _Vocab()
        self.committed: list[int] = []
        self.turn_tokens: frozenset[int] = frozenset()
        self.sizes_decoded: set[int] = set()  # as ``engine.Target``'s

    @property
    def n_ctx(self) -> int:
        return 1 << 30

    @property
    def llama_seconds(self) -> float:
        return self.ctx.decode_seconds

    def _decode(self, n: int) -> None:
        self.sizes_decoded.add(n)
        seconds = float(self.costs.t(n))
        self.clock.now += seconds
        self.ctx.decode_seconds += seconds

    def use_sampling(self, sampling: ports.Sampling) -> None:
        self._kept = kept_per_row(sampling) if self.backend else None

    def _out(self, tokens: Sequence[int]) -> ports.Verified:
        rows = self.logits[np.asarray(tokens)]
        if self._kept is None:
            return RowsVerified(rows)
        return SampledVerified(*_top_k_unordered(rows, self._kept), rows.shape[1])

    def start_prefill(self, prompt: Sequence[int], cancel=None) -> ports.Pending[ports.Prefilled]:
        self._decode(len(prompt))
        self.committed = list(prompt)
        return ports.Pending.ready(ports.Prefilled(self._out(prompt[-1:]), 0))

    def decode_root(self, root: int) -> ports.Verified:
        self._decode(1)
        self.committed.append(int(root))
        return self._out([root])

    def start_verify(
        self, tree: DraftTree, root: ports.Verified | None = None
    ) -> ports.Pending[ports.Verified]:
        """Over at once (a target on this machine: nothing overlaps its decode)."""
        if tree.size == 1 and root is None:  # plain decoding: committed at once
            return ports.Pending.ready(self.decode_root(tree.token_ids[0]))
        self._decode(tree.size - (root is not None))
        return ports.Pending.ready(self._out(tree.token_ids))

    def commit(self, tree: DraftTree, path: Sequence[int], root_committed: bool = False) -> None:
        if tree.size > 1:
            self.committed.extend(tree.token_ids[node] for node in path[int(root_committed) :])


def _top_k_unordered(rows: np.ndarray, k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per row its k best ids and their logits in no particular order, as ggml's top-k returns them
    (here: best last)."""
    best = np.argsort(rows, axis=1, kind="stable")[:, -k:]
    ids = [row.astype(np.int32) for row in best]
    return ids, [row[i] for row, i in zip(rows, ids)]


class SyntheticDraft:
    """The ``ports.Draft`` over a Markov draft, with the engine's catch-up: tokens the target committed that
    the draft has not decoded are decoded with the next root (c_k(pending) seconds)."""

    def __init__(self, dists: Sequence[SparseDist], costs: CostModel, clock: VirtualClock):
        self.dists, self.costs, self.clock, self.ctx = dists, costs, clock, _Ctx()
        self.top_k = max(d.ids.shape[0] for d in dists)
        self.vocab_limit = len(dists)
        self.pending: list[int] = []
        self.decode_seconds, self.decodes = 0.0, 0
        self._decoded: set[tuple[int, ...]] = set()  # token paths decoded this step

    def _decode(self, seconds: float) -> None:
        self.clock.now += seconds
        self.ctx.decode_seconds += seconds
        self.decode_seconds += seconds
        self.decodes += 1

    @property
    def llama_seconds(self) -> float:
        return self.ctx.decode_seconds

    @property
    def work(self) -> ports.DraftWork:
        return ports.DraftWork(self.decode_seconds, self.decodes)  # no look-ahead: the target is here

    def piece(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def defer(self, tokens: Sequence[int]) -> int:
        self.pending = [int(t) for t in tokens]
        return 0

    def drop_ahead(self) -> None:
        pass

    def begin_step(self, temperature: float) -> None:
        self.decode_seconds, self.decodes, self._decoded = 0.0, 0, set()

    def known(self, path: Sequence[int]) -> bool:
        return False  # no look-ahead here

    def expand(self, tree: TreeBuilder, nodes: Sequence[int]) -> list[SparseDist]:
        if list(nodes) == [0]:  # the root, with the draft's catch-up on what it has not decoded
            self._decode(float(self.costs.k(len(self.pending))))
            self.pending = []
        else:
            self._decode(float(self.costs.d(len(nodes))))
        out = []
        for node in nodes:
            self._decoded.add(tuple(tree.path_tokens(node)))
            tree.dists[node] = self.dists[tree.tokens[node]]
            out.append(tree.dists[node])
        return out

    def parallel_dists(self, tree: TreeBuilder, k: int) -> list[SparseDist]:
        """The draft after the root, then after its own likeliest token at each of k depths."""
        self._decode(float(self.costs.k(len(self.pending) + k)))
        self.pending = []
        dists = [self.dists[tree.tokens[0]]]
        for _ in range(k):
            dists.append(self.dists[int(dists[-1].ids[0])])
        return dists

    def commit(self, tree: DraftTree, path: Sequence[int], next_token: int) -> None:
        """As ``engine.Draft.commit``: the decoded prefix of the accepted path stays, the rest is pending."""
        tokens = [tree.token_ids[node] for node in path]
        if not self._decoded:  # nothing drafted: the old root is still pending too
            self.pending.extend(tokens[1:] + [int(next_token)])
            return
        decoded = 0
        while decoded < len(tokens) - 1 and tuple(tokens[: decoded + 2]) in self._decoded:
            decoded += 1
        self.pending = tokens[1 + decoded :] + [int(next_token)]


@dataclass
class SyntheticEngine:
    """The ``ports.Pair`` over the synthetic target and draft."""

    p: np.ndarray  # (V, V) the target's p(· | previous token)
    draft_dists: Sequence[SparseDist]  # [a]: the draft after token a
    costs: CostModel  # the machine's (true) cost curves, which the clock follows
    nodes: int = 64  # the largest tree (``max_nodes``)
    clock: VirtualClock = field(default_factory=VirtualClock)
    backend: bool = False  # the target's outputs as llama.cpp's backend samplers give them

    def __post_init__(self) -> None:
        self.target = SyntheticTarget(self.p, self.costs, self.clock, self.backend)
        self.draft = SyntheticDraft(self.draft_dists, self.costs, self.clock)

    @property
    def max_nodes(self) -> int:
        return self.nodes

    def set_up_draft(self, setup) -> None:
        assert not setup.masks, "the synthetic draft drafts level by level only"

    def overlap(self, tree: DraftTree, pending) -> None:
        pass  # a target on this machine: nothing overlaps its decode

    def reset(self, history: Sequence[int], root: int) -> None:
        """The conversation before ``root`` is in both caches; the draft has yet to decode the root."""
        self.target.committed = list(history)
        self.draft.pending = [int(root)]

    def step(self, planner, root: int, params: SamplingParams, rng: np.random.Generator, fresh: bool = False):
        """One step of the decoder's own loop (call inside ``clock.running()``)."""
        return decoder.speculative_step(self, planner, root, params, rng, self.max_nodes, fresh=fresh)

    def answer(self, planner, prompt: Sequence[int], steps: int, params: SamplingParams, seed: int = 0):
        """``steps`` steps of one answer to ``prompt`` (its last token the first root; ``planner`` None:
        plain decoding): the committed tokens and the virtual seconds the steps took."""
        rng = np.random.default_rng(seed)
        self.reset(prompt[:-1], prompt[-1])
        root, tokens, start = int(prompt[-1]), [], self.clock.now
        with self.clock.running():
            for i in range(steps):
                if planner is None:
                    step = decoder.plain_step(self.target, root, params, rng)
                else:
                    step = self.step(planner, root, params, rng, fresh=i == 0)
                tokens += [t.id for t in step.tokens]
                root = step.next_root
        return tokens, self.clock.now - start
