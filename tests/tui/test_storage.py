"""The conversation store: SQLite in WAL mode; durable across crashes (kill -9 mid-answer)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from tui.storage import ChatStore, StorageError, default_path, title_from, to_markdown

STATS = {"tokens": 12, "tokens_per_second": 30.5, "mean_accepted_length": 2.4, "acceptance_rate": 0.6}


def test_default_path_follows_edgespec_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    assert default_path() == tmp_path / "chats.sqlite3"
    with ChatStore() as store:
        assert store.path == tmp_path / "chats.sqlite3"
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_conversations_and_messages_round_trip(tmp_path):
    path = tmp_path / "chats.sqlite3"
    with ChatStore(path) as store:
        first = store.create_conversation("first")
        second = store.create_conversation("second")
        store.add_message(first.id, "user", "hello")
        answer = store.add_message(
            first.id,
            "assistant",
            "hi there",
            complete=False,
            pair="p",
            strategy="chain γ=4",
            provenance=[(3, "d"), (5, "t")],
        )
        store.update_message(answer, "hi there!", complete=True, stats=STATS, finish_reason="stop")
    with ChatStore(path) as store:  # reopened: everything is there
        assert [c.title for c in store.conversations()] == ["first", "second"]  # most recently active first
        user, reply = store.messages(first.id)
        assert (user.role, user.content, user.complete) == ("user", "hello", True)
        assert reply.content == "hi there!" and reply.complete and reply.finish_reason == "stop"
        assert reply.stats == STATS and reply.pair == "p" and reply.strategy == "chain γ=4"
        assert reply.provenance == [(3, "d"), (5, "t")]  # kept by the update (not given again)
        assert store.messages(second.id) == []

        store.rename(second.id, "renamed")
        assert store.conversation(second.id).title == "renamed"
        store.delete_message(answer)
        assert [m.role for m in store.messages(first.id)] == ["user"]
        store.delete_conversation(first.id)  # its messages go with it
        assert store.conversation(first.id) is None
        assert store._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_export_markdown(tmp_path):
    with ChatStore(tmp_path / "chats.sqlite3") as store:
        conv = store.create_conversation("Add two numbers?")
        store.add_message(conv.id, "user", "How do I add?")
        store.add_message(
            conv.id,
            "assistant",
            "```python\na + b\n```",
            pair="p",
            strategy="tsd",
            stats=STATS,
            finish_reason="stop",
        )
        store.add_message(conv.id, "assistant", "partial", complete=False)
        path = store.export_markdown(conv.id)
        assert path == tmp_path / "exports" / f"add-two-numbers-{conv.id}.md"
        text = path.read_text()
        assert text == to_markdown(conv, store.messages(conv.id))
        assert text.startswith("# Add two numbers?\n")
        assert "## You\n\nHow do I add?" in text and "```python\na + b\n```" in text
        assert "*p · tsd · 12 tokens · 30.5 tok/s · MAL 2.40 · acceptance 60%*" in text
        assert "*(interrupted)*" in text
        with pytest.raises(StorageError, match="no longer exists"):
            store.export_markdown(9999)


def test_title_from_first_message():
    assert title_from("  hello\n world ") == "hello world"
    long = title_from("x" * 100)
    assert len(long) == 48 and long.endswith("…")


def test_unusable_files_are_errors_that_say_what_to_do(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="EDGESPEC_HOME"):
        ChatStore(blocker / "chats.sqlite3")
    newer = tmp_path / "newer.sqlite3"
    sqlite3.connect(newer).execute("PRAGMA user_version = 99").connection.close()
    with pytest.raises(StorageError, match="newer edgespec"):
        ChatStore(newer)


WRITER = textwrap.dedent(
    """
    import sys, time
    from tui.storage import ChatStore

    store = ChatStore(sys.argv[1])
    done = store.create_conversation("finished earlier")
    store.add_message(done.id, "user", "question one")
    store.add_message(done.id, "assistant", "answer one", stats={"tokens": 2}, finish_reason="stop")
    live = store.create_conversation("in flight")
    store.add_message(live.id, "user", "question two")  # committed before generating
    answer, text = None, ""
    for i in range(100000):  # the answer streams forever, saved as it goes (like the app, faster)
        text += f"tok{i} "
        if answer is None:
            answer = store.add_message(live.id, "assistant", text, complete=False)
        else:
            store.update_message(answer, text, complete=False)
        if i == 20:
            print("streaming", flush=True)
        time.sleep(0.002)
    """
)


def test_kill_9_mid_answer_keeps_earlier_conversations_and_the_partial_answer(tmp_path):
    path = tmp_path / "chats.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "streaming"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    with ChatStore(path) as store:
        assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finished, in_flight = sorted(store.conversations(), key=lambda c: c.id)
        assert finished.title == "finished earlier"
        assert [(m.role, m.content, m.complete) for m in store.messages(finished.id)] == [
            ("user", "question one", True),
            ("assistant", "answer one", True),
        ]
        user, partial = store.messages(in_flight.id)
        assert (user.role, user.content) == ("user", "question two")
        assert partial.role == "assistant" and not partial.complete
        assert partial.content.startswith("tok0 tok1 ") and "tok20 " in partial.content
        # the store keeps working after the crash
        store.update_message(partial.id, partial.content + "(resumed)", complete=True)
        assert store.messages(in_flight.id)[-1].complete
