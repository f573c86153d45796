"""The two guards of the chat screen's commands, each written once.

``notify_errors``: an EdgespecError (a history file that cannot be written, an export that fails)
becomes an error notification instead of a crash. ``when_idle``: a command that would disturb the
answer being generated is refused while it streams.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

from textual.widget import Widget

from edgespec.errors import EdgespecError


@contextmanager
def notify_errors(node: Widget) -> Iterator[None]:
    """Run the block; an EdgespecError ends it and is shown as an error notification."""
    try:
        yield
    except EdgespecError as exc:
        node.notify(str(exc), severity="error", timeout=12)


def when_idle(command):
    """Decorate a ChatScreen method: while an answer streams (``self.gen``), say so and do nothing."""

    @functools.wraps(command)
    def guarded(screen, *args, **kwargs):
        if screen.gen is not None:
            screen.notify("An answer is streaming: stop it first (Esc).", severity="warning")
            return
        command(screen, *args, **kwargs)

    return guarded
