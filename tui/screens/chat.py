"""The chat screen: conversation list, messages, input, draft-tree panel and status bar.

It orchestrates: which pair is loaded, which strategy drafts, which conversation is open, when an
answer starts. Blocking work runs in thread workers that never touch widgets: loading a pair
(``_load``, here) and generating an answer (``Generation.generate``, in the answer's own widget).
They post the messages of ``tui.messages``; the handlers here update the status bar and the tree
panel on the UI thread. The keys, the palette and the commands that only open a dialog or change the
view are in ``tui.commands``.
"""

from __future__ import annotations

import threading

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer

from edgespec.decoding.chat import ChatSettings, Message
from edgespec.errors import EdgespecError
from edgespec.session import Backend, LoadedPair, draft_problem, where_text
from edgespec.strategy import StrategyChoice

from .. import messages as msg
from ..commands import KEYS, Commands
from ..display import spans_from_runs
from ..guards import notify_errors, when_idle
from ..storage import ChatStore, title_from
from ..widgets.chat_log import ChatLog, answer_meta
from ..widgets.generation import Generation, strategy_label
from ..widgets.measuring import IdleMeasuring
from ..widgets.prompt import PromptInput
from ..widgets.sidebar import ConversationList
from ..widgets.status_bar import StatusBar
from ..widgets.tree_panel import DraftTreePanel
from .loading import LoadingScreen


