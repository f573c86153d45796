"""The chat screen's commands: its keys, the command palette, and the actions that need no orchestration.

``Commands`` is mixed into ``ChatScreen``. Its actions open a dialog (strategy, pair, settings, rename,
delete) or act on the open conversation and the view; they use the screen's backend, store, loaded
pair, strategy and conversation, and hand the user's choice back to the screen (``set_strategy``,
``load_pair``, ``open_conversation``, ``action_new_chat``). Sending, regenerating, stopping and
loading stay in the screen.
"""

from __future__ import annotations

from textual.binding import Binding

from edgespec.decoding.chat import ChatSettings
from edgespec.errors import EdgespecError
from edgespec.strategy import StrategyChoice

from .guards import notify_errors, when_idle
from .screens.dialogs import ConfirmScreen, PickScreen, TextScreen
from .screens.options import SettingsScreen, StrategyScreen
from .widgets.sidebar import ConversationList
from .widgets.tree_panel import DraftTreePanel

BUDGETS = (1, 2, 4, 8, 16, 32, 64)  # the palette's "Budget: N" commands
KEYS = [  # ChatScreen.BINDINGS; the palette lists the same commands (palette_commands)
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


class Commands:
    """ChatScreen's actions that open a dialog or act on the open conversation and the view."""

    # -- strategy, pair, settings ---------------------------------------------------------------------
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

    # -- the open conversation ------------------------------------------------------------------------
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
        with notify_errors(self):
            path = self.store.export_markdown(self.conversation_id)
            self.notify(f"Exported to {path}", title="Export")

    def action_rename(self) -> None:
        if self.conversation_id is None:
            self.notify("Nothing to rename: this chat is empty.", severity="warning")
            return
        cid = self.conversation_id
        current = self.store.conversation(cid)

        def done(title: str | None) -> None:
            if title:
                with notify_errors(self):
                    self.store.rename(cid, title)
                self.refresh_sidebar()

        self.app.push_screen(TextScreen("Rename chat", current.title if current else ""), done)

    @when_idle
    def action_delete(self) -> None:
        if self.conversation_id is None:
            self.notify("Nothing to delete: this chat is empty.", severity="warning")
            return
        cid = self.conversation_id
        current = self.store.conversation(cid)

        def done(yes: bool | None) -> None:
            if yes:
                with notify_errors(self):
                    self.store.delete_conversation(cid)
                self.action_new_chat()
                self.refresh_sidebar()

        self.app.push_screen(ConfirmScreen(f"Delete “{current.title if current else cid}”?"), done)

    # -- view -----------------------------------------------------------------------------------------
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

    # -- the command palette --------------------------------------------------------------------------
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
