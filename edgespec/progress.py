"""Progress of long work on the console: a pair's cost profile, a bench, tuning, a download, training.

A Rich bar on a terminal. Where the console is a file or a pipe (a script, a CI or Docker log, ``nohup …
> log``), a bar shows nothing until the work ends, so ``LogLines`` writes plain lines instead: when the
work starts, at most one every ``LOG_EVERY_S`` seconds while it runs, and when it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import monotonic

Progress = Callable[[str, int, int], None]  # (what, done, total)
LOG_EVERY_S = 15.0


class LogLines:
    """Progress lines for a log, each ``"<title>: <text>"``; ``due()`` paces them."""

    def __init__(self, title: str, console, every: float | None = None, at_once: bool = False):
        self.title, self.console = title, console
        self.every = LOG_EVERY_S if every is None else every
        self.started = monotonic()
        self._last = self.started - self.every if at_once else self.started  # when the last line was due

    @property
    def elapsed(self) -> float:
        return monotonic() - self.started

    def due(self) -> bool:
        """True at most once every ``every`` seconds (at the first call too when ``at_once``)."""
        now = monotonic()
        if now - self._last < self.every:
            return False
        self._last = now
        return True

    def say(self, text: str) -> None:
        self.console.print(f"{self.title}: {text}", highlight=False, markup=False, soft_wrap=True)


@contextmanager
def progress_bar(title: str, console=None) -> Iterator[Progress]:
    """A progress display for ``title`` on ``console`` (default stderr), as a ``Progress`` callback."""
    from rich.console import Console

    console = console or Console(stderr=True)
    if not console.is_terminal:
        with _logged(LogLines(title, console)) as update:
            yield update
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    with RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(title, total=None)

        def update(what: str, done: int, total: int) -> None:
            # total 0: a stage of unknown length (a pulsing bar, not a full one)
            bar.update(task, description=f"{title}: {what}", completed=done, total=total or None)

        yield update


@contextmanager
def _logged(lines: LogLines) -> Iterator[Progress]:
    def update(what: str, done: int, total: int) -> None:
        if lines.due():
            count = f" {done}/{total}" if total else ""
            lines.say(f"{what}{count} ({lines.elapsed:.0f} s)")

    lines.say("started")
    try:
        yield update
    except BaseException:
        lines.say(f"stopped after {lines.elapsed:.0f} s")
        raise
    lines.say(f"done in {lines.elapsed:.0f} s")
