"""Progress of long measurements (a pair's cost profile, a bench, tuning), as a ``Progress`` callback
``update(what, done, total)``: a Rich bar on a terminal; where the console is a file or a pipe (a
script, a CI log, ``nohup … > log``), where a bar would show nothing, plain lines instead — one when
the work starts, one every ``LOG_EVERY_S`` seconds with the step and the count, one when it ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import monotonic

Progress = Callable[[str, int, int], None]  # (what, done, total)
LOG_EVERY_S = 15.0


@contextmanager
def progress_bar(title: str, console=None) -> Iterator[Progress]:
    """A progress display for ``title`` on ``console`` (default stderr), as a ``Progress`` callback."""
    from rich.console import Console

    console = console or Console(stderr=True)
    if not console.is_terminal:
        with _log_lines(title, console) as update:
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
def _log_lines(title: str, console) -> Iterator[Progress]:
    start = monotonic()
    last = [start]  # when the last line was printed

    def say(text: str) -> None:
        console.print(f"{title}: {text}", highlight=False, markup=False, soft_wrap=True)

    def update(what: str, done: int, total: int) -> None:
        now = monotonic()
        if now - last[0] >= LOG_EVERY_S:
            last[0] = now
            count = f" {done}/{total}" if total else ""
            say(f"{what}{count} ({now - start:.0f} s)")

    say("started")
    try:
        yield update
    except BaseException:
        say(f"stopped after {monotonic() - start:.0f} s")
        raise
    say(f"done in {monotonic() - start:.0f} s")
