"""Careless and hostile input to the model store, the registry and the chat database (the issue's
cases 15, 17 and 18; the CLI's: tests/test_hostile_input.py). Every error names the file and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.errors import EdgespecError, ModelStoreError, RegistryError
from tests.real.test_hostile_input import one_error, run_cli

pytest.importorskip("llama_cpp")


# 15. An unknown strategy in models.toml fell back to auto.
def test_15_an_unknown_strategy_in_models_toml_is_refused(home, tmp_path):
    from edgespec.models.registry import load_registry

    config = tmp_path / "config"
    config.mkdir()
    (config / "models.toml").write_text(
        '[pairs.mine]\ntarget = "qwen2.5-coder-1.5b-instruct-q4_k_m"\n'
        'draft = "qwen2.5-coder-0.5b-instruct-q4_k_m"\nstrategy = "tdx"\nbudget = 4\n'
    )
    with pytest.raises(RegistryError) as caught:
        load_registry()
    message = str(caught.value)
    assert str(config / "models.toml") in message and "[pairs.mine]" in message and "'tdx'" in message
    assert "Did you mean 'tsd'?" in message


TINY_ENTRY = """
[models.tiny_gguf-model]
tokenizer = "tiny_gguf"
quant = "F32"
hf = { repo = "test/tiny_gguf", file = "tiny_gguf.gguf" }
"""


@pytest.fixture
def tiny_entry(home, tmp_path) -> str:
    """A registry model (the user's models.toml) with no sha256 of its own: the store's record decides."""
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "models.toml").write_text(TINY_ENTRY)
    return "tiny_gguf-model"


# 17. A corrupted model loaded silently.
def test_17_a_changed_model_is_hashed_again_and_refused(capsys, tiny_entry, tiny_gguf):
    from edgespec.models.store import ModelStore

    name = tiny_entry
    store = ModelStore()
    path = store.path_for(name)
    path.parent.mkdir(parents=True)
    path.write_bytes(Path(tiny_gguf).read_bytes())
    from edgespec.models.paths import sha256_file

    store._write_record(name, sha256_file(path), verified=True)  # as `pull` or `verify` leave it
    assert store.ensure(name, progress=False) == path  # unchanged: trusted, not hashed
    argv = ("generate", "hi", "--target", name, "--strategy", "none", "--threads", "1", "--max-tokens", "2")
    assert run_cli(capsys, *argv)[0] == 0  # it loads before the change
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit, as a disk error would
    path.write_bytes(bytes(data))
    with pytest.raises(ModelStoreError, match="changed since it was verified"):
        store.ensure(name, progress=False)
    code, err = run_cli(capsys, *argv)
    one_error(code, err, "changed since it was verified", f"edgespec models rm {name}")
    assert not store.is_verified(name)


def test_17_a_file_touched_but_unchanged_is_accepted_after_a_rehash(tiny_entry, tiny_gguf):
    from edgespec.models.paths import sha256_file
    from edgespec.models.store import ModelStore

    name = tiny_entry
    store = ModelStore()
    path = store.path_for(name)
    path.parent.mkdir(parents=True)
    path.write_bytes(Path(tiny_gguf).read_bytes())
    store._write_record(name, sha256_file(path), verified=True)
    os.utime(path, ns=(1, 1))
    seen = []
    assert store.ensure(name, progress=False, on_progress=lambda d, t: seen.append((d, t))) == path
    assert seen and seen[-1][0] == path.stat().st_size  # hashed, with progress
    assert store.is_verified(name)  # and the new time recorded


# 18. Two chat apps on one database.
def test_18_a_second_chat_app_on_the_same_history_is_refused(tmp_path, capsys, home, monkeypatch):
    from tui.app import ChatApp
    from tui.storage import ChatStore, StorageError

    with ChatStore(home / "chats.sqlite3", exclusive=True) as first:
        conversation = first.create_conversation("mine")
        streaming = first.add_message(conversation.id, "assistant", "half an ans", complete=False)
        with pytest.raises(StorageError, match=f"pid {os.getpid()}"):
            ChatStore(home / "chats.sqlite3", exclusive=True)
        monkeypatch.setattr(ChatApp, "run", lambda self: pytest.fail("a second app started"))
        monkeypatch.setattr("edgespec.commands.chat.has_terminal", lambda: True)  # pytest's is not one
        one_error(*run_cli(capsys, "chat"), "is open in another `edgespec chat`")
        (message,) = [m for m in first.messages(conversation.id) if m.id == streaming]
        assert message.finish_reason is None  # not marked 'interrupted' by the second app
    with ChatStore(home / "chats.sqlite3", exclusive=True):  # released when the first one closed
        pass


def test_18_the_claim_goes_when_the_process_dies(tmp_path):
    from tui.storage import ChatStore

    path = tmp_path / "chats.sqlite3"
    code = f"from tui.storage import ChatStore; s = ChatStore({str(path)!r}, exclusive=True)"
    code += "; print('held', flush=True)"
    holder = subprocess.Popen(
        [sys.executable, "-c", code + "; import time; time.sleep(60)"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(EdgespecError, match=f"pid {holder.pid}"):
            ChatStore(path, exclusive=True)
    finally:
        holder.kill()  # kill -9: no clean-up runs
        holder.wait(10)
    ChatStore(path, exclusive=True).close()
