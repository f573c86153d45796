"""Conversations on disk: one SQLite file (WAL mode) in the data directory.

Durability rule: the user's message is committed before generation starts; the assistant's reply is
written about once a second while it streams (``complete = 0``) and once more when it ends
(``complete = 1``, with its statistics). A crash or ``kill -9`` therefore loses at most the last
second of the reply in flight, and never an earlier conversation: every write is its own transaction.

All access happens on one thread (the UI thread); nothing here knows about Textual.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models.paths import home_dir

DB_NAME = "chats.sqlite3"
SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id      INTEGER PRIMARY KEY,
    title   TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id              INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role            TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content         TEXT NOT NULL,
    complete        INTEGER NOT NULL DEFAULT 1,  -- 0 while an answer streams (or if it never ended)
    created         REAL NOT NULL,
    pair            TEXT,                        -- assistant only: which models answered
    strategy        TEXT,                        -- assistant only: e.g. 'chain γ=4'
    stats           TEXT,                        -- assistant only: JSON of GenerationStats.as_dict()
    finish_reason   TEXT,                        -- 'stop', 'length', 'cancelled', 'context', 'error'
    provenance      TEXT                         -- assistant: JSON runs [[chars, 'd'|'m'|'c'|'t'], ...]
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages (conversation_id, id);
"""

TITLE_CHARS = 48  # a new conversation is titled with the start of its first message


class StorageError(EdgespecError):
    """The chat history file cannot be opened or written."""


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created: float
    updated: float


@dataclass(frozen=True)
class StoredMessage:
    id: int
    conversation_id: int
    role: str
    content: str
    complete: bool = True
    created: float = 0.0
    pair: str | None = None
    strategy: str | None = None
    stats: dict | None = None
    finish_reason: str | None = None
    provenance: list[tuple[int, str]] = field(default_factory=list)  # run lengths: (chars, 'd'|'m'|'c'|'t')


def default_path() -> Path:
    """``<data home>/chats.sqlite3`` (data home: $EDGESPEC_HOME or the platform's user data dir)."""
    return home_dir() / DB_NAME


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


class ChatStore:
    """The conversation history. Each public method is one committed transaction.

    ``exclusive`` (the chat app): this process owns the history while it is open — a second app on
    the same file is refused with a message, so neither marks the other's streaming answer
    'interrupted' nor interleaves its turns. The claim is an advisory lock on ``<file>.lock``, which
    the system drops when the process ends, however it ends (``kill -9`` too)."""

    def __init__(self, path: Path | str | None = None, exclusive: bool = False):
        self.path = Path(path) if path is not None else default_path()
        self._lock = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if exclusive:
                self._lock = _claim(self.path)
            self._db = sqlite3.connect(self.path, isolation_level=None)  # autocommit; explicit transactions
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: safe against process crashes
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA busy_timeout = 3000")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StorageError(
                    f"{self.path} was written by a newer edgespec (schema {version}, this one reads "
                    f"{SCHEMA_VERSION}). Upgrade edgespec, or point EDGESPEC_HOME at another directory."
                )
            with self._transaction():
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except (sqlite3.Error, OSError) as exc:
            raise StorageError(
                f"cannot open the chat history {self.path}: {exc}. Check that the directory is writable, "
                "or set EDGESPEC_HOME to another directory."
            ) from exc

    def close(self) -> None:
        self._db.close()
        if self._lock is not None:
            self._lock.close()  # releases the claim
            self._lock = None

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _transaction(self):
        return _Transaction(self._db, self.path)

    # -- conversations ------------------------------------------------------------------------------
    def create_conversation(self, title: str) -> Conversation:
        now = time.time()
        with self._transaction():
            cur = self._db.execute(
                "INSERT INTO conversations (title, created, updated) VALUES (?, ?, ?)", (title, now, now)
            )
        return Conversation(int(cur.lastrowid), title, now, now)

    def conversations(self) -> list[Conversation]:
        """All conversations, the most recently active first."""
        rows = self._db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC").fetchall()
        return [Conversation(r["id"], r["title"], r["created"], r["updated"]) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        r = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return Conversation(r["id"], r["title"], r["created"], r["updated"]) if r else None

    def rename(self, conversation_id: int, title: str) -> None:
        with self._transaction():
            self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages -----------------------------------------------------------------------------------
    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        ).fetchall()
        return [_message(r) for r in rows]

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        complete: bool = True,
        pair: str | None = None,
        strategy: str | None = None,
        stats: dict | None = None,
        finish_reason: str | None = None,
        provenance: Sequence[tuple[int, str]] = (),
    ) -> int:
        now = time.time()
        with self._transaction():
            cur = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, complete, created, pair, strategy, "
                "stats, finish_reason, provenance) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    role,
                    content,
                    int(complete),
                    now,
                    pair,
                    strategy,
                    _json(stats),
                    finish_reason,
                    _json(list(provenance) or None),
                ),
            )
            self._touch(conversation_id, now)
        return int(cur.lastrowid)

    def update_message(
        self,
        message_id: int,
        content: str,
        *,
        complete: bool,
        stats: dict | None = None,
        finish_reason: str | None = None,
        provenance: Sequence[tuple[int, str]] = (),
    ) -> None:
        now = time.time()
        with self._transaction():
            self._db.execute(
                "UPDATE messages SET content = ?, complete = ?, stats = COALESCE(?, stats), finish_reason = "
                "COALESCE(?, finish_reason), provenance = COALESCE(?, provenance) WHERE id = ?",
                (
                    content,
                    int(complete),
                    _json(stats),
                    finish_reason,
                    _json(list(provenance) or None),
                    message_id,
                ),
            )
            row = self._db.execute(
                "SELECT conversation_id FROM messages WHERE id = ?", (message_id,)
            ).fetchone()
            if row:
                self._touch(row[0], now)

    def mark_cut_off(self) -> int:
        """Answers still marked as streaming were cut off by a crash or a kill: say so (once, at start).

        They keep ``complete = 0`` and what was saved of their text; ``finish_reason`` becomes
        'interrupted'. Returns how many there were."""
        with self._transaction():
            cursor = self._db.execute(
                "UPDATE messages SET finish_reason = 'interrupted' "
                "WHERE role = 'assistant' AND complete = 0 AND finish_reason IS NULL"
            )
        return cursor.rowcount

    def delete_message(self, message_id: int) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def _touch(self, conversation_id: int, now: float) -> None:
        self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))

    # -- export -------------------------------------------------------------------------------------
    def export_markdown(self, conversation_id: int, directory: Path | None = None) -> Path:
        """Write the conversation as Markdown into ``directory`` (default ``<data home>/exports``)."""
        conversation = self.conversation(conversation_id)
        if conversation is None:
            raise StorageError(
                f"conversation {conversation_id} no longer exists; pick another one to export."
            )
        directory = directory or self.path.parent / "exports"
        path = directory / f"{_slug(conversation.title)}-{conversation.id}.md"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path.write_text(to_markdown(conversation, self.messages(conversation_id)), encoding="utf-8")
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}. Check that the directory is writable.") from exc
        return path


