"""Careless and hostile input, second round: the CLI and the model store (the issue's cases 10, 11, 13
and 14, numbered as there). The real CLI runs in a subprocess with a home and config of its own; every
error is one line on stderr and exit 1, never a traceback, never a hang."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.errors import ModelStoreError
from tests.real.test_hostile_input import one_error, run_cli
from tests.support.canned_server import canned_server

pytest.importorskip("llama_cpp")  # the CLI's shared options import the engine


def cli(tmp_path: Path, *argv: str, stdin=subprocess.DEVNULL, timeout: float = 60, **kwargs):
    """``python -m edgespec ARGV`` with EDGESPEC_HOME and EDGESPEC_CONFIG under ``tmp_path``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "EDGESPEC_HOME": str(tmp_path / "home"),
        "EDGESPEC_CONFIG": str(tmp_path / "config"),
    }
    command = [sys.executable, "-m", "edgespec", *argv]
    return subprocess.run(
        command, env=env, stdin=stdin, capture_output=True, text=True, timeout=timeout, **kwargs
    )


def one_line(done: subprocess.CompletedProcess, *words: str) -> None:
    one_error(done.returncode, done.stderr, *words)
    assert "Traceback" not in done.stderr


def registry(tmp_path: Path, text: str) -> Path:
    (tmp_path / "config").mkdir(exist_ok=True)
    path = tmp_path / "config" / "models.toml"
    path.write_text(text)
    return path


def small_model(tmp_path: Path, data: bytes, sha256: str | None) -> Path:
    """A model registered in the user's models.toml (with ``sha256``), installed as ``data``, no record."""
    sha = f'sha256 = "{sha256}"\n' if sha256 else ""
    registry(
        tmp_path,
        f'[models.small]\ntokenizer = "t"\nquant = "F32"\n{sha}hf = {{ repo = "a/b", file = "s.gguf" }}\n',
    )
    path = tmp_path / "home" / "models" / "small.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# 10. A registry model whose .verified.json is deleted or junk loaded without its sha256 being checked.
def test_10_a_model_without_its_record_is_hashed_against_models_toml(tmp_path, tiny_gguf):
    data = Path(tiny_gguf).read_bytes()
    path = small_model(tmp_path, data, hashlib.sha256(data).hexdigest())
    argv = (
        "generate",
        "hi",
        "--target",
        "small",
        "--strategy",
        "none",
        "--threads",
        "1",
        "--max-tokens",
        "2",
    )
    done = cli(tmp_path, *argv, "--ctx", "512")
    assert done.returncode == 0, done.stderr
    assert "check sha256 of small.gguf" in done.stderr  # hashed, with progress lines in a log
    record = json.loads(path.with_name("small.gguf.verified.json").read_text())
    assert record["sha256"] == hashlib.sha256(data).hexdigest() and record["mtime_ns"] is not None
    again = cli(tmp_path, *argv, "--ctx", "512")
    assert again.returncode == 0 and "check sha256" not in again.stderr  # recorded: not hashed again


@pytest.mark.parametrize("record", [None, b"junk", b"[" * 4000, b'{"sha256": 5, "size": "x"}', b"{}"])
def test_10_a_model_without_a_usable_record_that_differs_is_refused(tmp_path, tiny_gguf, record):
    path = small_model(tmp_path, Path(tiny_gguf).read_bytes(), "ab" * 32)
    if record is not None:
        path.with_name("small.gguf.verified.json").write_bytes(record)
    done = cli(tmp_path, "generate", "hi", "--target", "small", "--strategy", "none", "--ctx", "512")
    one_line(done, "has no verified record", "expected " + "ab" * 32, "edgespec models rm small")


@pytest.mark.parametrize("junk", ["missing", "junk", "deep", "huge", "fifo"])
def test_10_the_store_hashes_again_whatever_is_in_place_of_the_record(home, tmp_path, junk):
    from edgespec.models.store import ModelStore

    data = b"not a real model, but a registered one" * 100
    path = small_model(tmp_path, data, hashlib.sha256(data).hexdigest())
    record = path.with_name("small.gguf.verified.json")
    good = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "mtime_ns": path.stat().st_mtime_ns,
    }
    contents = {
        "junk": b"\xff\x00junk",
        "deep": b"[" * 4000,
        "huge": json.dumps(good).encode() + b" " * 10**6,
    }
    if junk == "fifo":
        os.mkfifo(record)  # reading it must not block
    elif junk in contents:
        record.write_bytes(contents[junk])
    seen = []
    assert ModelStore().ensure("small", on_progress=lambda d, t: seen.append(d)) == path
    assert seen and seen[-1] == len(data)  # hashed (with progress), not trusted
    if junk != "fifo":
        assert json.loads(record.read_text())["sha256"] == good["sha256"]  # a fresh record
        assert ModelStore().is_verified("small")
        path.write_bytes(data[:-1] + b"!")  # changed after: refused
        with pytest.raises(ModelStoreError, match="changed since it was verified"):
            ModelStore().ensure("small", progress=False)
    if junk == "missing":  # nothing to compare with (no sha256 in models.toml): taken as it is, unhashed
        path = small_model(tmp_path, b"x" * 100, None)
        record.unlink()
        assert ModelStore().ensure("small", on_progress=lambda d, t: seen.append("again")) == path
        assert "again" not in seen


