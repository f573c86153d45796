"""The input line, with a history of what was sent (up/down)."""

from __future__ import annotations

from textual import events
from textual.widgets import Input


class PromptInput(Input):
    """Enter sends; up/down walk the history of sent messages (the draft being typed is kept)."""

    def __init__(self, history: list[str] | None = None) -> None:
        super().__init__(placeholder="Message (Enter to send, ctrl+p for commands)", id="prompt")
        self.history: list[str] = list(history or [])
        self._index = len(self.history)  # == len(history): editing a new message
        self._draft = ""

    def remember(self, text: str) -> None:
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._index = len(self.history)
        self._draft = ""

    def _on_key(self, event: events.Key) -> None:
        if event.key == "up" and self.history:
            if self._index == len(self.history):
                self._draft = self.value
            self._index = max(0, self._index - 1)
            self._show(self.history[self._index])
        elif event.key == "down" and self._index < len(self.history):
            self._index += 1
            self._show(self.history[self._index] if self._index < len(self.history) else self._draft)
        else:
            return
        event.stop()
        event.prevent_default()

    def _show(self, text: str) -> None:
        self.value = text
        self.cursor_position = len(text)
