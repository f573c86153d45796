"""One Rich progress bar for the training commands: done/total, elapsed, ETA and a free-text status."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..progress import LogLines

LOG_EVERY_S = 30.0


@contextmanager
def progress(title: str, total: int, done: int = 0) -> Iterator[Callable[[int, str], None]]:
    """Yields ``update(done, status)``; the bar is on stderr and stays after it ends (a log line).

    When stderr is not a terminal (``nohup … > log``) a plain line is printed every ``LOG_EVERY_S``
    seconds instead, with the same figures and an ETA from the mean rate so far.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:
        yield _log_lines(console, title, total, done)
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
    ) as bar:
        task = bar.add_task(title, total=total, completed=done, status="")

        def update(completed: int, status: str = "") -> None:
            bar.update(task, completed=completed, status=status)

        yield update


def _log_lines(console, title: str, total: int, first: int) -> Callable[[int, str], None]:
    lines = LogLines(title, console, every=LOG_EVERY_S, at_once=True)  # the first update at once

    def update(completed: int, status: str = "") -> None:
        if not lines.due() and completed < total:
            return
        rate = (completed - first) / max(lines.elapsed, 1e-9)
        eta = (total - completed) / rate if rate > 0 else float("nan")
        lines.say(f"{completed}/{total} elapsed {lines.elapsed:.0f}s ETA {eta:.0f}s {status}")

    return update
