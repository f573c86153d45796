"""A fake backend for the chat app's tests: realistic StepEvents (draft trees, provenance, timings)
with tiny delays, through the same ``Backend`` / ``ChatEngine`` protocols as the real pair.

The "model" answers with a canned reply (a sentence echoing the question and a code block). Each
speculative step accepts a varying number of draft tokens from a small tree — the accepted branch,
one rejected continuation and one rejected sibling — then adds the target's own token.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from edgespec.decoding.chat import ChatSettings, Message
from edgespec.decoding.events import EmittedToken, GenerationStats, Provenance, StepEvent, StepTimings
from edgespec.errors import ContextFullError, EdgespecError
from edgespec.planner.tree import ChildRule, PlanStats, SparseDist, TreeBuilder
from edgespec.session import LoadedPair
from edgespec.strategy import StrategyChoice

ACCEPT_PATTERN = (3, 1, 0, 2, 4)  # draft tokens accepted in successive steps (capped by the budget)
STRATEGIES = ("none", "chain", "tsd", "gsd", "ngram", "mcsd-target-init", "auto")
PROFILE_STEPS = 3  # the fake auto's "cost profile" measurement, in progress reports


def canned_answer(question: str, repeat: int = 1) -> str:
    body = (
        f"Here is an answer about {question.strip()[:40]}. "
        "It uses a small function:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\nThat is all. "
    )
    return body * repeat


def split_pieces(text: str) -> list[str]:
    """Word-ish pieces that concatenate back to ``text`` (like BPE tokens with leading spaces)."""
    return re.findall(r"\s*\S+|\s+", text)


@dataclass
class FakePlanner:
    name: str
    budget: int = 4
    lossy: bool = False
    state: str = ""  # auto: what it is doing now (set by the fake engine, as the real auto sets its own)
    needs_draft: bool = True
    may_draft: bool = True

    def describe(self) -> str:
        return self.state or f"budget={self.budget}"


class FakeEngine:
    """A loaded 'pair': streams the canned answer in speculative (or plain) steps."""

    def __init__(self, delay: float = 0.005, repeat: int = 1, n_ctx: int = 4096, has_draft: bool = True):
        self.delay = delay  # seconds per step
        self.repeat = repeat  # answer length: copies of the canned body
        self.n_ctx = n_ctx
        self.has_draft = has_draft
        self.fail: EdgespecError | None = None  # raised when a stream starts
        self.vocab: dict[str, int] = {"<root>": 0}
        self.pieces: list[str] = ["<root>"]
        self.used = 0
        self.closed = False
        self.streams = 0
        self.last_messages: list[Message] = []
        self.lock = threading.Lock()
        self.profiled = False  # auto's cost profile, measured by the first answer that uses auto
        self.profile_gate = threading.Event()  # measuring waits for this (tests watch the status bar)
        self.profile_gate.set()

    def token(self, piece: str) -> int:
        with self.lock:
            if piece not in self.vocab:
                self.vocab[piece] = len(self.pieces)
                self.pieces.append(piece)
            return self.vocab[piece]

    def piece(self, token: int) -> str:
        return self.pieces[token]

    def context_used(self) -> int:
        return self.used

    def idle(self) -> bool:
        return False

    def measure(self, stop, on_progress) -> bool:
        return True  # its profile comes with ``prepare``

    def cache_info(self) -> dict:
        return {"conversations": 0, "live_tokens": self.used}

    def forget(self) -> None:
        self.used = 0

    def close(self) -> None:
        self.closed = True

    def prepare(self, planner, on_progress) -> None:
        if planner is None or planner.name != "auto" or self.profiled:
            return
        for done in range(1, PROFILE_STEPS + 1):
            on_progress("cost profile", done, PROFILE_STEPS)
            self.profile_gate.wait(10)
        self.profiled = True
        planner.state = "plain"

    def stream(
        self,
        planner,
        messages: Sequence[Message],
        settings: ChatSettings,
        cancel: threading.Event,
        stats: GenerationStats,
    ) -> Iterator[StepEvent]:
        if self.closed:
            raise RuntimeError("stream on a closed engine")
        self.streams += 1
        self.last_messages = list(messages)
        if self.fail is not None:
            raise self.fail
        prompt = sum(len(split_pieces(m.content)) for m in messages) + 4 * len(messages)
        stats.prompt_tokens = prompt
        self.used = prompt
        answer = [self.token(p) for p in split_pieces(canned_answer(messages[-1].content, self.repeat))]
        return self._steps(planner, answer, settings, cancel, stats)

    def _steps(self, planner, answer, settings, cancel, stats) -> Iterator[StepEvent]:
        pos, step, root = 0, 0, 0
        while True:
            if cancel.is_set():
                yield _finish("cancelled")
                return
            if self.used >= self.n_ctx:
                yield _finish("context")
                return
            time.sleep(self.delay)
            if planner is not None and planner.name == "auto":  # plain for two steps, then speculating
                planner.state = "plain" if step < 2 else f"speculating {planner.budget} tokens"
            if planner is None or (planner.name == "auto" and step < 2):
                event = self._plain_step(answer[pos])
            else:
                accept = min(
                    ACCEPT_PATTERN[step % len(ACCEPT_PATTERN)], planner.budget, len(answer) - pos - 1
                )
                event = self._tree_step(planner, root, answer[pos : pos + accept + 1])
            step += 1
            n = len(event.tokens)
            finish = None
            if pos + n >= len(answer):
                finish = "stop"
            elif pos + n >= settings.max_tokens:
                n, finish = settings.max_tokens - pos, "length"
            tokens = event.tokens[:n]
            event = _replace(
                event, tokens=tokens, text="".join(self.pieces[t.id] for t in tokens), finish=finish
            )
            pos += n
            self.used += n
            root = tokens[-1].id if tokens else root
            stats.add(event)
            yield event
            if finish:
                return

    def _plain_step(self, token: int) -> StepEvent:
        return StepEvent(
            tokens=(EmittedToken(token, Provenance.TARGET, 1.5),),
            text="",
            drafted=0,
            accepted=0,
            timings=StepTimings(verify=self.delay),
        )

    def _tree_step(self, planner: FakePlanner, root: int, chosen: list[int]) -> StepEvent:
        """A tree whose first branch holds the accepted tokens plus one rejected one; one rejected sibling.
        gsd: the first accepted token is a merged node; ngram: every token is copied."""
        merged, copied = planner.name == "gsd", planner.name == "ngram"
        accepted, target_token = chosen[:-1], chosen[-1]
        wrong = self.token(" wrong")
        tree = TreeBuilder(root)
        node, path = 0, [0]
        for i, token in enumerate(accepted):
            tree.set_children_rule(node, ChildRule.TOP)
            tree.dists[node] = SparseDist(np.array([token, wrong], np.int32), np.array([0.8, 0.1]))
            node = tree.add(node, token, 0.8, merged=merged and i == 0, copied=copied)
            path.append(node)
        tree.set_children_rule(node, ChildRule.TOP)
        tree.dists[node] = SparseDist(np.array([wrong], np.int32), np.array([0.5]))
        tree.add(node, wrong, 0.5, copied=copied)  # rejected: the target chose ``target_token`` here
        tree.add(0, self.token(" maybe"), 0.1, copied=copied)  # a rejected sibling of the first draft token
        frozen = tree.freeze(PlanStats(draft_decodes=len(accepted) + 1, expected_accept=0.8 * len(accepted)))
        kinds = [
            Provenance.MERGED if frozen.merged[n] else Provenance.COPIED if copied else Provenance.DRAFT
            for n in path[1:]
        ]
        emitted = tuple(EmittedToken(t, k, 2.0) for t, k in zip(accepted, kinds))
        emitted += (EmittedToken(target_token, Provenance.TARGET, 0.7),)
        return StepEvent(
            tokens=emitted,
            text="",
            drafted=frozen.size - 1,
            accepted=len(accepted),
            timings=StepTimings(draft=self.delay / 2, plan=0.0001, verify=self.delay / 2, bookkeeping=0.0001),
            tree=frozen,
            accepted_path=tuple(path),
            verified_nodes=frozen.size,
            draft_decodes=len(accepted) + 1,
            depth=int(frozen.depth.max()),
            leaves=len(frozen.leaves),
            expected_accept=frozen.stats.expected_accept,
            merges=int(merged),
            graph_success=merged and bool(accepted),
        )


def _finish(reason: str) -> StepEvent:
    return StepEvent(
        tokens=(),
        text="",
        drafted=0,
        accepted=0,
        timings=StepTimings(),
        verified_nodes=0,
        finish_reason=reason,
    )


def _replace(event: StepEvent, tokens, text: str, finish: str | None) -> StepEvent:
    return replace(event, tokens=tuple(tokens), text=text, finish_reason=finish)


@dataclass
class FakeBackend:
    """Pairs 'fake-pair' (default) and 'other-pair'; ``fail`` maps a pair name (None: the first load) to an
    error its load raises."""

    strategies: tuple[str, ...] = STRATEGIES
    fail: dict = field(default_factory=dict)
    delay: float = 0.005
    repeat: int = 1
    n_ctx: int = 4096
    load_delay: float = 0.002  # seconds between load progress reports
    hold_at_half: threading.Event | None = None  # when set: loading waits at 50 % until the event is set
    has_draft: bool = True  # False: loaded as `edgespec chat --target X` without --draft
    engines: list[FakeEngine] = field(default_factory=list)
    loads: list[str | None] = field(default_factory=list)

    def pairs(self) -> list[str]:
        return ["fake-pair", "other-pair"]

    def load(self, pair: str | None, on_progress) -> LoadedPair:
        self.loads.append(pair)
        for done in (0, 512, 1024):
            on_progress("assembling fake-target", done, 1024)
            if done == 512 and self.hold_at_half is not None:
                self.hold_at_half.wait(30)
            time.sleep(self.load_delay)
        on_progress("loading into memory", 0, 0)
        if pair in self.fail:
            raise self.fail[pair]
        engine = FakeEngine(delay=self.delay, repeat=self.repeat, n_ctx=self.n_ctx, has_draft=self.has_draft)
        self.engines.append(engine)
        return LoadedPair(engine, pair or "fake-pair", StrategyChoice("chain", {"budget": 4}))

    def make_planner(self, choice: StrategyChoice) -> FakePlanner | None:
        if choice.name == "none":
            return None
        if choice.name not in self.strategies:
            raise EdgespecError(f"unknown strategy {choice.name!r}")
        planner = FakePlanner(
            choice.name,
            choice.budget or 4,
            lossy=choice.name == "mcsd-target-init",
            needs_draft=choice.name != "ngram",
        )
        if choice.name == "auto":  # as the real auto says before the pair's cost profile is attached
            planner.state = "no cost profile yet: plain decoding"
        return planner


__all__ = ["ContextFullError", "FakeBackend", "FakeEngine", "FakePlanner", "canned_answer", "split_pieces"]
