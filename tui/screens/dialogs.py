"""Small modal dialogs: pick one of a list, enter a line of text, confirm."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList
from textual.widgets.option_list import Option, OptionDoesNotExist


class Dialog(ModalScreen):
    """A modal dialog that Esc closes with no result."""

    BINDINGS = [Binding("escape", "close", "Cancel")]

    def action_close(self) -> None:
        self.dismiss(None)


class PickScreen(Dialog):
    """Choose one of ``choices``; returns its value (or None)."""

    def __init__(self, title: str, choices: list[tuple[str, str]], current: str | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.choices = choices  # (label, value)
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            options = [
                Option(label + ("  ●" if value == self.current else ""), id=value)
                for label, value in self.choices
            ]
            yield OptionList(*options, id="pick")

    def on_mount(self) -> None:
        pick = self.query_one(OptionList)
        if self.current is not None:
            try:
                pick.highlighted = pick.get_option_index(self.current)
            except OptionDoesNotExist:
                pass
        pick.focus()

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)


class TextScreen(Dialog):
    """Enter one line of text; returns it (or None)."""

    def __init__(self, title: str, value: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Input(self.value, id="text")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)


class ConfirmScreen(Dialog):
    """Yes / no; returns True or None."""

    BINDINGS = [Binding("escape", "close", "Cancel"), Binding("y", "yes", "Yes"), Binding("n", "close", "No")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="dialog-title")
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", id="no")

    def action_yes(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(True if event.button.id == "yes" else None)
