"""The status bar: what is loaded, how it is drafting, and how well speculation is paying off."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ..messages import StatsSnapshot


class StatusBar(Static):
    """One line: state · pair · strategy (parameters) [LOSSY] · tok/s · MAL · acceptance · context."""

    COMPONENT_CLASSES = {"status--lossy", "status--key", "status--busy", "status--error"}

    def __init__(self) -> None:
        super().__init__(id="status")
        self.state = "starting"  # "loading", "ready", "generating", "stopping", "no model"
        self.pair = "—"
        self.strategy = "—"
        self.lossy = False
        self.n_ctx = 0
        self.stats = StatsSnapshot()

    def on_mount(self) -> None:
        self.refresh_line()

    def set(self, **changes) -> None:
        """Update any of: state, pair, strategy, lossy, n_ctx, stats."""
        for key, value in changes.items():
            if not hasattr(self, key):
                raise AttributeError(f"StatusBar has no field {key!r}")
            setattr(self, key, value)
        self.refresh_line()

    def refresh_line(self) -> None:
        if self.is_mounted:
            self.update(self.status_text())

    def status_text(self) -> Text:
        key = self.get_component_rich_style("status--key") if self.is_mounted else ""
        busy = self.get_component_rich_style("status--busy") if self.is_mounted else ""
        error = self.get_component_rich_style("status--error") if self.is_mounted else ""
        s = self.stats
        line = Text(no_wrap=True, overflow="ellipsis")
        state_style = (
            busy
            if self.state in ("loading", "generating", "stopping")
            else error
            if self.state == "no model"
            else ""
        )
        line.append(f" {self.state} ", style=state_style)
        line.append("│ ")
        line.append(self.pair, style=key)
        line.append(" │ ")
        line.append(self.strategy, style=key)
        if self.lossy:
            line.append(" ")
            line.append(
                " LOSSY ", style=self.get_component_rich_style("status--lossy") if self.is_mounted else ""
            )
        line.append(f" │ {s.tokens_per_second:5.1f} tok/s │ MAL {s.mean_accepted_length:.2f} │ ")
        line.append(f"acc {s.acceptance_rate:.0%}" if s.drafted else "acc —")
        line.append(f" │ ctx {s.context_used}/{self.n_ctx}" if self.n_ctx else " │ ctx —")
        return line
