"""The chat app, headless (``App.run_test`` + Pilot) on a fake backend, plus its pure helpers.

The fake (tests/support/tui_fakes.py) yields real StepEvents — draft trees, provenance, timings — through the
same generation worker and messages as the llama.cpp backend. One test runs the real bundled pair.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from time import monotonic

import pytest
from textual.widgets import Markdown, ProgressBar, Static, Tree

from edgespec.decoding.events import EmittedToken, Provenance, StepEvent, StepTimings
from edgespec.errors import ContextFullError, ModelNotFoundError, PairingError
from edgespec.strategy import StrategyChoice
from tests.support.tui_fakes import FakeBackend, canned_answer
from tui.app import ChatApp
from tui.display import RollingRate, provenance_runs, provenance_spans, spans_from_runs
from tui.screens.chat import ChatScreen
from tui.screens.dialogs import ConfirmScreen, PickScreen, TextScreen
from tui.screens.loading import LoadingScreen
from tui.screens.options import SettingsScreen, StrategyScreen
from tui.storage import ChatStore
from tui.widgets.chat_log import AnswerMessage, UserMessage, answer_meta
from tui.widgets.prompt import PromptInput
from tui.widgets.tree_panel import DraftTreePanel

SIZE = (130, 40)


# -- helpers ------------------------------------------------------------------------------------------
def run(coro):
    return asyncio.run(coro)


async def wait_until(pilot, condition, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = monotonic() + timeout
    while not condition():
        if monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


def make_app(tmp_path, backend: FakeBackend | None = None, **kwargs) -> ChatApp:
    return ChatApp(backend or FakeBackend(), ChatStore(tmp_path / "chats.sqlite3"), **kwargs)


async def noted(pilot, text: str) -> None:
    """Wait for a notification containing ``text`` (notifications arrive as messages)."""
    await wait_until(pilot, lambda: any(text in n for n in notes(pilot.app)), what=f"notification {text!r}")


async def ready(pilot) -> ChatScreen:
    app = pilot.app
    await wait_until(
        pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen.loaded is not None, what="load"
    )
    return app.screen


async def send(pilot, text: str, wait: bool = True, type_it: bool = False) -> ChatScreen:
    """Send ``text`` from the input (typed key by key, or pasted) and wait for the answer."""
    chat = pilot.app.chat
    started = chat._gen_counter
    prompt = chat.query_one(PromptInput)
    prompt.focus()
    if type_it:
        await pilot.press(*text)
    else:
        prompt.value = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: chat._gen_counter > started, what="generation start")
    if wait:
        await wait_until(pilot, lambda: chat.gen is None, what="generation end")
    return chat


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))


# -- streaming ----------------------------------------------------------------------------------------
def test_send_streams_answer_token_by_token_with_provenance(tmp_path, monkeypatch):
    seen = []  # (text length, still streaming) at each update of the answer widget
    original = AnswerMessage.append

    def append(self, spans):
        original(self, spans)
        seen.append((len(self.text), self.streaming))

    monkeypatch.setattr(AnswerMessage, "append", append)

    async def scenario():
        backend = FakeBackend(delay=0.01, repeat=3)
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await send(pilot, "how do I add?", type_it=True)
            answer = chat.log_view.last_answer()
            assert len(seen) >= 20 and all(streaming for _, streaming in seen), "many steps, each shown live"
            assert [n for n, _ in seen] == sorted(n for n, _ in seen)
            assert answer.text == canned_answer("how do I add?", 3)
            kinds = {prov for _, prov in answer.spans}
            assert {Provenance.DRAFT, Provenance.TARGET} <= kinds
            assert not answer.streaming and answer.query(Markdown), "finished answers render as Markdown"
            status = chat.status
            assert status.state == "ready" and status.pair == "fake-pair"
            assert status.strategy == "chain budget=4"
            assert status.stats.tokens > 0 and status.stats.mean_accepted_length > 1.0
            assert 0 < status.stats.acceptance_rate < 1 and status.stats.context_used > 0
            assert "tok/s" in str(status.status_text()) and "ctx" in str(status.status_text())
            assert [type(w) for w in chat.log_view.children] == [UserMessage, AnswerMessage]
            stored = app.store.messages(chat.conversation_id)
            assert [m.role for m in stored] == ["user", "assistant"]
            reply = stored[1]
            assert reply.complete and reply.finish_reason == "stop" and reply.content == answer.text
            assert reply.pair == "fake-pair" and reply.strategy == "chain budget=4"
            assert reply.stats["tokens"] == status.stats.tokens and reply.stats["accepted"] > 0
            assert spans_from_runs(reply.content, reply.provenance) == answer.spans
            assert backend.engines[0].last_messages[-1].content == "how do I add?"

    run(scenario())


def test_plain_decoding_and_max_tokens(tmp_path):
    from edgespec.decoding.chat import ChatSettings

    async def scenario():
        app = make_app(tmp_path, settings=ChatSettings(max_tokens=7))
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            assert chat.set_strategy(StrategyChoice("none"))
            assert chat.status.strategy == "none (plain decoding)"
            await send(pilot, "hi")
            stored = app.store.messages(chat.conversation_id)[-1]
            assert stored.stats["tokens"] == 7 and stored.finish_reason == "length"
            assert {p for _, p in chat.log_view.last_answer().spans} == {Provenance.TARGET}
            assert "max tokens reached" in chat.log_view.last_answer().meta

    run(scenario())


def test_escape_cancels_at_the_next_step(tmp_path):
    async def scenario():
        app = make_app(tmp_path, FakeBackend(delay=0.03, repeat=20))
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await send(pilot, "write a lot", wait=False)
            answer = chat.gen.answer
            await wait_until(pilot, lambda: len(answer.text) > 20, what="some text")
            await pilot.press("escape")
            await wait_until(pilot, lambda: chat.gen is None, timeout=2.0, what="cancel")
            assert 0 < len(answer.text) < len(canned_answer("write a lot", 20))
            stored = app.store.messages(chat.conversation_id)[-1]
            assert stored.role == "assistant" and stored.finish_reason == "cancelled"
            assert stored.content == answer.text
            await noted(pilot, "Stopped")
            assert chat.status.state == "ready"

    run(scenario())


def test_partial_answer_is_saved_while_streaming(tmp_path, monkeypatch):
    monkeypatch.setattr("tui.widgets.generation.SAVE_INTERVAL", 0.05)

    async def scenario():
        app = make_app(tmp_path, FakeBackend(delay=0.02, repeat=20))
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await send(pilot, "stream", wait=False)
            await wait_until(pilot, lambda: chat.gen.message_id is not None, what="a partial save")
            # a second connection sees the partial answer, marked incomplete, while it streams
            with ChatStore(app.store.path) as other:
                partial = other.messages(chat.conversation_id)[-1]
            assert partial.role == "assistant" and not partial.complete and partial.content
            await pilot.press("escape")
            await wait_until(pilot, lambda: chat.gen is None)
            assert app.store.messages(chat.conversation_id)[-1].complete

    run(scenario())


# -- strategy, pair, settings -------------------------------------------------------------------------
def test_status_bar_says_what_auto_is_doing(tmp_path):
    """Before the profile, while measuring it, then plain and speculating: the label follows auto."""

    async def scenario():
        backend = FakeBackend(delay=0.05, repeat=3)
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            engine = backend.engines[-1]
            engine.profile_gate.clear()  # hold the measurement so it can be seen
            assert chat.set_strategy(StrategyChoice("auto", {"budget": 6}), chosen=True)
            assert chat.status.strategy == "auto no cost profile yet: plain decoding"
            await send(pilot, "hello", wait=False)
            await wait_until(pilot, lambda: "measuring the cost profile 1/3" in chat.status.strategy,
                             what="the measuring label")
            engine.profile_gate.set()
            seen = set()

            def label_seen() -> bool:
                seen.add(chat.status.strategy)
                return chat.gen is None

            await wait_until(pilot, label_seen, what="the answer")
            assert "auto plain" in seen, seen
            assert chat.status.strategy == "auto speculating 6 tokens"  # refreshed at the end too
            assert str(chat.status.status_text()).count("auto speculating 6 tokens") == 1

    run(scenario())


def test_switch_strategy_from_the_command_palette(tmp_path):
    async def scenario():
        app = make_app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await pilot.press("ctrl+p")
            await pilot.pause(0.1)
            await pilot.press(*"Strategy: tsd")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await wait_until(pilot, lambda: chat.strategy.name == "tsd", what="strategy switch")
            assert chat.planner.name == "tsd" and chat.status.strategy == "tsd budget=4"
            await send(pilot, "hello")
            assert app.store.messages(chat.conversation_id)[-1].strategy == "tsd budget=4"

    run(scenario())


def test_switch_strategy_and_budget_in_the_dialog(tmp_path):
    async def scenario():
        app = make_app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await pilot.press("ctrl+s")
            await wait_until(pilot, lambda: isinstance(app.screen, StrategyScreen))
            dialog = app.screen
            dialog.query_one("#strategy").value = "gsd"
            dialog.query_one("#budget").value = "x"
            await pilot.click("#apply")
            assert "whole number" in str(dialog.query_one("#error").render())
            dialog.query_one("#budget").value = "8"
            dialog.query_one("#budget").focus()
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, ChatScreen))
            assert chat.strategy == StrategyChoice("gsd", {"budget": 8})
            assert chat.status.strategy == "gsd budget=8" and not chat.status.lossy
            # a lossy variant is clearly marked
            chat.choose_strategy("mcsd-target-init")
            assert chat.status.lossy and "LOSSY" in str(chat.status.status_text())
            await noted(pilot, "lossy")
            # an unknown strategy is refused with a notification, the old one stays
            chat.choose_strategy("nonsense")
            assert chat.strategy.name == "mcsd-target-init"
            await noted(pilot, "cannot use strategy nonsense")

    run(scenario())


def test_switch_pair_loads_it_and_closes_the_old_one(tmp_path):
    async def scenario():
        backend = FakeBackend()
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            chat.choose_strategy("tsd")  # chosen by the user: kept across the switch
            await pilot.press("ctrl+o")
            await wait_until(pilot, lambda: isinstance(app.screen, PickScreen))
            await pilot.press("down", "enter")
            await wait_until(pilot, lambda: chat.loaded is not None and chat.loaded.name == "other-pair")
            assert backend.loads == [None, "other-pair"] and backend.engines[0].closed
            assert chat.strategy.name == "tsd" and chat.status.pair == "other-pair"
            await send(pilot, "hi")
            assert app.store.messages(chat.conversation_id)[-1].pair == "other-pair"

    run(scenario())


def test_incompatible_pair_is_a_notification_and_the_old_pair_comes_back(tmp_path):
    async def scenario():
        error = PairingError("token 17 differs: ... Pick a draft of the same family.")
        backend = FakeBackend(fail={"other-pair": error})
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            chat.load_pair("other-pair")
            await wait_until(pilot, lambda: backend.loads == [None, "other-pair", "fake-pair"])
            await wait_until(pilot, lambda: chat.loaded is not None)
            await noted(pilot, "Pick a draft of the same family")
            assert chat.loaded.name == "fake-pair" and chat.status.state == "ready"

    run(scenario())


def test_settings_dialog_validates_and_applies(tmp_path):
    async def scenario():
        backend = FakeBackend()
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await pilot.press("f2")
            await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
            dialog = app.screen
            dialog.query_one("#temperature").value = "hot"
            await pilot.click("#save")
            assert "temperature must be a number" in str(dialog.query_one("#error").render())
            dialog.query_one("#temperature").value = "0.7"
            dialog.query_one("#top_p").value = "0.9"
            dialog.query_one("#max_tokens").value = "5"
            dialog.query_one("#system_prompt").text = "Be brief."
            dialog.query_one("#max_tokens").focus()
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, ChatScreen))
            s = chat.settings
            assert (s.sampling.temperature, s.sampling.top_p, s.max_tokens) == (0.7, 0.9, 5)
            assert s.system_prompt == "Be brief."
            await send(pilot, "hi")
            assert app.store.messages(chat.conversation_id)[-1].stats["tokens"] == 5

    run(scenario())


# -- conversations -------------------------------------------------------------------------------------
def test_reopen_a_saved_conversation_after_restart(tmp_path):
    async def first_session():
        app = make_app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await send(pilot, "first question")
            await send(pilot, "second question")
            await pilot.press("ctrl+n")
            await send(pilot, "another chat")

    async def second_session():
        app = make_app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            sidebar = chat.query_one("#sidebar")
            assert [o.prompt for o in sidebar.options] == ["another chat", "first question"]
            assert chat.query_one(PromptInput).history[-3:] == [
                "first question",
                "second question",
                "another chat",
            ]
            await pilot.click("#sidebar", offset=(3, 2))  # the second row: "first question"
            await wait_until(pilot, lambda: len(chat.log_view.children) == 4, what="the conversation")
            kinds = [type(w) for w in chat.log_view.children]
            assert kinds == [UserMessage, AnswerMessage, UserMessage, AnswerMessage]
            assert chat.log_view.children[2].text == "second question"
            answer = chat.log_view.last_answer()
            assert answer.text == canned_answer("second question")
            assert "fake-pair · chain budget=4" in answer.meta and "tok/s" in answer.meta
            assert {p for _, p in answer.spans} >= {Provenance.DRAFT, Provenance.TARGET}
            # continuing it sends the whole history
            await send(pilot, "third")
            roles = [m.role for m in app.backend.engines[0].last_messages]
            assert roles == ["user", "assistant", "user", "assistant", "user"]

    run(first_session())
    run(second_session())


def test_export_rename_delete(tmp_path):
    async def scenario():
        app = make_app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await pilot.press("f4")
            await noted(pilot, "Nothing to export")
            await send(pilot, "export me")
            await pilot.press("f4")
            path = tmp_path / "exports" / f"export-me-{chat.conversation_id}.md"
            await noted(pilot, str(path))
            text = path.read_text()
            assert text.startswith("# export me") and "## You" in text and "## Assistant" in text
            assert "def add(a, b):" in text and "tok/s" in text

            await pilot.press("f5")
            await wait_until(pilot, lambda: isinstance(app.screen, TextScreen))
            app.screen.query_one("#text").value = "Renamed"
            await pilot.press("enter")
            await wait_until(pilot, lambda: app.store.conversation(chat.conversation_id).title == "Renamed")
            assert [o.prompt for o in chat.query_one("#sidebar").options] == ["Renamed"]

            cid = chat.conversation_id
            await pilot.press("f8")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_until(pilot, lambda: app.store.conversation(cid) is None)
            assert chat.conversation_id is None and not chat.log_view.children
            assert chat.query_one("#sidebar").option_count == 0

    run(scenario())


def test_regenerate_copy_and_history(tmp_path):
    async def scenario():
        backend = FakeBackend()
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await send(pilot, "one")
            await send(pilot, "two")
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: chat.gen is None and backend.engines[0].streams == 3)
            stored = app.store.messages(chat.conversation_id)
            assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]
            assert len(chat.log_view.answers()) == 2
            await pilot.press("ctrl+y")
            assert app.clipboard == canned_answer("two")
            prompt = chat.query_one(PromptInput)
            await pilot.press(*"draft")
            await pilot.press("up")
            assert prompt.value == "two"
            await pilot.press("up", "up")
            assert prompt.value == "one"
            await pilot.press("down", "down")
            assert prompt.value == "draft"

    run(scenario())


def test_copying_needs_no_draft_and_shows_its_tokens(tmp_path):
    async def scenario():
        app = make_app(tmp_path, FakeBackend(has_draft=False))
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            assert not chat.set_strategy(StrategyChoice("chain"))  # needs the draft this pair lacks
            assert chat.set_strategy(StrategyChoice("ngram"))
            await send(pilot, "repeat after me")
            answer = chat.log_view.last_answer()
            assert {p for _, p in answer.spans} == {Provenance.COPIED, Provenance.TARGET}
            stored = app.store.messages(chat.conversation_id)[-1]
            assert "c" in {code for _, code in stored.provenance}
            assert spans_from_runs(stored.content, stored.provenance) == answer.spans
            panel = chat.query_one(DraftTreePanel)
            await pilot.press("ctrl+t")
            assert any(panel.snapshot.copied[1:])
            assert "⧉ copied" in str(panel.query_one("#tree-caption", Static).render())

    run(scenario())


def test_tree_panel_and_view_toggles(tmp_path):
    async def scenario():
        app = make_app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            panel = chat.query_one(DraftTreePanel)
            assert not panel.display
            await send(pilot, "tree please")
            await pilot.press("ctrl+t")
            assert panel.display and panel.snapshot is not None
            tree = panel.query_one(Tree)
            labels = []

            def walk(node):
                labels.append(str(node.label))
                for child in node.children:
                    walk(child)

            walk(tree.root)
            assert labels[0].endswith("(root)")
            assert any(label.startswith("✓") for label in labels) or len(panel.snapshot.accepted) == 1
            assert any(label.startswith("✗") for label in labels)
            assert any("(target)" in label for label in labels)
            answer = chat.log_view.last_answer()
            await pilot.press("f3")  # token view: coloured tokens instead of Markdown
            assert answer.token_view and answer.query_one(".tokens").display
            await pilot.press("ctrl+l")
            assert not answer.highlight
            await pilot.press("ctrl+b")
            assert not chat.query_one("#sidebar").display

    run(scenario())


def test_loading_screen_shows_progress(tmp_path):
    async def scenario():
        half = threading.Event()  # the fake load waits at 50 % until the test has seen it
        app = make_app(tmp_path, FakeBackend(hold_at_half=half))
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: isinstance(app.screen, LoadingScreen), what="the loading screen")
            stage = app.screen.query_one("#stage")
            await wait_until(pilot, lambda: "512 B of 1.0 KiB" in str(stage.render()), what="progress")
            assert app.screen.query_one(ProgressBar).percentage == 0.5
            assert app.chat.status.state == "loading"
            half.set()
            await ready(pilot)
            assert app.chat.status.state == "ready"

    run(scenario())


def test_chat_command_starts_the_app_on_the_default_pair(tmp_path, monkeypatch):
    pytest.importorskip("llama_cpp", reason="the CLI's shared options import the engine (llama-cpp-python)")
    from edgespec.cli import main
    from edgespec.commands import chat
    from edgespec.session import ChatBackend

    started = []
    monkeypatch.setattr(ChatApp, "run", lambda self: started.append(self))
    monkeypatch.setattr(chat, "has_terminal", lambda: True)  # pytest's output is not one
    assert main(["chat", "--max-tokens", "9", "--temperature", "0.5", "--system", "Be brief."]) == 0
    (app,) = started
    assert isinstance(app.backend, ChatBackend) and app.pair is None and app.backend.request.pair is None
    assert app.settings.max_tokens == 9 and app.settings.sampling.temperature == 0.5
    assert app.settings.system_prompt == "Be brief."
    assert app.store.path == tmp_path / "chats.sqlite3"
    app.store.close()


# -- errors ---------------------------------------------------------------------------------------------
def test_missing_model_is_a_notification_not_a_traceback(tmp_path):
    async def scenario():
        error = ModelNotFoundError("model 'big' is not installed. Download it with: edgespec models pull big")
        app = make_app(tmp_path, FakeBackend(fail={None: error}))
        async with app.run_test(size=SIZE) as pilot:
            chat = app.chat
            await wait_until(pilot, lambda: chat.status.state == "no model", what="the failed load")
            assert isinstance(app.screen, ChatScreen), "the loading screen closes"
            await noted(pilot, "edgespec models pull big")
            chat.query_one(PromptInput).value = "hello"
            await pilot.press("enter")
            await noted(pilot, "no model is loaded")
            assert app.store.conversations() == []

    run(scenario())


def test_context_full_is_a_notification_and_keeps_the_question(tmp_path):
    async def scenario():
        backend = FakeBackend()
        app = make_app(tmp_path, backend)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            backend.engines[0].fail = ContextFullError("the message needs more than 10 tokens. Shorten it.")
            await send(pilot, "too long")
            await noted(pilot, "Shorten it")
            assert [m.role for m in app.store.messages(chat.conversation_id)] == ["user"]
            assert chat.status.state == "ready"
            backend.engines[0].fail = None
            await pilot.press("ctrl+r")  # retry once the problem is fixed
            await wait_until(pilot, lambda: chat.gen is None and backend.engines[0].streams == 2)
            assert [m.role for m in app.store.messages(chat.conversation_id)] == ["user", "assistant"]

    run(scenario())


def test_context_window_running_out_mid_answer(tmp_path):
    async def scenario():
        app = make_app(tmp_path, FakeBackend(n_ctx=20, repeat=5))
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await send(pilot, "hi")
            assert app.store.messages(chat.conversation_id)[-1].finish_reason == "context"
            await noted(pilot, "context window is full")

    run(scenario())


# -- pure helpers -----------------------------------------------------------------------------------------
def _event(text: str, tokens: list[tuple[int, Provenance]]) -> StepEvent:
    return StepEvent(
        tokens=tuple(EmittedToken(t, p, 1.0) for t, p in tokens),
        text=text,
        drafted=3,
        accepted=2,
        timings=StepTimings(),
    )


def test_provenance_spans_split_text_by_token():
    pieces = {1: "Hel", 2: "lo", 3: " world"}
    event = _event("Hello world", [(1, Provenance.DRAFT), (2, Provenance.DRAFT), (3, Provenance.TARGET)])
    assert provenance_spans(event, pieces.get) == [("Hello", Provenance.DRAFT), (" world", Provenance.TARGET)]
    # text that does not match the pieces (a held-back UTF-8 byte, a cut stop string) is still shown
    odd = _event("é!", [(1, Provenance.MERGED), (2, Provenance.TARGET)])
    assert provenance_spans(odd, {1: "\ufffd", 2: "!"}.get) == [("é!", Provenance.TARGET)]
    assert provenance_spans(_event("", []), pieces.get) == []
    spans = [("ab", Provenance.DRAFT), ("c", Provenance.MERGED), ("de", Provenance.TARGET)]
    assert provenance_runs(spans) == [(2, "d"), (1, "m"), (2, "t")]
    assert spans_from_runs("abcde", provenance_runs(spans)) == spans
    assert spans_from_runs("abcdef", [(2, "d")]) == [("ab", Provenance.DRAFT), ("cdef", Provenance.TARGET)]


def test_rolling_rate_uses_the_recent_window():
    now = [0.0]
    rate = RollingRate(window=2.0, clock=lambda: now[0])
    assert rate.rate == 0.0
    for _ in range(10):  # 10 tokens/s for 10 seconds
        now[0] += 0.1
        rate.add(1)
    assert rate.rate == pytest.approx(10.0, rel=0.01)
    for _ in range(30):  # then 2 tokens per 0.1 s: the old pace drops out of the window
        now[0] += 0.1
        rate.add(2)
    assert rate.rate == pytest.approx(20.0, rel=0.01)
    for _ in range(3):  # steps slower than the window: still the real pace, 5 tokens per 2.5 s
        now[0] += 2.5
        rate.add(5)
    assert rate.rate == pytest.approx(2.0, rel=0.01)
    now[0] += 100  # reading later does not change it (the status bar keeps the last value)
    assert rate.rate == pytest.approx(2.0, rel=0.01)


def test_answer_meta():
    stats = {
        "tokens": 12,
        "tokens_per_second": 30.0,
        "mean_accepted_length": 2.5,
        "drafted": 8,
        "acceptance_rate": 0.5,
    }
    assert (
        answer_meta("p", "chain γ=4", stats, "stop")
        == "p · chain γ=4 · 12 tokens · 30.0 tok/s · MAL 2.50 · acceptance 50%"
    )
    timed = {**stats, "target_calls": 4, "time_split": {"python": 0.002}}
    assert answer_meta("p", "s", timed, "stop").endswith("acceptance 50% · python 0.50 ms/step")
    assert answer_meta("p", "s", {}, "cancelled").endswith("stopped")
    assert answer_meta("p", "s", {}, None, complete=False).endswith("interrupted")


# -- the real bundled pair ---------------------------------------------------------------------------------
@pytest.mark.model
def test_real_bundled_pair_end_to_end(tmp_path, monkeypatch):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not importable: install llama-cpp-python to run the real-model test")
    monkeypatch.delenv("EDGESPEC_HOME", raising=False)  # use the installed models
    from edgespec.cli import build_parser
    from edgespec.decoding.chat import ChatSettings
    from edgespec.session import ChatBackend

    args = build_parser().parse_args(["chat", "--ctx", "1024", "--strategy", "chain"])
    store = ChatStore(tmp_path / "chats.sqlite3")
    app = ChatApp(ChatBackend.from_args(args), store, settings=ChatSettings(max_tokens=8))

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            chat = app.chat
            await wait_until(
                pilot, lambda: chat.loaded is not None or chat.status.state == "no model", timeout=600
            )
            assert chat.loaded is not None, notes(app)
            assert chat.planner is not None, "the bundled pair speculates by default"
            await send(pilot, "Write a Python function that adds two numbers.", wait=False)
            await wait_until(pilot, lambda: chat.gen is None, timeout=120)
            answer = chat.log_view.last_answer()
            stored = app.store.messages(chat.conversation_id)[-1]
            assert answer.text.strip() and stored.content == answer.text, notes(app)
            assert stored.stats["tokens"] == 8 and stored.finish_reason == "length"
            assert stored.stats["target_calls"] < 8 or stored.stats["drafted"] > 0
            assert chat.status.stats.context_used > 8

    run(scenario())
