"""What the workers tell the UI. Workers run in threads and only ever ``post_message`` these.

Floods are merged: a stats or tree update that is still queued when a newer one arrives is dropped
(``can_replace``); streamed text is never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from edgespec.decoding.events import Provenance

Span = tuple[str, Provenance]  # a piece of answer text and who chose its tokens


@dataclass(frozen=True)
class StatsSnapshot:
    """The live numbers of the status bar, taken in the worker thread."""

    tokens: int = 0
    tokens_per_second: float = 0.0  # rolling, over the last couple of seconds
    mean_accepted_length: float = 0.0
    acceptance_rate: float = 0.0
    drafted: int = 0
    context_used: int = 0


@dataclass(frozen=True)
class TreeSnapshot:
    """The last step's draft tree, ready to draw (labels already detokenised)."""

    labels: tuple[str, ...]  # node i's token text
    parents: tuple[int, ...]  # parents[0] == -1
    draft_prob: tuple[float, ...]
    merged: tuple[bool, ...]
    copied: tuple[bool, ...]  # copied from the conversation (n-gram match), not drafted
    accepted: frozenset[int]  # nodes on the accepted path (root included)
    bonus: str  # the token the target added after the accepted path


# -- generation -------------------------------------------------------------------------------------
class GenerationMessage(Message):
    def __init__(self, gen_id: int) -> None:
        super().__init__()
        self.gen_id = gen_id  # which answer this belongs to (stale ones are ignored)


class Streamed(GenerationMessage):
    """Text committed by one step, split by provenance."""

    def __init__(self, gen_id: int, spans: list[Span]) -> None:
        super().__init__(gen_id)
        self.spans = spans


class StatsUpdated(GenerationMessage):
    def __init__(self, gen_id: int, stats: StatsSnapshot) -> None:
        super().__init__(gen_id)
        self.stats = stats

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StatsUpdated)


class TreeUpdated(GenerationMessage):
    def __init__(self, gen_id: int, tree: TreeSnapshot) -> None:
        super().__init__(gen_id)
        self.tree = tree

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, TreeUpdated)


class StrategyStatus(GenerationMessage):
    """What the strategy is doing now (auto: measuring its cost profile, plain, speculating N)."""

    def __init__(self, gen_id: int, label: str) -> None:
        super().__init__(gen_id)
        self.label = label

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StrategyStatus)


class GenerationEnded(GenerationMessage):
    def __init__(self, gen_id: int, finish_reason: str, stats: dict) -> None:
        super().__init__(gen_id)
        self.finish_reason = finish_reason  # "stop", "length", "cancelled" or "context"
        self.stats = stats  # GenerationStats.as_dict()


class GenerationFailed(GenerationMessage):
    def __init__(self, gen_id: int, error: str, stats: dict) -> None:
        super().__init__(gen_id)
        self.error = error  # what happened and what to do (never a traceback)
        self.stats = stats


# -- loading ----------------------------------------------------------------------------------------
class LoadProgress(Message):
    def __init__(self, stage: str, done: int = 0, total: int = 0) -> None:
        super().__init__()
        self.stage = stage  # e.g. "assembling qwen2.5-coder-0.5b… from its pip packages"
        self.done = done  # bytes; total == 0 means "no measurable progress" (e.g. loading weights)
        self.total = total

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadProgress)


class PairLoaded(Message):
    def __init__(self, loaded) -> None:  # loaded: edgespec.session.LoadedPair
        super().__init__()
        self.loaded = loaded


class PairLoadFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


# -- measuring the pair between answers ---------------------------------------------------------------
class MeasureProgress(Message):
    def __init__(self, done: int, total: int) -> None:
        super().__init__()
        self.done, self.total = done, total  # pieces of the pair's profile measured, of all

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, MeasureProgress)


class MeasureEnded(Message):
    def __init__(self, complete: bool, error: str = "") -> None:
        super().__init__()
        self.complete = complete  # False: stopped for the user (it goes on in the next idle time)
        self.error = error  # a failure: measuring stops for this pair, answers go on without it
