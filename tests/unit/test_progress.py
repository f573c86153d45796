"""The measurements' progress display: a bar on a terminal, plain lines in a log."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from edgespec import progress
from edgespec.progress import progress_bar


def test_a_log_gets_a_line_when_the_work_starts_while_it_runs_and_when_it_ends(monkeypatch):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)  # every update prints
    log = io.StringIO()
    with progress_bar("measuring this pair", Console(file=log)) as update:
        update("target n=4", 3, 10)
    lines = log.getvalue().splitlines()
    assert lines[0] == "measuring this pair: started"
    assert lines[1].startswith("measuring this pair: target n=4 3/10 (")
    assert lines[2].startswith("measuring this pair: done in ")
    assert len(lines) == 3


def test_a_log_is_not_flooded_by_frequent_updates():
    log = io.StringIO()
    with progress_bar("bench", Console(file=log)) as update:
        for i in range(1000):
            update("prompt", i, 1000)
    assert len(log.getvalue().splitlines()) == 2  # started, done: the updates came within LOG_EVERY_S


def test_a_log_says_when_the_work_was_stopped():
    log = io.StringIO()
    with pytest.raises(KeyboardInterrupt), progress_bar("bench", Console(file=log)):
        raise KeyboardInterrupt
    assert log.getvalue().splitlines()[-1].startswith("bench: stopped after ")


def test_a_terminal_gets_the_bar_and_no_log_lines():
    screen = io.StringIO()
    with progress_bar("bench", Console(file=screen, force_terminal=True, width=80)) as update:
        update("prompt", 1, 2)
    assert "started" not in screen.getvalue() and "done in" not in screen.getvalue()
