"""Nothing lost when the process dies: the chat app is killed mid-answer (SIGKILL, or SIGSEGV as a
native crash would), and the next start finds the question and the partial answer, marked cut off."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from time import monotonic, sleep

import pytest

from tests.tui.test_tui import SIZE, make_app, notes, ready, wait_until
from tui.storage import ChatStore
from tui.widgets.chat_log import AnswerMessage

ROOT = Path(__file__).resolve().parents[2]  # the repo: the child scripts import tests.support
SUPPORT = ROOT / "tests" / "support"
QUESTION = "Explain recursion with an example."


def _partial_answer(db: Path):
    """The streaming answer once a partial save of it is on disk (None until then)."""
    if not db.exists():
        return None
    with ChatStore(db) as store:
        for conversation in store.conversations():
            answers = [m for m in store.messages(conversation.id) if m.role == "assistant"]
            if answers and answers[-1].content:
                return answers[-1]
    return None


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_killed_mid_answer_keeps_question_and_partial_answer(tmp_path, monkeypatch, sig):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    db = tmp_path / "chats.sqlite3"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, str(SUPPORT / "chat_victim.py"), str(db), QUESTION],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = monotonic() + 60
        while (partial := _partial_answer(db)) is None:
            assert child.poll() is None, child.stderr.read()
            assert monotonic() < deadline, "no partial answer was saved while streaming"
            sleep(0.1)
        sleep(1.5)  # let it stream on past a save, so the kill lands mid-answer
        child.send_signal(sig)
        assert child.wait(10) == -sig
    finally:
        if child.poll() is None:
            child.kill()

    with ChatStore(db) as store:
        (conversation,) = store.conversations()
        user, answer = store.messages(conversation.id)
    assert (user.role, user.content) == ("user", QUESTION)
    assert answer.role == "assistant" and not answer.complete and answer.finish_reason is None
    assert len(answer.content) >= len(partial.content) > 0  # at least what was there a second before

    async def restart():
        app = make_app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            assert any("cut off when edgespec stopped" in n for n in notes(app))
            chat.open_conversation(conversation.id)
            await wait_until(pilot, lambda: chat.log_view.query(AnswerMessage), what="the saved answer")
            shown = chat.log_view.query(AnswerMessage).last()
            assert shown.text == answer.content
            assert "cut off" in shown.meta

    asyncio.run(restart())
    with ChatStore(db) as store:
        assert store.messages(conversation.id)[-1].finish_reason == "interrupted"
        assert store.mark_cut_off() == 0  # marked once
