"""Measuring the pair's profile in the chat's idle time: at start and after each answer, in a thread
worker, piece by piece (``ChatEngine.measure``); a key typed in the input stops it within a piece (well
under a second), and it goes on from there in the next idle time: after the answer, or once the typing
pauses. No answer waits for it: until it is complete, ``auto`` decodes plainly or copies from the
conversation."""

from __future__ import annotations

import threading
from collections.abc import Callable

from textual import work
from textual.timer import Timer
from textual.widget import Widget

from .. import messages as msg

TYPING_PAUSE = 5.0  # seconds without a key in the input before measuring goes on


class IdleMeasuring(Widget):
    """No display: the worker, and what stops it. Drives the engine only while the chat's ``idle``
    event is clear (it clears it), so an answer never runs beside it."""

    DEFAULT_CSS = "IdleMeasuring { display: none; }"

    def __init__(self) -> None:
        super().__init__()
        self.halt = threading.Event()  # set: stop before the next piece
        self.finished = threading.Event()  # set while no measuring worker runs
        self.finished.set()
        self.failed = False  # it failed once: not tried again on this pair
        self._resume: Timer | None = None

    def start(self, engine, idle: threading.Event) -> None:
        """Measure on ``engine`` until complete or ``stop``; ``idle`` (the chat's) is clear meanwhile."""
        if not self.finished.is_set() or self.failed:
            return
        self.halt.clear()
        self.finished.clear()
        idle.clear()
        self._measure(engine, idle)

    def stop(self, wait: float = 0.0) -> bool:
        """Ask the worker to stop; wait up to ``wait`` seconds for it. True when none runs now."""
        self.halt.set()
        return self.finished.wait(wait)

    def pause(self, resume: Callable[[], None]) -> None:
        """A key in the input: stop, and call ``resume`` once ``TYPING_PAUSE`` seconds pass without
        another (each key starts the wait again)."""
        self.stop()
        if self._resume is not None:
            self._resume.stop()
        self._resume = self.set_timer(TYPING_PAUSE, resume)

    @work(thread=True, group="measure", exit_on_error=False)
    def _measure(self, engine, idle: threading.Event) -> None:
        post = self.post_message
        complete, error = False, ""
        try:
            complete = engine.measure(
                self.halt.is_set, lambda what, done, total: post(msg.MeasureProgress(done, total))
            )
        except Exception as exc:  # optional work: answers go on without the profile
            self.failed, error = True, f"measuring the pair failed ({exc}); answers go on without its profile"
        finally:
            idle.set()  # before ``finished``: an answer waiting for it clears ``idle`` after this
            self.finished.set()
            post(msg.MeasureEnded(complete, error))