def to_markdown(conversation: Conversation, messages: Sequence[StoredMessage]) -> str:
    out = [f"# {conversation.title}", ""]
    for m in messages:
        heading = {"user": "You", "assistant": "Assistant", "system": "System"}[m.role]
        out += [f"## {heading}", ""]
        if m.role == "assistant" and m.stats:
            s = m.stats
            out += [
                f"*{m.pair or '?'} · {m.strategy or '?'} · {s.get('tokens', 0)} tokens · "
                f"{s.get('tokens_per_second', 0.0):.1f} tok/s · "
                f"MAL {s.get('mean_accepted_length', 0.0):.2f} · "
                f"acceptance {s.get('acceptance_rate', 0.0):.0%}*",
                "",
            ]
        out += [m.content, ""]
        if not m.complete:
            out += ["*(interrupted)*", ""]
    return "\n".join(out)


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (rolled back on error); sqlite errors become StorageError."""

    def __init__(self, db: sqlite3.Connection, path: Path):
        self.db, self.path = db, path

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                self.db.execute("COMMIT")
                return False
            except sqlite3.Error as error:
                exc = error
        self.db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise StorageError(
                f"cannot write the chat history {self.path}: {exc}. Check free disk space and permissions."
            ) from exc
        return False


def _claim(path: Path):
    """An open lock file held exclusively by this process; ``StorageError`` if another holds it."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no claim (edgespec is tested on Linux)
        return None
    lock_path = path.with_name(path.name + ".lock")
    lock = open(lock_path, "a+", encoding="utf-8")  # held open as long as the store is
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise StorageError(
            f"the chat history {path} is open in another `edgespec chat` (pid {holder}). Close that one "
            "first, or set EDGESPEC_HOME to another directory to keep a separate history."
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def _message(r: sqlite3.Row) -> StoredMessage:
    return StoredMessage(
        id=r["id"],
        conversation_id=r["conversation_id"],
        role=r["role"],
        content=r["content"],
        complete=bool(r["complete"]),
        created=r["created"],
        pair=r["pair"],
        strategy=r["strategy"],
        stats=json.loads(r["stats"]) if r["stats"] else None,
        finish_reason=r["finish_reason"],
        provenance=[(int(n), str(k)) for n, k in json.loads(r["provenance"])] if r["provenance"] else [],
    )


def _json(value) -> str | None:
    return json.dumps(value, ensure_ascii=False) if value is not None else None


def _slug(title: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()[:40] or "chat"
