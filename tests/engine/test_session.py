"""The chat facade (edgespec.session) that `edgespec chat` and `edgespec serve` share, without models:
its protocols driven by the chat app's fake backend (tests/support/tui_fakes.py), and the real ``ChatBackend``
loading through the model store onto the fake pair (tests/support/fake_llama.py).
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from edgespec.decoding.chat import ChatSettings, Message
from edgespec.decoding.events import GenerationStats
from edgespec.errors import EdgespecError
from edgespec.models import pairs
from edgespec.session import (
    ChatBackend,
    ChatSession,
    LoadedPair,
    LoadRequest,
    PairEngine,
    draft_problem,
    start_session,
)
from edgespec.strategy import StrategyChoice
from tests.support.fake_llama import ChatFakePair
from tests.support.tui_fakes import FakeBackend, FakePlanner, canned_answer

QUESTION = [Message("user", "what is a tree?")]


def _reply(session: ChatSession, max_tokens: int = 512) -> tuple[str, GenerationStats, str | None]:
    stats = GenerationStats()
    events = list(session.stream(QUESTION, ChatSettings(max_tokens=max_tokens), threading.Event(), stats))
    return "".join(e.text for e in events), stats, events[-1].finish_reason


class StartsWith(FakeBackend):
    """The fake backend, with another first strategy than the fake pair's (chain)."""

    def __init__(self, choice: StrategyChoice, **kwargs):
        super().__init__(**kwargs)
        self.choice = choice

    def load(self, pair, on_progress) -> LoadedPair:
        loaded = super().load(pair, on_progress)
        loaded.defaults = self.choice
        return loaded


# -- layering -------------------------------------------------------------------------------------------
def _imports(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_the_server_imports_neither_the_app_nor_textual():
    """The brief's own check, then every server module and the facade (in a fresh interpreter: this
    one has Textual loaded by other tests)."""
    assert "textual" not in _imports("import edgespec.server")
    loaded = _imports(
        "import edgespec.session, edgespec.server.app, edgespec.server.worker, edgespec.server.protocol"
    )
    assert "edgespec.session" in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "tui")}


def test_serve_command_imports_neither_the_app_nor_textual():
    pytest.importorskip("llama_cpp", reason="the CLI's shared options import the engine (llama-cpp-python)")
    loaded = _imports("import edgespec.commands.serve")
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "tui")}


# -- the protocols, on the fake -------------------------------------------------------------------------
def test_start_session_loads_the_default_pair_with_its_first_strategy():
    backend = FakeBackend()
    session = start_session(backend)
    assert backend.loads == [None]  # what the request names (here: the default pair)
    assert (session.name, session.strategy) == ("fake-pair", "chain")
    assert session.planner.name == "chain" and session.planner.budget == 4
    text, stats, finish = _reply(session)
    assert text == canned_answer(QUESTION[-1].content) and finish == "stop"
    assert stats.tokens > 0 and stats.prompt_tokens > 0 and stats.drafted > 0
    session.close()
    assert backend.engines[0].closed


def test_start_session_prepares_the_planner_on_the_loading_thread():
    """auto's cost profile is measured before the first answer, with progress reports."""
    seen = []
    session = start_session(StartsWith(StrategyChoice("auto")), lambda *progress: seen.append(progress))
    assert session.engine.profiled and session.strategy == "auto"
    assert ("cost profile", 3, 3) in seen


def test_start_session_without_a_strategy_decodes_plainly():
    session = start_session(StartsWith(StrategyChoice("none")))
    assert session.planner is None and session.strategy == "none"
    text, stats, _ = _reply(session, max_tokens=5)
    assert stats.tokens == 5 and stats.drafted == 0 and text


def test_start_session_refuses_a_drafting_planner_without_a_draft_and_frees_the_pair():
    backend = FakeBackend(has_draft=False)
    with pytest.raises(EdgespecError, match="fake-pair was loaded without a draft model.*--draft"):
        start_session(backend)
    assert backend.engines[0].closed


