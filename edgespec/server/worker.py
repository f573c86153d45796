"""The one generation thread: it loads the model pair, owns it, and answers queued jobs in arrival order.

The pair comes from the chat facade (``edgespec.session``, shared with the chat app): ``load`` returns
a ``ChatSession``, the pair and the planner every answer drafts with. llama.cpp contexts are not
thread-safe (the engine raises ``EngineError`` on concurrent use), so no other thread ever touches
the pair: HTTP handlers only enqueue a ``Job`` and read what it delivers. Each answer continues from
the longest prefix of its prompt the caches hold (the prompt cache: ``session.PairEngine``), unless
the server runs with ``--no-prompt-cache``: then each starts from empty caches (``ChatSession``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..decoding.events import GenerationStats
from ..session import ChatSession
from .protocol import ChatRequest

DONE = object()  # delivered last, after the events (and the error, if any)
IDLE_GRACE = 0.5  # seconds without a new job before the work ahead starts


@dataclass
class Job:
    request: ChatRequest  # or a CompletionRequest: anything with run(session, cancel, stats)
    deliver: Callable[[object], None]  # called on the worker thread: each StepEvent, an Exception, DONE
    cancel: threading.Event = field(default_factory=threading.Event)
    stats: GenerationStats = field(default_factory=GenerationStats)


class QueueFull(Exception):
    pass


class Worker:
    """``max_queue``: how many jobs may wait behind the one being answered (0: none). A job whose client
    left (its cancel event set) gives its place up at once."""

    def __init__(self, load: Callable[[], ChatSession], max_queue: int = 8):
        if max_queue < 0:
            raise ValueError(f"max_queue must be 0 or more, not {max_queue}")
        self._load = load  # runs on the worker thread
        self.max_queue = max_queue
        self._jobs: deque[Job | None] = deque()  # None: stop
        self._changed = threading.Condition()
        self._busy = False  # a job is being answered
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
        with self._changed:
            self._drop_cancelled()
            if len(self._jobs) + self._busy > self.max_queue:
                raise QueueFull
            self._jobs.append(job)
            self._changed.notify()

    @property
    def waiting(self) -> int:
        with self._changed:
            self._drop_cancelled()
            return len(self._jobs)

    def _drop_cancelled(self) -> None:
        """Forget waiting jobs whose clients left (their handlers get DONE); under the lock."""
        for job in [j for j in self._jobs if j is not None and j.cancel.is_set()]:
            self._jobs.remove(job)
            job.deliver(DONE)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what waits, let the current answer stop at its next step, close the pair."""
        with self._changed:
            for job in self._jobs:
                if job is not None:
                    job.cancel.set()
                    job.deliver(DONE)
            self._jobs.clear()
            if self._current is not None:
                self._current.cancel.set()
            self._jobs.append(None)
            self._changed.notify()
        self._thread.join(timeout)

    def _next(self) -> Job | None:
        with self._changed:
            self._busy = False
            while not self._jobs:
                self._changed.wait()
            job = self._jobs.popleft()
            self._busy = job is not None
            return job

    def _run(self) -> None:
        try:
            self.session = self._load()
        except BaseException as exc:  # reported by start() on the caller's thread
            self._load_error = exc
            return
        finally:
            self._ready.set()
        try:
            self._work_ahead()  # the pair's profile, unless cached (or measured before listening)
            while (job := self._next()) is not None:
                self._answer(job)
                self._work_ahead()
        finally:
            self.session.close()

    def _work_ahead(self) -> None:
        """While no job waits, the session's work ahead, a piece at a time (a new job waits one piece
        at most): measuring the pair's profile until it is complete (``ChatSession.measure``), then
        reading ahead (``ChatSession.idle``). It starts only once ``IDLE_GRACE`` seconds passed without
        a job: agents and scripts send their next request at once, and it should not wait for a piece
        begun just before it arrived. Optional work: a failure ends it, never the worker."""
        with self._changed:
            if not self._jobs:
                self._changed.wait(IDLE_GRACE)
        try:
            if not self.session.measure(lambda: bool(self._jobs)):
                return
            while not self._jobs and self.session.idle():
                pass
        except Exception:
            pass

    def _answer(self, job: Job) -> None:
        session, self._current = self.session, job
        try:
            if job.cancel.is_set():  # the client left while it waited
                return
            for event in job.request.run(session, job.cancel, job.stats):
                job.deliver(event)
        except Exception as exc:  # the handler turns it into an error response; the server goes on
            job.deliver(exc)
        finally:
            self._current = None
            job.deliver(DONE)
