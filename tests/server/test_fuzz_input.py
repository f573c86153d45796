"""Fuzzing with Hypothesis, bounded: request bodies against the server (in process on the fake engine,
then a real `edgespec serve` over the tiny GGUF), the CLI's settings (in process, up to where models
would load), and valid extreme settings on the real llama.cpp (subprocesses). No 5xx, no traceback,
no native crash. Examples are derandomized: every run tries the same ones, in seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

import httpx
import pytest

from edgespec.server.app import create_app
from edgespec.server.protocol import Defaults
from edgespec.server.worker import Worker
from edgespec.session import ChatSession
from tests.server.test_serve import MODEL, ServeFake
from tests.support.hostile import Served
from tests.support.tui_fakes import FakePlanner

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

FUZZ = settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
ODD_TEXT = st.sampled_from(["\ud800", "a\x00b", "<|im_end|>\n<|im_start|>system\nx", "", " ", "é" * 50])
NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, -1, 2**63, 2**64, 10**400, 0.5, 1e308]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20), ODD_TEXT)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ROLES = st.one_of(st.sampled_from(["user", "assistant", "system", "developer", "tool"]), JSON)
CONTENT = st.one_of(
    st.text(max_size=40),
    ODD_TEXT,
    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": SCALARS})),
    JSON,
)
MESSAGE = st.one_of(st.fixed_dictionaries({"role": ROLES, "content": CONTENT}), JSON)
FIELDS = st.sampled_from(
    ["model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n", "stream"]
)
BODY = st.one_of(
    st.builds(
        lambda messages, extra: {"messages": messages, **extra},
        st.one_of(st.lists(MESSAGE, max_size=5), JSON),
        st.dictionaries(FIELDS, SCALARS, max_size=4),
    ),
    JSON,
)
RAW = st.one_of(BODY.map(lambda body: json.dumps(body).encode()), st.binary(max_size=200))


@pytest.fixture(scope="module")
def client():
    worker = Worker(lambda: ChatSession(ServeFake(), FakePlanner("chain"), "chain", MODEL), 64)
    worker.start()
    app = create_app(worker, Defaults(model=MODEL, max_tokens=4), "chain", max_body=64 * 1024)
    with TestClient(app, raise_server_exceptions=True, base_url="http://127.0.0.1") as test_client:
        yield test_client
    worker.stop()


@FUZZ
@given(raw=RAW)
def test_request_bodies_get_an_answer_or_a_4xx(client, raw):
    response = client.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and error["type"] == "invalid_request_error"


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(body=BODY)
def test_a_real_server_answers_fuzzed_bodies_without_5xx(tiny_server, body):
    response = httpx.post(tiny_server.url + "/v1/chat/completions", content=json.dumps(body), timeout=30)
    assert response.status_code < 500, response.text


@pytest.fixture(scope="module")
def tiny_server(tiny_gguf, tmp_path_factory):
    home = tmp_path_factory.mktemp("fuzz-home")
    argv = ["--target", tiny_gguf, "--draft", tiny_gguf, "--strategy", "chain", "--ctx", "1024"]
    served = Served([*argv, "--threads", "1", "--max-tree-nodes", "8", "--max-tokens", "3"], home)
    yield served
    assert "Traceback" not in served.log_text()
    served.stop()


# -- the CLI's settings ------------------------------------------------------------------------------------
class _WouldLoad(Exception):
    """Raised in place of loading the models: the settings were accepted."""


FLAG_VALUES = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1", "2", "0.5", "1e309", "9" * 20, "x", ""]),
    st.integers(min_value=-(10**6), max_value=10**6).map(str),
    st.floats().map(repr),
)
FLAGS = st.sampled_from(
    ["--temperature", "--top-p", "--top-k", "--seed", "--max-tokens", "--ctx", "--max-tree-nodes"]
    + ["--threads"]
)


@FUZZ
@given(
    flags=st.lists(st.tuples(FLAGS, FLAG_VALUES), max_size=4), command=st.sampled_from(["generate", "serve"])
)
def test_cli_settings_are_accepted_or_refused_in_one_line(flags, command, capsys):
    pytest.importorskip("llama_cpp")
    from edgespec import options
    from edgespec.cli import main
    from edgespec.commands import serve

    argv = [command, *(["Say hi"] if command == "generate" else []), "--strategy", "chain"]
    for flag, value in flags:
        argv += [f"{flag}={value}"]
    loading = mock.patch.object(options, "load", side_effect=_WouldLoad)
    with loading, mock.patch.object(serve, "_bind", side_effect=_WouldLoad):
        try:
            code = main(argv)
        except _WouldLoad:
            return
        except SystemExit as exit:  # argparse: not a number at all
            assert exit.code == 2
            return
        finally:
            err = capsys.readouterr().err
            assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("edgespec: error: "), err


# -- valid extremes on the real llama.cpp: never a native crash ---------------------------------------
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    ctx=st.integers(512, 1024),
    nodes=st.integers(1, 255),
    strategy=st.sampled_from(["none", "chain", "tsd", "gsd", "dyspec", "opt-tree", "ngram", "mcsd"]),
    temperature=st.sampled_from([0.0, 0.7, 2.0]),
    top_p=st.sampled_from([1e-6, 0.5, 1.0]),
    seed=st.sampled_from([0, 2**64 - 1]),
    prompt=st.sampled_from(["Say hi", "word " * 200, "a\x00b", "<|im_end|>"]),
)
def test_valid_extremes_never_crash_the_process(tiny_gguf, tmp_path_factory, **case):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "EDGESPEC_HOME": str(tmp_path_factory.getbasetemp() / "fuzz-cli-home"),
    }
    argv = ["generate", "-", "--target", tiny_gguf, "--draft", tiny_gguf, "--max-tokens", "8"]
    argv += ["--threads", "1"]
    for name in ("ctx", "strategy", "temperature", "top_p", "seed"):
        argv += [f"--{name.replace('_', '-')}", str(case[name])]
    argv += ["--max-tree-nodes", str(case["nodes"])]
    command = [sys.executable, "-m", "edgespec", *argv]
    done = subprocess.run(command, input=case["prompt"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "GGML_ASSERT" not in done.stderr


# -- models.toml, the store's records, a server's answers to `bench --server` ------------------------------
TOML_LINES = st.one_of(
    st.sampled_from(
        ["[models.m]", "[pairs.p]", '[models."x y"]', "[[models]]", 'tokenizer = "t"', 'quant = "q"',
         'hf = { repo = "a/b", file = "f.gguf" }', 'target = "m"', 'draft = "m"', 'strategy = "chain"',
         'default_pair = "p"', 'rpc = ["h:1"]', "tensor_split = [1, nan]", "params = { budget = inf }",
         "size = -1", "sha256 = 5", "a = " + "[" * 2000 + "]" * 2000, "x = " + "9" * 5000, "= 1", "[",
         'bundled = { package_prefix = "p", module_prefix = "p", count = 0, version = "1" }']
    ),
    st.builds(lambda key, n: f"{key} = {n}", st.sampled_from(["size", "budget", "count"]),
              st.sampled_from([0, -1, 2**63, 10**400, 10**4000])),
    st.text(max_size=30),
)  # fmt: skip


@FUZZ
@given(lines=st.lists(TOML_LINES, max_size=12))
def test_a_models_toml_loads_or_is_refused_in_one_line(lines, tmp_path_factory, capsys):
    from argparse import Namespace

    from edgespec.commands.models import run_list
    from edgespec.errors import RegistryError
    from edgespec.models.registry import load_registry
    from edgespec.models.store import ModelStore

    folder = tmp_path_factory.mktemp("toml")
    path = folder / "models.toml"
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    try:
        registry = load_registry(path)
    except RegistryError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 2000 and str(path) in str(exc)
        return
    with mock.patch("edgespec.commands.models.ModelStore", lambda: ModelStore(folder, registry)):
        assert run_list(Namespace(json=True)) == 0  # every value it holds can be shown
    capsys.readouterr()


RECORDS = st.one_of(
    st.binary(max_size=300),
    JSON.map(lambda value: json.dumps(value).encode()),
    st.fixed_dictionaries(
        {"sha256": st.one_of(st.just("0" * 64), SCALARS), "size": SCALARS, "mtime_ns": SCALARS}
    ).map(lambda value: json.dumps(value).encode()),
)


@FUZZ
@given(record=RECORDS)
def test_a_record_never_lets_a_model_that_differs_from_models_toml_load(record, tmp_path_factory):
    """Whatever stands in place of `.verified.json`, a model is loaded only if its sha256 is models.toml's."""
    import hashlib

    from edgespec.errors import ModelStoreError
    from edgespec.models.registry import load_registry
    from edgespec.models.store import ModelStore

    folder = tmp_path_factory.mktemp("store")
    data = b"model bytes"
    for name, sha in (("good", hashlib.sha256(data).hexdigest()), ("bad", "0" * 64)):
        entry = f'[models.{name}]\ntokenizer = "t"\nquant = "q"\nsha256 = "{sha}"\n'
        entry += 'hf = { repo = "a/b", file = "f" }\n'
        (folder / f"{name}.toml").write_text(entry)
        store = ModelStore(folder, load_registry(folder / f"{name}.toml"))
        path = store.models_dir / f"{name}.gguf"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        path.with_name(f"{name}.gguf.verified.json").write_bytes(record)
        if name == "good":
            assert store.ensure(name, progress=False) == path
        else:
            with pytest.raises(ModelStoreError):
                store.ensure(name, progress=False)


def _events(events: list) -> tuple[str, bytes]:
    return "text/event-stream", b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


CHOICES = st.lists(st.fixed_dictionaries({"message": JSON, "delta": JSON}), max_size=2)
COMPLETION = st.fixed_dictionaries({"choices": CHOICES, "usage": JSON, "timings": JSON})
ANSWERS = st.one_of(
    st.one_of(JSON, COMPLETION).map(lambda value: ("application/json", json.dumps(value).encode())),
    st.lists(st.one_of(JSON, COMPLETION), max_size=4).map(_events),
    st.binary(max_size=200).map(lambda data: ("text/plain", data)),
)


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(answer=ANSWERS, sets=st.sampled_from(["prompts", "conversation", "tools"]))
def test_bench_server_measures_or_says_what_the_server_got_wrong(answer, sets, capsys):
    from argparse import Namespace

    from edgespec.errors import EdgespecError
    from edgespec.measure.bench_client import measure
    from tests.support.canned_server import canned_server

    args = Namespace(sets=sets, api_key=None, model=None, max_tokens=2, prompts="quick", json=None)
    with canned_server() as (server, url):
        server.reply = (200, *answer)
        try:
            assert measure(url, args) == 0
        except EdgespecError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 500
    capsys.readouterr()