# 11. A draft given without a target was ignored (the bundled pair ran).
@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench"])
def test_11_a_draft_without_a_target_is_refused_by_every_command(capsys, home, monkeypatch, command):
    from edgespec import options
    from edgespec.commands import chat, serve

    def never(*args, **kwargs):
        raise AssertionError("a pair was resolved or loaded")

    for where, name in ((options, "resolve_pair"), (options, "open_pair"), (serve, "_bind")):
        monkeypatch.setattr(where, name, never)
    monkeypatch.setattr(chat, "has_terminal", lambda: True, raising=False)  # (none before the fix)
    monkeypatch.setattr("tui.app.ChatApp.run", never)
    argv = [command, *(["hi"] if command == "generate" else []), "--draft", "broken.gguf"]
    argv += ["--prompts", "quick", "--strategies", "chain"] if command == "bench" else ["--strategy", "chain"]
    one_error(*run_cli(capsys, *argv), "--draft needs --target")


def test_11_the_real_cli_refuses_a_draft_without_a_target(tmp_path):
    (tmp_path / "broken.gguf").write_bytes(b"not a model")
    done = cli(tmp_path, "generate", "hi", "--draft", str(tmp_path / "broken.gguf"), "--strategy", "chain")
    one_line(done, "--draft needs --target")


def test_11_a_pair_beside_a_target_is_refused(capsys, home):
    one_error(*run_cli(capsys, "generate", "hi", "--pair", "p", "--target", "t.gguf"), "--pair p")


def test_11_a_draft_a_strategy_does_not_use_is_still_checked(tmp_path, tiny_gguf):
    argv = ("generate", "hi", "--target", tiny_gguf, "--strategy", "none", "--ctx", "512", "--threads", "1")
    done = cli(tmp_path, *argv, "--draft", str(tmp_path / "missing.gguf"), "--max-tokens", "2")
    one_line(done, "no such model file", "missing.gguf")


# 13. Tracebacks.
@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a = " + "[" * 3000 + "]" * 3000, ["nested too deeply"]),
        ("x = {" + "a = {" * 3000 + "}" * 3000 + "}", ["nested too deeply"]),
        ("size = " + "9" * 5000, ["cannot be read", "4300 digits"]),
        ('[models.m]\ntokenizer = "t"\nquant = "q"\nhf = { repo = "a/b", file = "f" }\nsize = ' + "9" * 4000,
         ["`size` must be a positive number of bytes"]),
        ("[models.m]\ntokenizer = 't'\nquant = ['" + "x" * 10**6 + "']\nhf = { repo = 'a/b', file = 'f' }",
         ["`quant` must be a string"]),
        ("# " + "x" * (5 * 2**20), ["larger than 4 MiB"]),
    ],
)  # fmt: skip
def test_13_a_hostile_models_toml_is_one_line(tmp_path, text, words):
    path = registry(tmp_path, text)
    done = cli(tmp_path, "models", "list")
    one_line(done, str(path), *words)
    assert len(done.stderr) < 1000  # a 1 MB value is not echoed


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_13_a_models_toml_that_is_not_a_file_is_not_ignored(tmp_path, kind):
    path = tmp_path / "config" / "models.toml"
    path.parent.mkdir()
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    one_line(cli(tmp_path, "models", "list", timeout=30), str(path), "not a regular file")


def test_13_a_bundled_model_of_a_million_parts_is_refused_at_once(tmp_path):
    entry = (
        '[models.m]\ntokenizer = "t"\nquant = "q"\nsize = 10\nsha256 = "' + "a" * 64 + '"\n'
        'bundled = { package_prefix = "p", module_prefix = "p", count = 1000000, version = "1" }\n'
    )
    path = registry(tmp_path, entry)
    one_line(cli(tmp_path, "models", "pull", "m", timeout=30), str(path), "`count` must be from 1 to")


def test_13_generate_with_standard_input_closed_is_one_line(tmp_path):
    done = cli(tmp_path, "generate", "-", "--strategy", "none", stdin=None, preexec_fn=lambda: os.close(0))
    one_line(done, "standard input is closed")


def test_13_standard_input_that_cannot_be_read_is_one_line(capsys, home, monkeypatch):
    import errno
    import io

    class Failing(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, buffer):
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Failing())))
    one_error(*run_cli(capsys, "generate", "-"), "standard input cannot be read (Input/output error)")


