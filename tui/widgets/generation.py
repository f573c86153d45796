"""The answer being generated, as an invisible widget that lives as long as the answer.

Its worker is a thread that never touches a widget: it streams the answer from the engine and posts
the messages of ``tui.messages`` to this widget, which draws the text into the answer's
``AnswerMessage`` as it streams and saves it as it grows (a crash keeps what was written). Stats, tree
and strategy-label updates, and the end of the answer, bubble on to the screen, which owns the status
bar, the tree panel and the conversation.
"""

from __future__ import annotations

import threading
from time import monotonic

from textual import on, work
from textual.widget import Widget

from edgespec.decoding.events import GenerationStats
from edgespec.errors import EdgespecError

from .. import messages as msg
from ..display import RollingRate, provenance_runs, provenance_spans, stats_snapshot, tree_snapshot
from ..guards import notify_errors
from ..storage import ChatStore
from .chat_log import AnswerMessage, answer_meta

SAVE_INTERVAL = 1.0  # seconds between saves of the answer in flight
UI_INTERVAL = 0.1  # seconds between stats / tree updates from the worker


class Generation(Widget):
    """The answer in flight, from its first token to its last save."""

    DEFAULT_CSS = "Generation { display: none; }"

    def __init__(
        self,
        gen_id: int,
        answer: AnswerMessage,
        store: ChatStore,
        conversation_id: int,
        pair: str,
        strategy: str,
    ) -> None:
        super().__init__()
        self.gen_id = gen_id  # its messages carry it; the screen ignores those of an older answer
        self.answer = answer  # where the text goes, in the chat log
        self.store = store
        self.conversation_id = conversation_id
        self.pair = pair
        self.strategy = strategy  # the strategy label saved with it
        self.cancel = threading.Event()  # set: the worker stops before its next step
        self.message_id: int | None = None  # the row of the partial answer, once saved
        self.last_save = monotonic()

    def stop(self) -> None:
        self.cancel.set()

    @work(thread=True, group="generate", exit_on_error=False)
    def generate(
        self, engine, planner, history, settings, idle: threading.Event, free: threading.Event
    ) -> None:
        """The generation worker: waits here (not in the UI) until ``free`` says no other worker drives
        the engine (a measuring piece ends), then streams the answer, reports through messages only,
        sets ``idle``."""
        stats, rate = GenerationStats(), RollingRate()
        post, gen_id = self.post_message, self.gen_id
        last_ui, last_tree, finish = 0.0, None, "stop"
        label = ""

        def measuring(what: str, done: int, total: int) -> None:
            post(msg.StrategyStatus(gen_id, f"{planner.name}: measuring the cost profile {done}/{total}"))

        try:
            free.wait()  # the measuring piece in progress (asked to stop): well under a second
            idle.clear()  # the measuring worker set it on its way out
            engine.prepare(planner, measuring)
            for event in engine.stream(planner, history, settings, self.cancel, stats):
                spans = provenance_spans(event, engine.piece)
                if spans:
                    post(msg.Streamed(gen_id, spans))
                if event.verified_nodes:
                    rate.add(len(event.tokens))
                if event.tree is not None:
                    last_tree = event
                finish = event.finish_reason or finish
                now = monotonic()
                if event.finish_reason or now - last_ui >= UI_INTERVAL:
                    last_ui = now
                    post(msg.StatsUpdated(gen_id, stats_snapshot(stats, rate, engine.context_used())))
                    if planner is not None and label != (now := strategy_label(planner)):
                        label = now
                        post(msg.StrategyStatus(gen_id, label))
                    if last_tree is not None:
                        post(msg.TreeUpdated(gen_id, tree_snapshot(last_tree, engine.piece)))
                        last_tree = None
        except EdgespecError as exc:
            post(msg.GenerationFailed(gen_id, str(exc), stats.as_dict()))
            return
        except Exception as exc:  # a bug: report it without a traceback and keep the app alive
            post(
                msg.GenerationFailed(
                    gen_id, f"unexpected error while generating ({exc!r}). Please report it.", {}
                )
            )
            return
        finally:
            idle.set()
        post(msg.GenerationEnded(gen_id, finish, stats.as_dict()))

    @on(msg.Streamed)
    def _streamed(self, event: msg.Streamed) -> None:
        self.answer.append(event.spans)
        if monotonic() - self.last_save >= SAVE_INTERVAL:
            with notify_errors(self):
                self._save(complete=False)

    @on(msg.GenerationEnded)
    def _ended(self, event: msg.GenerationEnded) -> None:
        self._close(event.finish_reason, event.stats)

    @on(msg.GenerationFailed)
    def _failed(self, event: msg.GenerationFailed) -> None:
        self._close("error", event.stats)

    def _close(self, finish: str, stats: dict) -> None:
        """The last step: the meta line, Markdown, and the answer saved complete (unless nothing came)."""
        self.answer.finish(answer_meta(self.pair, self.strategy, stats, finish))
        if finish != "error" or self.answer.text or self.message_id is not None:
            with notify_errors(self):
                self._save(complete=True, stats=stats, finish=finish)

    def _save(self, complete: bool, stats: dict | None = None, finish: str | None = None) -> None:
        self.last_save = monotonic()
        text, runs = self.answer.text, provenance_runs(self.answer.spans)
        if self.message_id is None:
            self.message_id = self.store.add_message(
                self.conversation_id,
                "assistant",
                text,
                complete=complete,
                pair=self.pair,
                strategy=self.strategy,
                stats=stats,
                finish_reason=finish,
                provenance=runs,
            )
        else:
            self.store.update_message(
                self.message_id, text, complete=complete, stats=stats, finish_reason=finish, provenance=runs
            )


def strategy_label(planner) -> str:
    """The status bar's strategy field: name and what it is doing (auto's changes as it runs)."""
    if planner is None:
        return "none (plain decoding)"
    return f"{planner.name} {planner.describe()}".strip()