def test_copying_needs_no_draft():
    session = start_session(StartsWith(StrategyChoice("ngram"), has_draft=False))
    assert session.strategy == "ngram" and not session.engine.has_draft


def test_a_failed_load_is_raised_as_is():
    error = EdgespecError("model 'big' is not installed")
    with pytest.raises(EdgespecError, match="not installed"):
        start_session(FakeBackend(fail={None: error}))


def test_draft_problem():
    with_draft = FakeBackend().load(None, lambda *progress: None)
    without = FakeBackend(has_draft=False).load(None, lambda *progress: None)
    drafting, copying = FakePlanner("chain"), FakePlanner("ngram", needs_draft=False)
    assert draft_problem(drafting, with_draft) is None
    assert draft_problem(None, without) is None
    assert draft_problem(copying, without) is None
    assert "fake-pair was loaded without a draft model" in draft_problem(drafting, without)


def test_session_stream_stops_when_cancelled():
    session = start_session(FakeBackend(repeat=50))
    cancel, stats = threading.Event(), GenerationStats()
    events = []
    for event in session.stream(QUESTION, ChatSettings(), cancel, stats):
        events.append(event)
        cancel.set()
    assert events[-1].finish_reason == "cancelled" and len(events) == 2


# -- the real backend, on the fake pair -----------------------------------------------------------------
@pytest.fixture
def local_files(edgespec_env, monkeypatch, tmp_path):
    """Local model files t.gguf and d.gguf; opening a pair gives the fake pair (and records what opened)."""
    for name in ("t.gguf", "d.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    opened = []

    def fake_open(resolved, settings):
        opened.append((resolved, settings))
        return ChatFakePair(n_seq=33)

    monkeypatch.setattr(pairs, "open_pair", fake_open)
    return str(tmp_path / "t.gguf"), str(tmp_path / "d.gguf"), opened


def test_chat_backend_loads_local_files_and_streams_through_stream_reply(local_files):
    target, draft, opened = local_files
    choice = StrategyChoice("chain", {"gamma": 3})
    backend = ChatBackend(LoadRequest(target=target, draft=draft, choice=choice))
    stages = []
    loaded = backend.load(None, lambda stage, done, total: stages.append(stage))
    assert isinstance(loaded.engine, PairEngine) and loaded.engine.has_draft
    assert (loaded.name, loaded.defaults) == ("t+d", choice)
    assert stages[-1] == "loading t+d into memory"
    ((resolved, settings),) = opened
    assert resolved.draft_path == draft and settings is None  # None: the engine's defaults
    planner = backend.make_planner(loaded.defaults)
    assert planner.name == "chain" and planner.gamma == 3
    session = ChatSession(loaded.engine, planner, "chain", loaded.name)
    text, stats, finish = _reply(session, max_tokens=6)
    assert stats.tokens == 6 and finish == "length" and stats.target_calls < 6
    assert text and all(isinstance(loaded.engine.piece(t), str) for t in range(5))


def test_chat_backend_without_a_draft_falls_back_to_plain_decoding(local_files):
    target, _, opened = local_files
    backend = ChatBackend(LoadRequest(target=target, choice=StrategyChoice("tsd")))
    loaded = backend.load(None, lambda *progress: None)
    assert loaded.defaults == StrategyChoice("none") and opened[0][0].draft_path is None
    assert backend.make_planner(loaded.defaults) is None


def test_chat_backend_from_the_command_line(local_files):
    pytest.importorskip("llama_cpp", reason="the CLI's shared options import the engine (llama-cpp-python)")
    from edgespec.cli import build_parser

    target, draft, _ = local_files
    models = ["--target", target, "--draft", draft]
    args = build_parser().parse_args(["serve", *models, "--strategy", "tsd", "--budget", "7", "--ctx", "512"])
    request = ChatBackend.from_args(args).request
    assert (request.pair, request.target, request.draft) == (None, target, draft)
    assert request.choice.name == "tsd" and request.choice.budget == 7
    assert request.engine.n_ctx == 512
