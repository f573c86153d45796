"""The chat application: a ChatScreen on a backend and a conversation store, plus palette commands."""

from __future__ import annotations

from textual.app import App
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.screen import Screen

from edgespec.decoding.chat import ChatSettings
from edgespec.session import Backend

from .advice_hint import show_first_run_hint
from .screens.chat import ChatScreen
from .storage import ChatStore


class ChatCommands(Provider):
    """The chat screen's commands in the command palette (ctrl+p)."""

    def _commands(self):
        screen = self.screen
        return screen.palette_commands() if isinstance(screen, ChatScreen) else []

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)


class ChatApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "edgespec chat"
    COMMANDS = App.COMMANDS | {ChatCommands}

    def __init__(
        self,
        backend: Backend,
        store: ChatStore,
        settings: ChatSettings | None = None,
        pair: str | None = None,
    ):
        super().__init__()
        self.backend = backend
        self.store = store
        self.settings = settings or ChatSettings()
        self.pair = pair  # None: what the command line asked for

    def get_default_screen(self) -> Screen:
        return ChatScreen(self.backend, self.store, self.settings, self.pair)

    @property
    def chat(self) -> ChatScreen:
        """The chat screen (the bottom of the screen stack)."""
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                return screen
        raise LookupError("the chat screen is not mounted")

    def on_mount(self) -> None:
        show_first_run_hint(self)

    def on_unmount(self) -> None:
        self.store.close()
