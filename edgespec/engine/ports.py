"""The seam between the decoding loop and the models: what ``decoding.decoder`` may ask of them.

The loop reaches the models only through these Protocols (checked by mypy in ``scripts/test.sh``, with
tests/unit/test_ports.py naming the implementations):
``Pair`` (a target, maybe a draft), ``Target`` (verifies a tree in one decode) and ``Draft`` (the
planners' ``Drafter`` plus its bookkeeping between steps). The engine's classes implement them
(``runners.Target``, ``draft.Draft``, ``pair.ModelPair``); so do the tests' fakes.

A target decode returns a ``Pending`` at once: over RPC the decode runs on the link's worker while
the caller works (the draft looks ahead, ``Pair.overlap``); here it is over before ``start_*`` returns.
Its result is a ``Verified``: the target's choice at each decoded node — argmax and margin, the
sampling distribution, the best candidates — reduced where the engine chooses (numpy over llama.cpp's
logits rows: ``rows.RowsVerified``; llama.cpp's samplers in the decode: ``sampled.SampledVerified``), so
the loop never sees a logits row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

from ..planner.inputs import Drafter, DraftSetup
from ..planner.tree import DraftTree, SparseDist

T = TypeVar("T", covariant=True)
U = TypeVar("U")


class Sampling(Protocol):
    """The target's sampling rule, as the reductions read it (``decoding.sampling.SamplingParams``)."""

    @property
    def temperature(self) -> float: ...
    @property
    def top_k(self) -> int: ...
    @property
    def top_p(self) -> float: ...


class Verified(Protocol):
    """The target's output at each node of a decoded batch (node i: the i-th token decoded). Valid until
    the target's next decode, unless ``detach``-ed."""

    def top(self, node: int) -> tuple[int, float]:
        """The target's greedy token after ``node`` and its top-1 − top-2 logit margin."""
        ...

    def probs(self, node: int, sampling: Sampling) -> np.ndarray:
        """The target's dense sampling distribution p after ``node`` (temperature, top-k, top-p)."""
        ...

    def candidates(self, node: int, sampling: Sampling, k: int, vocab_limit: int) -> SparseDist:
        """The target's ``k`` likeliest next tokens with ids < ``vocab_limit``: by logit under greedy,
        with p when it samples (draws from them are then draws from p, truncated to the k best)."""
        ...

    def detach(self) -> Verified:
        """The same, kept past the target's next decode."""
        ...


class Done(Protocol):
    """Whether a decode is over (a ``threading.Event``)."""

    def is_set(self) -> bool: ...


class Pending(Generic[T]):
    """A decode begun: ``done`` is set when it is over; ``result()`` waits for it and returns what it
    gave (or raises what it raised). Call ``result()`` exactly once, also after an error meanwhile:
    the model is busy until then."""

    def __init__(self, done: Done, wait: Callable[[], T]):
        self.done, self._wait = done, wait

    @staticmethod
    def ready(value: U) -> Pending[U]:
        """A decode already over (a model on this machine: nothing can overlap it)."""
        done = threading.Event()
        done.set()
        return Pending(done, lambda: value)

    def result(self) -> T:
        return self._wait()

    def then(self, after: Callable[[T], U]) -> Pending[U]:
        """The same decode, its result passed through ``after`` (run by ``result()``)."""
        return Pending(self.done, lambda: after(self.result()))


@dataclass(frozen=True)
class Prefilled:
    """A prompt held by the target: the first token's distribution, and how many tokens were cached."""

    first: Verified  # one node: the prompt's last token
    cached: int


class Joined:
    """A committed root's output (``Target.decode_root``, detached) followed by a batch decoded after it:
    node 0 is the root, node i the batch's node i − 1."""

    def __init__(self, root: Verified, rest: Verified):
        self.root, self.rest = root, rest

    def _at(self, node: int) -> tuple[Verified, int]:
        return (self.root, 0) if node == 0 else (self.rest, node - 1)

    def top(self, node: int) -> tuple[int, float]:
        part, i = self._at(node)
        return part.top(i)

    def probs(self, node: int, sampling: Sampling) -> np.ndarray:
        part, i = self._at(node)
        return part.probs(i, sampling)

    def candidates(self, node: int, sampling: Sampling, k: int, vocab_limit: int) -> SparseDist:
        part, i = self._at(node)
        return part.candidates(i, sampling, k, vocab_limit)

    def detach(self) -> Verified:
        return Joined(self.root, self.rest.detach())


