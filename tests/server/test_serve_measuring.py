"""`edgespec serve` measures the pair between requests, not before listening (unless --measure-first): a
request that arrives while it measures is answered, the measuring having stopped within a second, and
it goes on from there once the server is idle again. On the real chat facade over the fake pair, its
measurements slowed to a bundled pair's pace."""

from __future__ import annotations

import threading
import time

import pytest

from edgespec.decoding.chat import ChatSettings, Message
from edgespec.planner.auto import AutoPlanner
from edgespec.profile import costs
from edgespec.server.worker import DONE, Job, Worker
from edgespec.session import ChatSession, PairEngine
from tests.support.fake_llama import ChatFakePair

PIECE = 0.15  # seconds a timed decode takes here (the 1.5B's 33-token verify: ~0.3 s a piece)


def test_a_request_stops_the_measuring_and_is_answered(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    pieces: list[float] = []
    for curve, timer in list(costs.TIMERS.items()):

        def slow(pair, base, n, timer=timer):
            time.sleep(PIECE / 2)
            pieces.append(time.monotonic())
            return timer(pair, base, n)

        monkeypatch.setitem(costs.TIMERS, curve, slow)
    engine = PairEngine(ChatFakePair(n_seq=17))
    measured: list[tuple[float, bool]] = []  # (when ``measure`` returned, complete)
    measure = engine.measure
    monkeypatch.setattr(
        engine,
        "measure",
        lambda stop, progress: measured.append((time.monotonic(), m := measure(stop, progress))) or m,
    )
    session = ChatSession(engine, AutoPlanner(), "auto", "fake-pair")
    question = [Message("user", "hello there")]
    events, done = [], threading.Event()

    class Ask:
        def run(self, session, cancel, stats):
            return session.stream(question, ChatSettings(max_tokens=6), cancel, stats)

    worker = Worker(lambda: session)
    worker.start()  # listening at once: nothing measured before
    try:
        deadline = time.monotonic() + 30
        while len(pieces) < 6 and time.monotonic() < deadline:  # measuring, between requests
            time.sleep(0.02)
        assert len(pieces) >= 6 and not measured
        sent = time.monotonic()
        worker.submit(Job(Ask(), lambda item: done.set() if item is DONE else events.append(item)))
        assert done.wait(30)
        stopped, complete = measured[0]
        assert not complete and stopped - sent < 1.0  # it stopped for the request within a second
        assert "".join(e.text for e in events if not isinstance(e, Exception)) and events[-1].finish_reason
        assert session.planner.costs is None  # answered without a profile
        before = len(pieces)
        deadline = time.monotonic() + 30
        while len(pieces) == before and time.monotonic() < deadline:  # idle again: it goes on
            time.sleep(0.05)
        assert len(pieces) > before
    finally:
        worker.stop()


@pytest.mark.parametrize("first", [False, True])
def test_measure_first_measures_before_the_session_is_ready(tmp_path, monkeypatch, first):
    from edgespec.session import LoadedPair, start_session
    from edgespec.strategy import StrategyChoice

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    engine = PairEngine(ChatFakePair(n_seq=17))

    class Backend:
        def load(self, pair, on_progress):
            return LoadedPair(engine, "fake-pair", StrategyChoice("auto"))

        def make_planner(self, choice):
            return AutoPlanner()

    session = start_session(Backend(), measure_first=first)  # type: ignore[arg-type]
    assert engine.profiled is first and (session.planner.costs is not None) is first
