"""Shown while a pair is being assembled (bundled models) and loaded into memory."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, LoadingIndicator, ProgressBar

from edgespec.models.paths import format_bytes


class LoadingScreen(ModalScreen):
    def __init__(self, pair: str) -> None:
        super().__init__()
        self.pair = pair

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(f"Loading {self.pair}", classes="dialog-title")
            yield Label("finding the model files…", id="stage")
            yield ProgressBar(total=None, show_eta=False, id="progress")
            yield LoadingIndicator()

    def progress(self, stage: str, done: int, total: int) -> None:
        bar = self.query_one(ProgressBar)
        if total > 0:
            bar.update(total=total, progress=done)
            stage = f"{stage}: {format_bytes(done)} of {format_bytes(total)}"
        else:
            bar.update(total=None)
        self.query_one("#stage", Label).update(stage)