class Vocab(Protocol):
    def piece(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


class Target(Protocol):
    @property
    def model(self) -> Vocab: ...  # what the loop reads of the target's tokenizer
    @property
    def committed(self) -> Sequence[int]: ...  # the tokens its cache holds (the conversation so far)
    @property
    def turn_tokens(self) -> frozenset[int]: ...  # end-of-turn and template tokens (copies stop there)
    @property
    def sizes_decoded(self) -> Collection[int]: ...  # batch sizes decoded so far (``Prepaid.sizes``)
    @property
    def n_ctx(self) -> int: ...
    @property
    def llama_seconds(self) -> float:
        """Time spent inside decodes so far (a running total: take differences)."""
        ...

    def use_sampling(self, sampling: Sampling) -> None:
        """The sampling rule the next decodes' outputs are read under (a request's: given before its
        prefill): the reductions they need (``engine.samplers``)."""
        ...

    def start_prefill(
        self, prompt: Sequence[int], cancel: threading.Event | None = None
    ) -> Pending[Prefilled]:
        """Hold ``prompt``, keeping the longest prefix already held; ``cancel``: checked between chunks
        (``interrupts.Cancelled`` once set)."""
        ...

    def decode_root(self, root: int) -> Verified:
        """Plain decoding: ``root`` alone, committed at once."""
        ...

    def start_verify(self, tree: DraftTree, root: Verified | None = None) -> Pending[Verified]:
        """Decode every node of ``tree`` in one batch (a one-node tree: plain decoding, committed at
        once). ``root``: the root is committed already (``decode_root``) and this is its output: only
        the drafted nodes are decoded, node 0 of the result is ``root``."""
        ...

    def commit(self, tree: DraftTree, path: Sequence[int], root_committed: bool = False) -> None:
        """Keep exactly the accepted ``path`` (root first) of the tree verified last."""
        ...


@dataclass(frozen=True)
class DraftWork:
    """What the draft did in a step, for its ``StepEvent``."""

    seconds: float = 0.0  # inside the draft's decodes (the rest of planning is the planner's)
    decodes: int = 0
    reused: int = 0  # nodes whose distribution a look-ahead decoded already
    ahead_seconds: float = 0.0  # spent looking ahead (overlapping the target's decode)
    guess: SparseDist | None = None  # a step that drafted nothing, over RPC: its guess at the root


class Draft(Drafter, Protocol):
    @property
    def top_k(self) -> int: ...  # candidates kept per distribution
    @property
    def vocab_limit(self) -> int: ...  # ids the draft may propose: below this
    @property
    def work(self) -> DraftWork: ...  # this step's, so far
    @property
    def llama_seconds(self) -> float: ...

    def known(self, path: Sequence[int]) -> bool:
        """The draft holds the distribution after this token path (root first) already — it decoded it
        while the target verified the last step (``Prepaid.drafted``): expanding it costs no decode."""
        ...

    def defer(self, tokens: Sequence[int]) -> int:
        """A reply's start: hold ``tokens``, decoding nothing now (read with the first level)."""
        ...

    def begin_step(self, temperature: float) -> None: ...

    def commit(self, tree: DraftTree, path: Sequence[int], next_token: int) -> None:
        """The step's outcome: the accepted ``path`` and the target's next token."""
        ...

    def drop_ahead(self) -> None:
        """A reply's end: forget what was decoded past the committed tokens."""
        ...


class Pair(Protocol):
    @property
    def target(self) -> Target: ...
    @property
    def draft(self) -> Draft | None: ...  # None: loaded without a draft (plain decoding, copies)

    @property
    def max_nodes(self) -> int:
        """Largest tree (root included) a verify takes."""
        ...

    def set_up_draft(self, setup: DraftSetup) -> object: ...

    def overlap(self, tree: DraftTree, pending: Pending) -> None:
        """Draft work while the target's decode of ``tree`` is ``pending`` (over RPC: the look-ahead);
        nothing for a target on this machine."""
        ...
