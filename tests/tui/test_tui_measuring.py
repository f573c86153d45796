"""The Done-when of issue 61 on the real bundled pair with no profile measured yet: the chat measures the
pair in its idle time, a key typed in the input stops it within a second, and the first answer streams
without waiting for it (auto decodes plainly or copies until the profile is complete)."""

from __future__ import annotations

import importlib.util
from time import monotonic

import pytest

from tests.support.tui_fakes import FakeBackend
from tests.tui.test_tui import SIZE, make_app, notes, ready, run, wait_until
from tui.app import ChatApp
from tui.storage import ChatStore
from tui.widgets import measuring
from tui.widgets.prompt import PromptInput


def test_measuring_goes_on_once_the_typing_pauses(tmp_path, monkeypatch):
    """At start it measures; each key stops it; a pause in the typing (``TYPING_PAUSE``) lets it go on."""
    monkeypatch.setattr(measuring, "TYPING_PAUSE", 0.3)
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    calls: list[float] = []

    class Counting(FakeBackend):
        def load(self, pair, on_progress):
            loaded = super().load(pair, on_progress)
            loaded.engine.measure = lambda stop, progress: calls.append(monotonic()) or False
            return loaded

    app = make_app(tmp_path, Counting())

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await wait_until(pilot, lambda: len(calls) == 1, what="measuring at start")
            await wait_until(pilot, chat._measuring.finished.is_set, what="the worker's end")
            chat.query_one(PromptInput).focus()
            pressed: list[float] = []  # when each key was sent (before it was handled)
            for key in "hello":  # keys 0.1 s apart, closer than the pause (when the machine keeps up)
                pressed.append(monotonic())
                await pilot.press(key)
                await pilot.pause(0.1)
            await wait_until(pilot, lambda: calls[-1] > pressed[-1], what="measuring after the last key")
            for began in calls[1:]:  # each restart waited a whole pause after the key before it
                last_key = max(t for t in pressed if t < began)
                assert began - last_key >= measuring.TYPING_PAUSE, (began - last_key, pressed, calls)

    run(scenario())


@pytest.mark.model
def test_the_first_answer_never_waits_for_measuring_and_a_key_stops_it(tmp_path, monkeypatch):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not importable: install llama-cpp-python to run the real-model test")
    from edgespec.cli import build_parser
    from edgespec.decoding.chat import ChatSettings
    from edgespec.profile import store as profile_store
    from edgespec.session import ChatBackend

    monkeypatch.delenv("EDGESPEC_HOME", raising=False)  # the installed models …
    profiles = tmp_path / "home"
    monkeypatch.setattr(profile_store, "home_dir", lambda: profiles)  # … and no profile measured yet
    args = build_parser().parse_args(["chat", "--ctx", "1024", "--strategy", "auto"])
    app = ChatApp(
        ChatBackend.from_args(args), ChatStore(tmp_path / "chats.sqlite3"), ChatSettings(max_tokens=4)
    )

    def measuring() -> bool:
        return app.chat.status.state.startswith("measuring the pair")

    def measured() -> int:
        """The pieces done, as the status bar last said ("measuring the pair 12/232 (idle time)")."""
        return int(app.chat.status.state.split()[3].split("/")[0]) if measuring() else 0

    async def scenario():
        async with app.run_test(size=SIZE) as pilot:
            chat = app.chat
            await wait_until(pilot, lambda: chat.loaded is not None or chat.status.state == "no model", 600)
            assert chat.loaded is not None, notes(app)
            await wait_until(pilot, measuring, 60, "measuring in the idle time")
            await wait_until(pilot, lambda: not chat._measuring.finished.is_set(), 5, "a measuring worker")
            await wait_until(pilot, lambda: measured() >= 2, 60, "two pieces measured")
            prompt = chat.query_one(PromptInput)
            prompt.focus()
            before = measured()
            pressed = monotonic()
            await pilot.press("W")
            await wait_until(pilot, chat._measuring.finished.is_set, 10, "measuring to stop")
            assert monotonic() - pressed < 1.0  # stopped within a second of the key
            engine = chat.loaded.engine
            prompt.value = "Write a Python function that adds two numbers."
            await pilot.press("enter")
            await wait_until(pilot, lambda: chat._gen_counter == 1, 10, "the answer to start")
            answer = chat.log_view.last_answer()
            await wait_until(pilot, lambda: bool(answer.text) or chat.gen is None, 120, "the first token")
            assert answer.text, notes(app)
            assert not engine.profiled and not list(profiles.glob("profiles/costs-*.json"))  # none waited for
            await wait_until(pilot, lambda: chat.gen is None, 120, "the answer's end")
            await wait_until(pilot, measuring, 30, "measuring again after the answer")
            assert measured() >= before >= 2  # it goes on from where it stopped, it does not start again
            await pilot.press("W")
            await wait_until(pilot, chat._measuring.finished.is_set, 10, "measuring to stop")

    run(scenario())
