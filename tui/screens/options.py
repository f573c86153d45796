"""Modal forms: the drafting strategy and budget, and the sampling settings."""

from __future__ import annotations

from dataclasses import replace

from textual import on
from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Button, Input, Label, Select, TextArea

from edgespec.decoding import checks
from edgespec.decoding.chat import ChatSettings
from edgespec.strategy import StrategyChoice

from .dialogs import Dialog


class StrategyScreen(Dialog):
    """Pick the strategy and the draft budget (tokens per step); returns a ``StrategyChoice``."""

    def __init__(self, strategies: tuple[str, ...], current: StrategyChoice) -> None:
        super().__init__()
        # the current strategy is always offered (a pair may recommend one the list does not name)
        self.strategies = strategies if current.name in strategies else (*strategies, current.name)
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Drafting strategy", classes="dialog-title")
            with Grid(classes="form"):
                yield Label("strategy")
                yield Select(
                    [(s, s) for s in self.strategies],
                    value=self.current.name,
                    allow_blank=False,
                    id="strategy",
                )
                yield Label("budget")
                budget = self.current.budget
                yield Input(
                    "" if budget is None else str(budget), placeholder="draft tokens per step", id="budget"
                )
            yield Label("", id="error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Apply", variant="primary", id="apply")
                yield Button("Cancel", id="cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#apply")
    def apply(self) -> None:
        name = str(self.query_one("#strategy", Select).value)
        text = self.query_one("#budget", Input).value.strip()
        if text and (not text.isdigit() or int(text) < 1):
            self.query_one("#error", Label).update(
                "budget must be a whole number ≥ 1 (draft tokens per step)"
            )
            return
        params = dict(self.current.params) if name == self.current.name else {}
        self.dismiss(StrategyChoice(name, params).with_budget(int(text) if text else None))

    @on(Button.Pressed, "#cancel")
    def cancel(self) -> None:
        self.dismiss(None)


class SettingsScreen(Dialog):
    """Temperature, top-p, top-k, max tokens and the system prompt; returns new ``ChatSettings``."""

    def __init__(self, settings: ChatSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical(classes="dialog wide"):
            yield Label("Settings", classes="dialog-title")
            with Grid(classes="form"):
                yield Label("temperature")
                yield Input(f"{s.sampling.temperature:g}", placeholder="0 = greedy", id="temperature")
                yield Label("top-p")
                yield Input(f"{s.sampling.top_p:g}", placeholder="1 = off", id="top_p")
                yield Label("top-k")
                yield Input(str(s.sampling.top_k), placeholder="0 = off", id="top_k")
                yield Label("max tokens")
                yield Input(str(s.max_tokens), id="max_tokens")
            yield Label("system prompt")
            yield TextArea(s.system_prompt, id="system_prompt")
            yield Label("", id="error", classes="error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    @on(Input.Submitted)
    @on(Button.Pressed, "#save")
    def save(self) -> None:
        try:
            settings = self.read()
        except ValueError as exc:
            self.query_one("#error", Label).update(str(exc))
            return
        self.dismiss(settings)

    @on(Button.Pressed, "#cancel")
    def cancel(self) -> None:
        self.dismiss(None)

    def read(self) -> ChatSettings:
        """The form's values, checked as the CLI and the server check them (``SettingError``)."""
        temperature = _number(self, "temperature", float)
        top_p = _number(self, "top_p", float)
        top_k = _number(self, "top_k", int)
        max_tokens = _number(self, "max_tokens", int)
        checks.check_sampling(temperature, top_p, top_k, self.settings.sampling.seed)
        checks.check_max_tokens(max_tokens)
        prompt = self.query_one("#system_prompt", TextArea).text.strip()
        checks.check_text(prompt, "the system prompt")
        sampling = replace(self.settings.sampling, temperature=temperature, top_p=top_p, top_k=top_k)
        return replace(self.settings, sampling=sampling, max_tokens=max_tokens, system_prompt=prompt)


def _number(screen: SettingsScreen, field: str, kind: type):
    text = screen.query_one(f"#{field}", Input).value.strip()
    try:
        return kind(text)
    except ValueError:
        raise checks.SettingError(
            field, f"{field} must be a {'whole ' if kind is int else ''}number, not {text!r}."
        ) from None