class ChatScreen(Commands, Screen):
    BINDINGS = KEYS

    def __init__(self, backend: Backend, store: ChatStore, settings: ChatSettings, pair: str | None = None):
        super().__init__()
        self.backend = backend
        self.store = store
        self.settings = settings
        self.requested_pair = pair  # None: what the command line asked for
        self.loaded: LoadedPair | None = None
        self.strategy: StrategyChoice | None = None
        self.strategy_chosen = False  # the user picked a strategy: keep it across pair switches
        self.planner = None
        self.conversation_id: int | None = None
        self.gen: Generation | None = None  # the answer in flight
        self._gen_counter = 0
        self._idle = threading.Event()  # set while no worker drives the engine (answer, measuring)
        self._measuring = IdleMeasuring()  # the pair's profile, measured while the chat is idle
        self._idle.set()
        self._loading: str | None = None  # the pair being loaded
        self._fallback: str | None = None  # pair to reload if a switch fails
        self.highlight = True
        self.token_view = False

    # -- layout ---------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield ConversationList()
            with Vertical(id="chat-column"):
                yield ChatLog(id="log")
                yield PromptInput([m for m in self._sent_history()])
            yield DraftTreePanel()
        yield StatusBar()
        yield Footer()
        yield self._measuring

    def on_mount(self) -> None:
        self.query_one(DraftTreePanel).display = False
        with notify_errors(self):
            self._mark_cut_off()
        self.refresh_sidebar()
        self.query_one(PromptInput).focus()
        self.load_pair(self.requested_pair)

    def _mark_cut_off(self) -> None:
        cut = self.store.mark_cut_off()
        if cut:
            self.notify(
                f"{cut} answer{'s were' if cut > 1 else ' was'} cut off when edgespec stopped last time; "
                "what had been written is kept and marked 'cut off' (ctrl+r regenerates).",
                severity="warning",
                timeout=12,
            )

    @property
    def log_view(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    def _sent_history(self) -> list[str]:
        """Earlier user messages (newest last), for the input's up/down history."""
        history: list[str] = []
        for conversation in reversed(self.store.conversations()[:20]):
            history += [m.content for m in self.store.messages(conversation.id) if m.role == "user"]
        return history[-200:]

    # -- loading a pair -------------------------------------------------------------------------------
    @when_idle
    def load_pair(self, pair: str | None) -> None:
        if self.loaded is not None:
            self._fallback = self.loaded.name
            self._measuring.stop(wait=10)
            self.loaded.engine.close()  # free its memory before loading the next pair
            self.loaded, self.planner = None, None
        self._loading = pair or "default pair"
        self.status.set(state="loading", pair=self._loading)
        self.app.push_screen(LoadingScreen(self._loading))
        self._load(pair)

    @work(thread=True, group="load", exclusive=True, exit_on_error=False)
    def _load(self, pair: str | None) -> None:
        def progress(stage: str, done: int, total: int) -> None:
            self.post_message(msg.LoadProgress(stage, done, total))

        try:
            loaded = self.backend.load(pair, progress)
        except EdgespecError as exc:
            self.post_message(msg.PairLoadFailed(str(exc)))
            return
        except Exception as exc:  # a bug: say so without a traceback, keep the app usable
            self.post_message(
                msg.PairLoadFailed(f"unexpected error while loading ({exc!r}). Please report it.")
            )
            return
        self.post_message(msg.PairLoaded(loaded))

    def _close_loading_screen(self) -> None:
        if isinstance(self.app.screen, LoadingScreen):
            self.app.pop_screen()

    @on(msg.LoadProgress)
    def _load_progress(self, event: msg.LoadProgress) -> None:
        if isinstance(self.app.screen, LoadingScreen):
            self.app.screen.progress(event.stage, event.done, event.total)

    @on(msg.PairLoaded)
    def _pair_loaded(self, event: msg.PairLoaded) -> None:
        self._close_loading_screen()
        self._loading = None
        self.loaded = event.loaded
        self._fallback = None
        runs_on = getattr(self.loaded.engine, "runs_on", None)  # a fake engine does not say
        self.status.set(
            state="ready",
            pair=f"{self.loaded.name} · {where_text(runs_on)}" if runs_on else self.loaded.name,
            n_ctx=self.loaded.engine.n_ctx,
            stats=msg.StatsSnapshot(),
        )
        choice = self.strategy if self.strategy_chosen and self.strategy else self.loaded.defaults
        if not self.set_strategy(choice, chosen=self.strategy_chosen):
            self.set_strategy(self.loaded.defaults)
        self.query_one(PromptInput).focus()
        self._measuring.failed = False
        self._measure_idle()

    @on(msg.PairLoadFailed)
    def _pair_load_failed(self, event: msg.PairLoadFailed) -> None:
        self._close_loading_screen()
        failed, self._loading = self._loading, None
        self.status.set(state="no model", pair=f"{failed} (not loaded)")
        self.notify(event.error, title="Could not load the models", severity="error", timeout=30)
        fallback, self._fallback = self._fallback, None
        if fallback and fallback != failed:
            self.notify(f"Reloading {fallback}.")
            self.load_pair(fallback)

    # -- strategy -------------------------------------------------------------------------------------
    def set_strategy(self, choice: StrategyChoice, chosen: bool = False) -> bool:
        """Build the planner for ``choice``; on success it drafts the next answer."""
        if self.loaded is None:
            self.notify("No model is loaded yet.", severity="warning")
            return False
        try:
            planner = self.backend.make_planner(choice)
        except (EdgespecError, ValueError, TypeError) as exc:
            self.notify(f"cannot use strategy {choice.name}: {exc}", severity="error", timeout=12)
            return False
        if (problem := draft_problem(planner, self.loaded)) is not None:
            self.notify(problem, severity="error")
            return False
        self.strategy, self.planner = choice, planner
        self.strategy_chosen = self.strategy_chosen or chosen
        self.status.set(strategy=self.strategy_label, lossy=bool(planner is not None and planner.lossy))
        if planner is not None and planner.lossy:
            self.notify(
                f"{planner.name} is lossy: answers no longer follow the target's distribution exactly."
            )
        return True

    @property
    def strategy_label(self) -> str:
        return strategy_label(self.planner)

    # -- sending and generating -----------------------------------------------------------------------
    @on(PromptInput.Submitted)
    def _submitted(self, event: PromptInput.Submitted) -> None:
        text = event.value.strip()
        if text:
            self.send(text)

    @when_idle
    def send(self, text: str) -> None:
        if self.loaded is None:
            what = (
                f"{self._loading} is still loading"
                if self._loading
                else "no model is loaded (ctrl+o picks a pair)"
            )
            self.notify(f"Cannot send yet: {what}.", severity="warning")
            return
        prompt = self.query_one(PromptInput)
        prompt.remember(text)
        prompt.value = ""
        with notify_errors(self):
            if self.conversation_id is None:
                self.conversation_id = self.store.create_conversation(title_from(text)).id
            self.store.add_message(self.conversation_id, "user", text)  # committed before generating
            self.log_view.add_user(text)
            self.refresh_sidebar()
            self.start_generation()

    def start_generation(self) -> None:
        assert self.loaded is not None and self.conversation_id is not None
        history = [
            Message(m.role, m.content)
            for m in self.store.messages(self.conversation_id)
            if m.role != "system"
        ]
        self._gen_counter += 1
        answer = self.log_view.add_answer(highlight=self.highlight, token_view=self.token_view)
        self.gen = Generation(
            self._gen_counter, answer, self.store, self.conversation_id, self.loaded.name, self.strategy_label
        )
        self.mount(self.gen)
        self._measuring.stop()  # the answer's worker waits for the piece in progress, not the UI
        self.status.set(state="generating", stats=msg.StatsSnapshot())
        self._idle.clear()
        self.gen.generate(
            self.loaded.engine, self.planner, history, self.settings, self._idle, self._measuring.finished
        )

    # The answer's messages reach here after its Generation has drawn and saved what they carry.
    def _current(self, event: msg.GenerationMessage) -> bool:
        return self.gen is not None and self.gen.gen_id == event.gen_id

    @on(msg.StatsUpdated)
    def _stats_updated(self, event: msg.StatsUpdated) -> None:
        if self._current(event):
            self.status.set(stats=event.stats)

    @on(msg.StrategyStatus)
    def _strategy_status(self, event: msg.StrategyStatus) -> None:
        if self._current(event):
            self.status.set(strategy=event.label)

    @on(msg.TreeUpdated)
    def _tree_updated(self, event: msg.TreeUpdated) -> None:
        if self._current(event):
            self.query_one(DraftTreePanel).show(event.tree)

    @on(msg.GenerationEnded)
    def _generation_ended(self, event: msg.GenerationEnded) -> None:
        if not self._current(event):
            return
        self._generation_over()
        if event.finish_reason == "cancelled":
            self.notify("Stopped. ctrl+r regenerates the answer.")
        elif event.finish_reason == "context":
            self.notify(
                "The context window is full, so the answer stopped. Start a new chat (ctrl+n), or restart "
                "with a larger --ctx.",
                severity="warning",
                timeout=12,
            )

    @on(msg.GenerationFailed)
    def _generation_failed(self, event: msg.GenerationFailed) -> None:
        if not self._current(event):
            return
        self._generation_over()
        self.notify(event.error, title="Generation failed", severity="error", timeout=20)

    def _generation_over(self) -> None:
        self.gen.remove()  # its worker has posted its last message
        self.gen = None
        self.status.set(state="ready", strategy=self.strategy_label)
        self.refresh_sidebar()
        self._measure_idle()

    # -- measuring the pair while idle ----------------------------------------------------------------
    def _measure_idle(self) -> None:
        if self.loaded is not None and self.gen is None:
            self._measuring.start(self.loaded.engine, self._idle)

    @on(PromptInput.Changed)
    def _typing(self) -> None:
        self._measuring.pause(self._measure_idle)  # the user is writing: the engine is theirs

    @on(msg.MeasureProgress)
    def _measure_progress(self, event: msg.MeasureProgress) -> None:
        if self.gen is None:
            self.status.set(state=f"measuring the pair {event.done}/{event.total} (idle time)")

    @on(msg.MeasureEnded)
    def _measure_ended(self, event: msg.MeasureEnded) -> None:
        if self.gen is None and self.loaded is not None:
            self.status.set(state="ready", strategy=self.strategy_label)
        if event.error:
            self.notify(event.error, severity="warning", timeout=12)

    def action_stop(self) -> None:
        if self.gen is not None:
            self.gen.stop()  # the worker stops before its next step
            self.status.set(state="stopping")

    def on_unmount(self) -> None:
        self.shutdown()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the answer in flight, wait for its worker, free the models (called on exit)."""
        if self.gen is not None:
            self.gen.stop()
        self._measuring.stop()
        if self._idle.wait(timeout) and self.loaded is not None:
            self.loaded.engine.close()
            self.loaded = None

    # -- conversations --------------------------------------------------------------------------------
    def refresh_sidebar(self) -> None:
        self.query_one(ConversationList).show(self.store.conversations(), self.conversation_id)

    @on(ConversationList.Opened)
    def _opened(self, event: ConversationList.Opened) -> None:
        self.open_conversation(event.conversation_id)

    @when_idle
    def open_conversation(self, conversation_id: int) -> None:
        self.conversation_id = conversation_id
        log = self.log_view
        log.clear()
        for m in self.store.messages(conversation_id):
            if m.role == "user":
                log.add_user(m.content)
            elif m.role == "assistant":
                log.add_answer(
                    spans_from_runs(m.content, m.provenance),
                    streaming=False,
                    meta=answer_meta(m.pair, m.strategy, m.stats or {}, m.finish_reason, m.complete),
                    highlight=self.highlight,
                    token_view=self.token_view,
                )
        self.query_one(ConversationList).mark(conversation_id)
        self.query_one(PromptInput).focus()

    @when_idle
    def action_new_chat(self) -> None:
        self.conversation_id = None
        self.log_view.clear()
        self.query_one(DraftTreePanel).show(None)
        self.status.set(stats=msg.StatsSnapshot())
        self.query_one(ConversationList).mark(None)
        self.query_one(PromptInput).focus()

    @when_idle
    def action_regenerate(self) -> None:
        if self.loaded is None or self.conversation_id is None:
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        stored = self.store.messages(self.conversation_id)
        if stored and stored[-1].role == "assistant":
            with notify_errors(self):
                self.store.delete_message(stored[-1].id)
            last = self.log_view.last_answer()
            if last is not None:
                last.remove()
            stored = stored[:-1]
        if not stored or stored[-1].role != "user":
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        self.start_generation()