@pytest.fixture
def canned():
    with canned_server() as (server, url):
        server.url = url
        yield server


SSE = "text/event-stream"


@pytest.mark.parametrize(
    ("sets", "reply", "words"),
    [
        ("prompts", (200, "text/plain", b"hello, I am not JSON"), ["not JSON", "'hello, I am not JSON'"]),
        ("prompts", (200, "application/json", b"{}"), ["not a chat completion", "empty object"]),
        ("prompts", (200, "application/json", b"[1, 2]"), ["not a chat completion", "a list of 2"]),
        ("prompts", (200, "application/json", b"[" * 100_000), ["not JSON"]),
        ("tools", (200, "application/json", b'{"choices": [{"message": 5}]}'), ["not a chat completion"]),
        ("conversation", (200, SSE, b"data: {junk\n\n"), ["an event that is not JSON"]),
        ("conversation", (200, SSE, b"data: [1]\n\n"), ["not a JSON object"]),
        ("conversation", (200, "text/plain", b"plain text\n"), ["without any server-sent event"]),
        ("prompts", (500, "text/plain", b"boom\nline two\nthree"), ["500", "'boom line two three'"]),
    ],
)
def test_13_bench_server_against_a_server_that_answers_nonsense(tmp_path, canned, sets, reply, words):
    canned.reply = reply
    url = canned.url
    done = cli(tmp_path, "bench", "--server", url, "--sets", sets, "--max-tokens", "2")
    one_line(done, f"the server at {url}", *words)


def test_13_bench_server_odd_numbers_are_shown_as_not_reported(tmp_path, canned):
    usage = {"completion_tokens": 10**400, "prompt_tokens": "7"}
    timings = {"predicted_per_second": "fast", "draft_n": [1], "draft_n_accepted": True}
    body = {"choices": [{"message": {"content": "hi", "tool_calls": [{"function": {"name": 5}}, 7]}}]}
    canned.reply = (
        200,
        "application/json",
        json.dumps({**body, "usage": usage, "timings": timings}).encode(),
    )
    url = canned.url
    done = cli(tmp_path, "bench", "--server", url, "--sets", "prompts,tools", "--max-tokens", "2")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    "url", ["http://[::1", "localhost:8080", "ftp://x/v1", "http://:80/v1", "http://x:99999"]
)
def test_13_bench_server_with_a_bad_url_is_one_line(tmp_path, url):
    one_line(cli(tmp_path, "bench", "--server", url, "--sets", "tools"), "--server")


def test_13_bench_server_stops_reading_an_endless_answer(capsys, canned, monkeypatch):
    from edgespec.measure import bench_client

    monkeypatch.setattr(bench_client, "REPLY_MAX_BYTES", 2**20)
    canned.reply = (200, SSE, b"data: " + b"x" * (4 * 2**20))  # one line, never ended
    one_error(*run_cli(capsys, "bench", "--server", canned.url,
                       "--sets", "conversation"), "larger than 1 MiB")  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--budgets", "x"], ["--budgets", "whole numbers"]),
        (["--max-tokens", "-1"], ["max_tokens"]),
        (["--warmup-tokens", "-1"], ["--warmup-tokens"]),
        (["--json", "/nonexistent/folder/out.json"], ["--json", "/nonexistent/folder"]),
        (["--plot", "/nonexistent/folder/out.png"], ["--plot"]),
        (["--server", "http://127.0.0.1:9/v1", "--json", "/nonexistent/out.json"], ["--json"]),
    ],
)
def test_13_bench_refuses_what_it_could_not_use_before_measuring(capsys, home, monkeypatch, flags, words):
    from edgespec import options
    from edgespec.measure import bench_client

    def never(*args, **kwargs):
        raise AssertionError("measuring started")

    monkeypatch.setattr(options, "load", never)
    monkeypatch.setattr(bench_client, "run_sets", never)
    one_error(*run_cli(capsys, "bench", "--strategies", "chain", "--prompts", "quick", *flags), *words)


# 14. `edgespec chat` without a terminal drew escape codes into a pipe and never exited.
def test_14_chat_without_a_terminal_is_refused(tmp_path):
    done = cli(tmp_path, "chat", timeout=60)
    one_line(done, "needs a terminal", "edgespec generate", "edgespec serve")
    assert done.stdout == ""  # not a byte of escape codes


def test_14_chat_with_a_terminal_for_input_only_is_refused(tmp_path):
    main, secondary = os.openpty()
    try:
        with open(secondary, "rb", closefd=True) as terminal:
            one_line(cli(tmp_path, "chat", stdin=terminal, timeout=60), "needs a terminal")
    finally:
        os.close(main)
