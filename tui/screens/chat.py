"""The chat screen: conversation list, messages, input, draft-tree panel and status bar.

Blocking work runs in thread workers: loading a pair (``_load``) and generating an answer
(``_generate``). Workers never touch widgets; they post the messages of ``tui.messages`` and the
handlers here update the view and the history file, on the UI thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from time import monotonic

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer

from edgespec.decoding.chat import ChatSettings, Message
from edgespec.decoding.events import GenerationStats
from edgespec.errors import EdgespecError

from .. import messages as msg
from ..backend import (
    Backend,
    LoadedPair,
    RollingRate,
    StrategyChoice,
    provenance_runs,
    provenance_spans,
    spans_from_runs,
    stats_snapshot,
    tree_snapshot,
)
from ..storage import ChatStore, title_from
from ..widgets.chat_log import AnswerMessage, ChatLog, answer_meta
from ..widgets.prompt import PromptInput
from ..widgets.sidebar import ConversationList
from ..widgets.status_bar import StatusBar
from ..widgets.tree_panel import DraftTreePanel
from .dialogs import ConfirmScreen, PickScreen, TextScreen
from .loading import LoadingScreen
from .options import SettingsScreen, StrategyScreen

SAVE_INTERVAL = 1.0  # seconds between saves of the answer in flight
UI_INTERVAL = 0.1  # seconds between stats / tree updates from the worker
BUDGETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class Generation:
    """The answer in flight."""

    id: int
    conversation_id: int
    answer: AnswerMessage
    cancel: threading.Event
    pair: str
    strategy: str
    message_id: int | None = None  # the row of the partial answer, once saved
    last_save: float = 0.0


class ChatScreen(Screen):
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+r", "regenerate", "Regenerate"),
        Binding("ctrl+y", "copy_answer", "Copy"),
        Binding("ctrl+s", "pick_strategy", "Strategy"),
        Binding("ctrl+o", "pick_pair", "Pair"),
        Binding("f2", "settings", "Settings"),
        Binding("ctrl+b", "toggle_sidebar", "Chats"),
        Binding("ctrl+t", "toggle_tree", "Tree"),
        Binding("ctrl+l", "toggle_highlight", "Highlight"),
        Binding("f3", "toggle_token_view", "Token view"),
        Binding("f4", "export", "Export"),
        Binding("f5", "rename", "Rename", show=False),
        Binding("f8", "delete", "Delete", show=False),
    ]

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
        self.gen: Generation | None = None
        self._gen_counter = 0
        self._idle = threading.Event()  # set while no generation worker runs
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

    def on_mount(self) -> None:
        self.query_one(DraftTreePanel).display = False
        self._guard(self._mark_cut_off)
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

    def _guard(self, action) -> bool:
        """Run ``action``; an EdgespecError becomes an error notification. Returns success."""
        try:
            action()
        except EdgespecError as exc:
            self.notify(str(exc), severity="error", timeout=12)
            return False
        return True

    # -- loading a pair -------------------------------------------------------------------------------
    def load_pair(self, pair: str | None) -> None:
        if self.gen is not None:
            self.notify("An answer is streaming: stop it first (Esc).", severity="warning")
            return
        if self.loaded is not None:
            self._fallback = self.loaded.name
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
        self.status.set(
            state="ready", pair=self.loaded.name, n_ctx=self.loaded.engine.n_ctx, stats=msg.StatsSnapshot()
        )
        choice = self.strategy if self.strategy_chosen and self.strategy else self.loaded.defaults
        if not self.set_strategy(choice, chosen=self.strategy_chosen):
            self.set_strategy(self.loaded.defaults)
        self.query_one(PromptInput).focus()

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
        if planner is not None and planner.needs_draft and not self.loaded.engine.has_draft:
            self.notify(
                f"{self.loaded.name} was loaded without a draft model, so only plain decoding ('none') "
                "and copying from the conversation ('ngram') work. Start edgespec chat with --draft to "
                "speculate.",
                severity="error",
            )
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
        if not text:
            return
        if self.gen is not None:
            self.notify("An answer is still streaming: wait, or stop it with Esc.", severity="warning")
            return
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
        self._guard(lambda: self._send(text))

    def _send(self, text: str) -> None:
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
            id=self._gen_counter,
            conversation_id=self.conversation_id,
            answer=answer,
            cancel=threading.Event(),
            pair=self.loaded.name,
            strategy=self.strategy_label,
            last_save=monotonic(),
        )
        self.status.set(state="generating", stats=msg.StatsSnapshot())
        self._idle.clear()
        self._generate(self.loaded.engine, self.planner, history, self.settings, self.gen.cancel, self.gen.id)

    @work(thread=True, group="generate", exit_on_error=False)
    def _generate(self, engine, planner, history, settings, cancel, gen_id: int) -> None:
        """The generation worker: streams the answer and reports through messages only."""
        stats, rate = GenerationStats(), RollingRate()
        post = self.post_message
        last_ui, last_tree, finish = 0.0, None, "stop"
        label = ""

        def measuring(what: str, done: int, total: int) -> None:
            post(msg.StrategyStatus(gen_id, f"{planner.name}: measuring the cost profile {done}/{total}"))

        try:
            engine.prepare(planner, measuring)
            for event in engine.stream(planner, history, settings, cancel, stats):
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
            self._idle.set()
        post(msg.GenerationEnded(gen_id, finish, stats.as_dict()))

    def _current(self, event: msg.GenerationMessage) -> Generation | None:
        return self.gen if self.gen is not None and self.gen.id == event.gen_id else None

    @on(msg.Streamed)
    def _streamed(self, event: msg.Streamed) -> None:
        gen = self._current(event)
        if gen is None:
            return
        gen.answer.append(event.spans)
        if monotonic() - gen.last_save >= SAVE_INTERVAL:
            self._guard(lambda: self._save(gen, complete=False))

    @on(msg.StatsUpdated)
    def _stats_updated(self, event: msg.StatsUpdated) -> None:
        if self._current(event) is not None:
            self.status.set(stats=event.stats)

    @on(msg.StrategyStatus)
    def _strategy_status(self, event: msg.StrategyStatus) -> None:
        if self._current(event) is not None:
            self.status.set(strategy=event.label)

    @on(msg.TreeUpdated)
    def _tree_updated(self, event: msg.TreeUpdated) -> None:
        if self._current(event) is not None:
            self.query_one(DraftTreePanel).show(event.tree)

    @on(msg.GenerationEnded)
    def _generation_ended(self, event: msg.GenerationEnded) -> None:
        gen = self._current(event)
        if gen is None:
            return
        self._finish(gen, event.finish_reason, event.stats)
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
        gen = self._current(event)
        if gen is None:
            return
        self._finish(gen, "error", event.stats)
        self.notify(event.error, title="Generation failed", severity="error", timeout=20)

    def _finish(self, gen: Generation, finish: str, stats: dict) -> None:
        self.gen = None
        meta = answer_meta(gen.pair, gen.strategy, stats, finish)
        gen.answer.finish(meta)
        if finish != "error" or gen.answer.text or gen.message_id is not None:
            self._guard(lambda: self._save(gen, complete=True, stats=stats, finish=finish))
        self.status.set(state="ready", strategy=self.strategy_label)
        self.refresh_sidebar()

    def _save(
        self, gen: Generation, complete: bool, stats: dict | None = None, finish: str | None = None
    ) -> None:
        gen.last_save = monotonic()
        text, runs = gen.answer.text, provenance_runs(gen.answer.spans)
        if gen.message_id is None:
            gen.message_id = self.store.add_message(
                gen.conversation_id,
                "assistant",
                text,
                complete=complete,
                pair=gen.pair,
                strategy=gen.strategy,
                stats=stats,
                finish_reason=finish,
                provenance=runs,
            )
        else:
            self.store.update_message(
                gen.message_id, text, complete=complete, stats=stats, finish_reason=finish, provenance=runs
            )

    def action_stop(self) -> None:
        if self.gen is not None:
            self.gen.cancel.set()  # the loop stops before its next step
            self.status.set(state="stopping")

    def on_unmount(self) -> None:
        self.shutdown()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the answer in flight, wait for its worker, free the models (called on exit)."""
        if self.gen is not None:
            self.gen.cancel.set()
        if self._idle.wait(timeout) and self.loaded is not None:
            self.loaded.engine.close()
            self.loaded = None

    # -- conversations --------------------------------------------------------------------------------
    def refresh_sidebar(self) -> None:
        self.query_one(ConversationList).show(self.store.conversations(), self.conversation_id)

    @on(ConversationList.Opened)
    def _opened(self, event: ConversationList.Opened) -> None:
        self.open_conversation(event.conversation_id)

    def open_conversation(self, conversation_id: int) -> None:
        if self.gen is not None:
            self.notify("An answer is streaming: stop it first (Esc).", severity="warning")
            return
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

    def action_new_chat(self) -> None:
        if self.gen is not None:
            self.notify("An answer is streaming: stop it first (Esc).", severity="warning")
            return
        self.conversation_id = None
        self.log_view.clear()
        self.query_one(DraftTreePanel).show(None)
        self.status.set(stats=msg.StatsSnapshot())
        self.query_one(ConversationList).mark(None)
        self.query_one(PromptInput).focus()

    def action_regenerate(self) -> None:
        if self.gen is not None:
            self.notify("An answer is streaming: stop it first (Esc).", severity="warning")
            return
        if self.loaded is None or self.conversation_id is None:
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        stored = self.store.messages(self.conversation_id)
        if stored and stored[-1].role == "assistant":
            self._guard(lambda: self.store.delete_message(stored[-1].id))
            last = self.log_view.last_answer()
            if last is not None:
                last.remove()
            stored = stored[:-1]
        if not stored or stored[-1].role != "user":
            self.notify("Nothing to regenerate yet.", severity="warning")
            return
        self.start_generation()

    def action_copy_answer(self) -> None:
        answer = self.log_view.last_answer()
        if answer is None or not answer.text:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(answer.text)
        self.notify(f"Copied the last answer ({len(answer.text)} characters).")

    def action_export(self) -> None:
        if self.conversation_id is None:
            self.notify("Nothing to export: this chat is empty.", severity="warning")
            return
        cid = self.conversation_id

        def export() -> None:
            path = self.store.export_markdown(cid)
            self.notify(f"Exported to {path}", title="Export")

        self._guard(export)

    def action_rename(self) -> None:
        if self.conversation_id is None:
            self.notify("Nothing to rename: this chat is empty.", severity="warning")
            return
        cid = self.conversation_id
        current = self.store.conversation(cid)

        def done(title: str | None) -> None:
            if title:
                self._guard(lambda: self.store.rename(cid, title))
                self.refresh_sidebar()

        self.app.push_screen(TextScreen("Rename chat", current.title if current else ""), done)

    def action_delete(self) -> None:
        if self.conversation_id is None:
            self.notify("Nothing to delete: this chat is empty.", severity="warning")
            return
        if self.gen is not None:
            self.notify("An answer is streaming: stop it first (Esc).", severity="warning")
            return
        cid = self.conversation_id
        current = self.store.conversation(cid)

        def done(yes: bool | None) -> None:
            if yes:
                self._guard(lambda: self.store.delete_conversation(cid))
                self.action_new_chat()
                self.refresh_sidebar()

        self.app.push_screen(ConfirmScreen(f"Delete “{current.title if current else cid}”?"), done)

    # -- choosing strategy, pair, settings ------------------------------------------------------------
    def action_pick_strategy(self) -> None:
        if self.loaded is None or self.strategy is None:
            self.notify("No model is loaded yet.", severity="warning")
            return

        def done(choice: StrategyChoice | None) -> None:
            if choice is not None and self.set_strategy(choice, chosen=True):
                self.notify(f"Strategy: {self.strategy_label}")

        self.app.push_screen(StrategyScreen(self.backend.strategies, self.strategy), done)

    def choose_strategy(self, name: str) -> None:
        budget = self.strategy.budget if self.strategy else None
        if self.set_strategy(StrategyChoice(name).with_budget(budget), chosen=True):
            self.notify(f"Strategy: {self.strategy_label}")

    def choose_budget(self, budget: int) -> None:
        if self.strategy is not None and self.set_strategy(self.strategy.with_budget(budget), chosen=True):
            self.notify(f"Strategy: {self.strategy_label}")

    def action_pick_pair(self) -> None:
        try:
            pairs = self.backend.pairs()
        except EdgespecError as exc:
            self.notify(str(exc), severity="error")
            return
        if not pairs:
            self.notify(
                "No installed pairs. Install one with `edgespec models pull PAIR`.", severity="warning"
            )
            return
        current = self.loaded.name if self.loaded else None

        def done(pair: str | None) -> None:
            if pair and pair != current:
                self.load_pair(pair)

        self.app.push_screen(
            PickScreen("Switch pair (installed pairs)", [(p, p) for p in pairs], current), done
        )

    def action_settings(self) -> None:
        def done(settings: ChatSettings | None) -> None:
            if settings is not None:
                self.settings = settings
                self.notify("Settings saved; they apply from the next answer.")

        self.app.push_screen(SettingsScreen(self.settings), done)

    # -- view toggles ---------------------------------------------------------------------------------
    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one(ConversationList)
        sidebar.display = not sidebar.display

    def action_toggle_tree(self) -> None:
        panel = self.query_one(DraftTreePanel)
        panel.display = not panel.display
        if panel.display:
            panel.redraw()

    def action_toggle_highlight(self) -> None:
        self.highlight = not self.highlight
        self._apply_view()
        self.notify(f"Provenance highlighting {'on' if self.highlight else 'off'}.")

    def action_toggle_token_view(self) -> None:
        self.token_view = not self.token_view
        self._apply_view()
        self.notify(
            "Finished answers: " + ("tokens coloured by provenance." if self.token_view else "Markdown.")
        )

    def _apply_view(self) -> None:
        for answer in self.log_view.answers():
            answer.set_view(self.highlight, self.token_view)

    # -- command palette --------------------------------------------------------------------------------
    def palette_commands(self) -> list[tuple[str, str, object]]:
        """(title, help, callback) for the command palette."""
        commands = [
            ("New chat", "start an empty conversation (ctrl+n)", self.action_new_chat),
            ("Stop generation", "stop the answer at the next step (Esc)", self.action_stop),
            ("Regenerate", "answer the last message again (ctrl+r)", self.action_regenerate),
            ("Copy last answer", "to the clipboard (ctrl+y)", self.action_copy_answer),
            ("Switch strategy…", "drafting strategy and budget (ctrl+s)", self.action_pick_strategy),
            ("Switch pair…", "load another installed target/draft pair (ctrl+o)", self.action_pick_pair),
            ("Settings…", "temperature, top-p, max tokens, system prompt (F2)", self.action_settings),
            ("Export to Markdown", "write this chat to a .md file (F4)", self.action_export),
            ("Rename chat…", "give this chat a title (F5)", self.action_rename),
            ("Delete chat…", "remove this chat from the history (F8)", self.action_delete),
            ("Toggle chat list", "show or hide the sidebar (ctrl+b)", self.action_toggle_sidebar),
            ("Toggle draft tree", "show the last step's tree (ctrl+t)", self.action_toggle_tree),
            ("Toggle highlighting", "colour tokens by provenance (ctrl+l)", self.action_toggle_highlight),
            (
                "Toggle token view",
                "finished answers as coloured tokens or Markdown (F3)",
                self.action_toggle_token_view,
            ),
        ]
        for name in self.backend.strategies:
            commands.append(
                (
                    f"Strategy: {name}",
                    "draft the next answers with this strategy",
                    _bind(self.choose_strategy, name),
                )
            )
        for budget in BUDGETS:
            commands.append((f"Budget: {budget}", "draft tokens per step", _bind(self.choose_budget, budget)))
        for conversation in self.store.conversations()[:50]:
            commands.append(
                (
                    f"Open chat: {conversation.title}",
                    "from the history",
                    _bind(self.open_conversation, conversation.id),
                )
            )
        return commands


def _bind(function, value):
    return lambda: function(value)


def strategy_label(planner) -> str:
    """The status bar's strategy field: name and what it is doing (auto's changes as it runs)."""
    if planner is None:
        return "none (plain decoding)"
    return f"{planner.name} {planner.describe()}".strip()
