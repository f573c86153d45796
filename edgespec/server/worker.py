"""The one generation thread: it loads the model pair, owns it, and answers queued jobs in arrival order.

The pair comes from the chat facade (``edgespec.session``, shared with the chat app): ``load`` returns
a ``ChatSession``, the pair and the planner every answer drafts with. llama.cpp contexts are not
thread-safe (the engine raises ``EngineError`` on concurrent use), so no other thread ever touches
the pair: HTTP handlers only enqueue a ``Job`` and read what it delivers. Each answer starts from
empty KV caches (``engine.forget()``): a cancelled or finished request can never change the next
one's tokens, at the price of decoding every prompt in full.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ..decoding.events import GenerationStats
from ..session import ChatSession
from .protocol import ChatRequest

DONE = object()  # delivered last, after the events (and the error, if any)


@dataclass
class Job:
    request: ChatRequest
    deliver: Callable[[object], None]  # called on the worker thread: each StepEvent, an Exception, DONE
    cancel: threading.Event = field(default_factory=threading.Event)
    stats: GenerationStats = field(default_factory=GenerationStats)


class QueueFull(Exception):
    pass


class Worker:
    def __init__(self, load: Callable[[], ChatSession], max_queue: int = 8):
        self._load = load  # runs on the worker thread
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self.session: ChatSession | None = None
        self._current: Job | None = None
        self._thread = threading.Thread(target=self._run, name="edgespec-generation", daemon=True)

    def start(self) -> ChatSession:
        """Start the thread and wait until the pair is loaded (re-raises a load error here)."""
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error
        return self.session

    def submit(self, job: Job) -> None:
        """Queue ``job`` behind the others; ``QueueFull`` when ``max_queue`` jobs already wait."""
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what waits, let the current answer stop at its next step, close the pair."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel.set()
                job.deliver(DONE)
        if self._current is not None:
            self._current.cancel.set()
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self.session = self._load()
        except BaseException as exc:  # reported by start() on the caller's thread
            self._load_error = exc
            return
        finally:
            self._ready.set()
        try:
            while (job := self._jobs.get()) is not None:
                self._answer(job)
        finally:
            self.session.close()

    def _answer(self, job: Job) -> None:
        session, self._current = self.session, job
        try:
            if job.cancel.is_set():  # the client left while it waited
                return
            session.engine.forget()
            request = job.request
            for event in session.stream(request.messages, request.settings, job.cancel, job.stats):
                job.deliver(event)
        except Exception as exc:  # the handler turns it into an error response; the server goes on
            job.deliver(exc)
        finally:
            self._current = None
            job.deliver(DONE)
