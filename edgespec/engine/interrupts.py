"""Stopping long work: a decode whose client left (``Cancelled``), and Ctrl-C while llama.cpp works
inside one long C call (loading a model, creating a context).

Python runs a signal handler only between bytecodes; during a load that is inside llama.cpp's log
callback, where a ``KeyboardInterrupt`` cannot propagate: ctypes prints "Exception ignored on calling
ctypes callback" and the load goes on as if nothing happened. ``held_interrupt`` instead notes the
Ctrl-C and raises ``KeyboardInterrupt`` as soon as the call returns (a load is seconds).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Cancelled(Exception):
    """A cancellable decode (``CachedModel.decode_committed``) stopped: its cancel event was set."""


@contextmanager
def held_interrupt() -> Iterator[None]:
    """Hold SIGINT for the block and raise ``KeyboardInterrupt`` after it if one came (also in place
    of an error the interrupted block raised). Only on the main thread with Python's own handler
    installed; elsewhere (the chat app's loading worker) a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    came: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    except BaseException:
        if not came:
            raise
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if came:
        raise KeyboardInterrupt
