"""The chat's first-run hint (tui/advice_hint.py): from cached advice only, once per data home."""

from __future__ import annotations

import asyncio
import json

from tui.advice_hint import MARKER, first_run_hint, hint


def row(pair: str, speedup: float, fits: bool = True, installed: bool = False, plain: float = 2.0) -> dict:
    return {
        "pair": pair,
        "speedup": speedup,
        "fits": fits,
        "installed": installed,
        "plain": plain,
        "best": "auto",
    }


def test_the_hint_names_the_fastest_pair_that_pays_fits_and_is_absent():
    advice = {
        "pairs": [
            row("bundled", 1.0, installed=True, plain=9.0),
            row("too-big", 3.0, fits=False),
            row("have-it", 2.5, installed=True),
            row("slow-gain", 1.4),
            row("7b", 1.6, plain=2.0),
            row("14b", 2.0, plain=1.0),
        ]
    }
    line = hint(advice)
    assert line is not None and line.startswith("7b is predicted 1.6×") and "edgespec models pull 7b" in line
    assert hint({"pairs": [row("slow-gain", 1.4), row("too-big", 3.0, fits=False)]}) is None


def test_shown_once_then_never_again(tmp_path):
    assert first_run_hint(tmp_path) is None  # nothing cached: no hint, nothing measured
    assert not (tmp_path / MARKER).exists()
    (tmp_path / "advice.json").write_text(json.dumps({"pairs": [row("7b", 2.0)]}))
    assert "7b" in (first_run_hint(tmp_path) or "")
    assert first_run_hint(tmp_path) is None
    assert (tmp_path / MARKER).exists()


def test_advice_without_a_qualifying_pair_leaves_the_hint_for_later(tmp_path):
    (tmp_path / "advice.json").write_text(json.dumps({"pairs": [row("bundled", 1.0, installed=True)]}))
    assert first_run_hint(tmp_path) is None
    (tmp_path / "advice.json").write_text(json.dumps({"pairs": [row("7b", 2.0)]}))
    assert first_run_hint(tmp_path) is not None


def test_a_broken_advice_file_gives_no_hint(tmp_path):
    (tmp_path / "advice.json").write_text("{not json")
    assert first_run_hint(tmp_path) is None


def test_the_chat_shows_the_hint_on_its_first_start_only(tmp_path, monkeypatch):
    from tests.support.tui_fakes import FakeBackend
    from tui.app import ChatApp
    from tui.storage import ChatStore

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    (home / "advice.json").write_text(json.dumps({"pairs": [row("qwen2.5-coder-7b+0.5b", 2.0)]}))

    async def hints_on_start() -> int:
        app = ChatApp(FakeBackend(), ChatStore(tmp_path / "chats.sqlite3"))
        async with app.run_test() as pilot:
            await pilot.pause()
            return sum("models pull qwen2.5-coder-7b+0.5b" in n.message for n in app._notifications)

    assert asyncio.run(hints_on_start()) == 1
    assert asyncio.run(hints_on_start()) == 0
