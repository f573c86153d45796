"""Measuring the pair in pieces (``CostMeasurement``, ``FitMeasurement``, ``PairProfile.measure_idle``,
``PairEngine.measure``), as the chat and the server do between answers: it stops when told, goes on from
where it stopped, caches only a complete profile, and leaves the caches holding committed tokens only."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgespec.decoding.chat import ChatSettings, Message
from edgespec.decoding.events import GenerationStats
from edgespec.planner.auto import AutoPlanner
from edgespec.profile import costs, fit
from edgespec.profile.attach import PairProfile
from edgespec.session import PairEngine
from tests.support.fake_llama import ChatFakePair


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch):
    # The fake decodes in microseconds, so its repeats can disagree on a busy runner: a profile that is
    # complete is cached here whatever the spread (the busy rule has its own test in test_costs.py).
    monkeypatch.setattr(costs, "BUSY_SPREAD", float("inf"))


def stop_after(pieces: int):
    """A ``stop`` that lets ``pieces`` pieces run, then says stop."""
    asked = [0]

    def stop() -> bool:
        asked[0] += 1
        return asked[0] > pieces

    return stop


def committed_only(pair) -> bool:
    """Every cell in both caches is a committed token, at its position (no tree left behind)."""
    for runner in (pair.target, pair.draft):
        view = runner.ctx.committed_view()
        if [tok for _, tok, _ in view] != runner.committed:
            return False
        if [pos for pos, _, _ in view] != list(range(len(runner.committed))):
            return False
    return True


def test_the_cost_measurement_stops_when_told_and_goes_on_from_there():
    pair = ChatFakePair(n_seq=17)
    measurement = costs.CostMeasurement(pair, sizes=(1, 2, 4, 8), catchup_sizes=(1, 4), repeats=2)
    chunks = -(-costs.CONTEXT_TOKENS // costs.CONTEXT_CHUNK)  # stop() is asked before each context chunk
    seen: list[int] = []
    assert not measurement.run(stop_after(chunks + 5), lambda what, done, total: seen.append(done))
    assert measurement.done == 5 and seen == [1, 2, 3, 4, 5] and not measurement.complete
    assert committed_only(pair)
    with pytest.raises(ValueError, match="not complete"):
        measurement.result()
    pair.forget()  # an answer ran in between: the measurement decodes its context again
    assert measurement.run(progress=lambda what, done, total: seen.append(done))
    assert seen == list(range(1, measurement.total + 1))  # resumed at piece 6, not restarted
    profile = measurement.result()
    assert set(profile.target) == {1, 2, 4, 8} and set(profile.catchup) == {1, 4}
    assert all(len(v) == 2 for v in measurement.samples["target"].values())  # each size twice, no more
    assert committed_only(pair)


def test_a_stop_during_the_context_leaves_nothing_half_decoded():
    pair = ChatFakePair(n_seq=17)
    measurement = costs.CostMeasurement(pair, sizes=(1, 2), catchup_sizes=(1,), repeats=1)
    assert not measurement.run(stop_after(2))  # two chunks of the context, then stopped
    assert measurement.done == 0 and committed_only(pair)
    assert len(pair.target.committed) == 2 * costs.CONTEXT_CHUNK


def test_the_fit_stopped_midway_resumes_to_the_same_fit():
    pair = ChatFakePair(n_seq=17, draft_noise=1.5)
    whole = fit.measure_fit(pair, requests=("first request", "second"))
    measurement = fit.FitMeasurement(pair, requests=("first request", "second"))
    assert not measurement.run(stop_after(fit.FIT_TOKENS + 10))  # inside the first request's draft chain
    assert measurement.done == 0 and not measurement.complete
    assert not pair.draft._node_seq  # the draft's tree bookkeeping is left empty
    while not measurement.run(stop_after(fit.FIT_TOKENS * 3)):  # one request at a time
        pass
    again = measurement.result()
    assert again is not None and whole is not None
    assert again.tokens == whole.tokens and again.runs == whole.runs
    assert np.allclose(again.profile, whole.profile) and again.ratio == pytest.approx(whole.ratio)


def test_measure_idle_caches_only_a_complete_profile(tmp_path):
    pair = ChatFakePair(n_seq=17)
    profile = PairProfile(pair, home=tmp_path, measure=False)
    assert profile.costs() is None and profile.fit() is None  # nothing cached: nothing measured either
    assert not (tmp_path / "profiles").exists()
    reports: list[tuple[int, int]] = []
    assert not profile.measure_idle(stop_after(20), lambda what, done, total: reports.append((done, total)))
    assert not (tmp_path / "profiles").exists() and profile.costs() is None
    total = reports[-1][1]
    while not profile.measure_idle(stop_after(100), lambda what, done, total: reports.append((done, total))):
        assert not list((tmp_path / "profiles").glob("fit-*.json"))
    dones = [done for done, _ in reports]  # a fit request stopped midway is measured again: its own
    assert max(dones) == dones[-1] == total and {t for _, t in reports} == {total}  # ticks repeat
    assert profile.costs() is not None and profile.fit() is not None and profile.complete
    names = sorted(p.name.split("-")[0] for p in (tmp_path / "profiles").iterdir())
    assert names == ["costs", "fit"]
    fresh = PairProfile(pair, home=tmp_path, measure=False)  # the next start: cached, nothing to measure
    assert fresh.complete and fresh.measure_idle(lambda: True)


def test_the_engine_answers_before_the_profile_and_prepares_the_next_answer_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    engine = PairEngine(ChatFakePair(n_seq=17))
    planner = AutoPlanner()

    def answer() -> str:
        engine.prepare(planner, lambda *a: None)
        settings, stats = ChatSettings(max_tokens=6), GenerationStats()
        events = engine.stream(planner, [Message("user", "hello there")], settings, threading.Event(), stats)
        return "".join(e.text for e in events)

    assert answer() and planner.costs is None  # no profile, no waiting: plain decoding (or copies)
    assert engine.context_used() > 0
    assert not engine.measure(stop_after(5), lambda *a: None)
    assert engine.context_used() == 0 and not engine.profiled  # the measurement's tokens are gone
    assert engine.measure(lambda: False, lambda *a: None) and engine.profiled
    assert planner.costs is None  # prepared again only when the next answer starts
    assert answer() and planner.costs is not None
