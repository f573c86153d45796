"""How the model store shows a long step (assemble, download, check a sha256): a rich bar on stderr per
labelled step on a terminal, plain log lines elsewhere (Docker, CI), or nothing; ``tee`` also feeds a
caller's own progress callback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from ..progress import LogLines
from .paths import ProgressCallback, format_bytes

Reporter = Callable[[str], ProgressCallback]  # a progress callback for a labelled step


@contextmanager
def reporter(enabled: bool) -> Iterator[Reporter]:
    """Yields ``report(label) -> callback``: each label gets a rich bar on stderr (or nothing if disabled)."""
    if not enabled:
        yield lambda label: _ignore
        return
    console = Console(stderr=True)
    if not console.is_terminal:  # a log (Docker, CI): plain lines, where a bar shows nothing till the end
        yield lambda label: _logged(LogLines(label, console, at_once=True))
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bar:

        def report(label: str) -> ProgressCallback:
            tasks = []  # the bar appears with the first report, not before (e.g. while the hub is asked)

            def update(done: int, total: int) -> None:
                if not tasks:
                    tasks.append(bar.add_task(label, total=None))
                bar.update(tasks[0], completed=done, total=total or None)

            return update

        yield report


def _logged(lines: LogLines) -> ProgressCallback:
    """A step's progress as log lines: when it starts, every ``LOG_EVERY_S`` seconds, when it ends."""
    ended = [False]

    def update(done: int, total: int) -> None:
        if ended[0]:
            return
        ended[0] = bool(total) and done >= total
        if lines.due() or ended[0]:
            of = f" of {format_bytes(total)}" if total else ""
            lines.say(f"{format_bytes(done)}{of} ({lines.elapsed:.0f} s)")

    return update


def _ignore(done: int, total: int) -> None:
    return None


def tee(first: ProgressCallback, second: ProgressCallback | None) -> ProgressCallback:
    if second is None:
        return first

    def both(done: int, total: int) -> None:
        first(done, total)
        second(done, total)

    return both
