"""The bundled target split over two `edgespec rpc-server` processes on 127.0.0.1 (free ports).

- `generate --rpc` gives the same greedy tokens as the target on this machine alone, for plain
  decoding, chain, DySpec and auto. CPU weight repacking is off on both sides (--no-repack; a server
  never repacks): the local device then computes every layer with the same kernels as the servers,
  so the logits of one batch are bit-identical and no near-tie allowance is needed, except for auto:
  its trees follow the measured step times, which differ over RPC, and other batches sum in other
  orders (it may part at a near-tie).
- A server killed mid-answer: `generate` exits with a clear error within the timeout, its partial
  answer printed; a server that stops answering (SIGSTOP) does the same after --rpc-timeout.
- The chat app (in a child process) keeps the partial answer, saved, and stays up.

Each `generate` is a child process: what it does after losing a server (a parked llama.cpp thread,
leaked objects) stays there. 16 tokens per answer keep the comparisons short.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from time import monotonic, sleep
from types import SimpleNamespace

import pytest

from tests.support.realmodels import bundled_paths, part_only_at_a_near_tie

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]  # the repo: the child scripts import tests.support
SUPPORT = ROOT / "tests" / "support"
PROMPT = "Write a Python function that adds two numbers."
TOKENS = 16
COMMON = ["--no-repack", "--threads", "1", "--ctx", "1024", "--json", "--max-tokens", str(TOKENS)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def rpc_servers(env: dict, n: int = 2):
    """``n`` `edgespec rpc-server` processes on free loopback ports: (endpoints, processes). Their weight
    cache (in the test's data home) spares later loads the upload of what an earlier one sent."""
    from edgespec.engine.rpc import check_server
    from edgespec.errors import EngineError

    ports = [_free_port() for _ in range(n)]
    command = [sys.executable, "-m", "edgespec", "rpc-server", "--threads", "1", "--cache", "--port"]
    servers = [
        subprocess.Popen([*command, str(p)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for p in ports
    ]
    endpoints = [f"127.0.0.1:{p}" for p in ports]
    try:
        deadline = monotonic() + 60
        for server, endpoint in zip(servers, endpoints):
            while True:
                try:
                    check_server(endpoint, timeout=2)
                    break
                except EngineError:
                    assert server.poll() is None and monotonic() < deadline, server.stderr.read()
                    sleep(0.2)
        yield endpoints, servers
    finally:
        for server in servers:
            if server.poll() is None:
                server.send_signal(signal.SIGCONT)
                server.kill()
            server.wait(10)


@pytest.fixture(scope="module")
def models() -> tuple[str, str]:
    return bundled_paths()


@pytest.fixture(scope="module")
def env(models, tmp_path_factory) -> dict:
    """A data home of its own (cost profiles, probes), the backend probes already passed copied in."""
    from edgespec.models.paths import home_dir

    home = tmp_path_factory.mktemp("home")
    probes = home_dir() / "probes"
    if probes.is_dir():
        shutil.copytree(probes, home / "probes")
    pythonpath = str(ROOT)
    return dict(os.environ, EDGESPEC_HOME=str(home), PYTHONPATH=pythonpath, EDGESPEC_RPC="")


def _seed_cost_profile(home: str, models: tuple[str, str], rpc: tuple[str, ...] | None) -> None:
    """A profile on which batches cost what one token costs (as on a GPU), cached under the key
    `generate` computes, and the pair's fit: auto speculates without measuring the pair first."""
    import numpy as np

    from edgespec.engine.pair import EngineSettings
    from edgespec.planner.costmodel import DraftFit
    from edgespec.profile import costs, fit

    runner = [SimpleNamespace(model=SimpleNamespace(path=p)) for p in models]
    # as loaded: `auto` offload became 0 layers (no GPU here; with RPC the servers hold the target)
    settings = EngineSettings(
        n_ctx=1024, threads=1, repack=False, rpc=rpc, target_gpu_layers=0, draft_gpu_layers=0
    )
    key = costs.profile_key(SimpleNamespace(settings=settings, target=runner[0], draft=runner[1]))
    flat = {n: 0.03 for n in costs.QUICK_SIZES}
    profile = costs.CostProfile(
        target=flat,
        draft={n: 0.008 for n in costs.QUICK_SIZES},
        catchup={n: 0.008 for n in costs.QUICK_CATCHUP_SIZES},
        key=key,
        repeats=1,
    )
    costs.save(profile, Path(home))
    pair = SimpleNamespace(target=runner[0], draft=runner[1])  # and a draft that fits: no fit measured
    fit.save_fit(pair, DraftFit(np.asarray([0.8, 0.1, 0.03, 0.02]), ratio=1.0, tokens=64), Path(home))


def generate(env: dict, models, strategy: str, *extra: str) -> dict:
    target, draft = models
    command = [sys.executable, "-m", "edgespec", "generate", PROMPT, "--target", target, "--draft", draft]
    done = subprocess.run(
        [*command, "--strategy", strategy, *COMMON, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


STRATEGIES = ("none", "chain", "dyspec", "auto")


def test_generate_over_two_rpc_servers_gives_the_local_tokens(env, models):
    with rpc_servers(env) as (endpoints, _):
        servers = ",".join(endpoints)
        for rpc in (None, tuple(endpoints)):
            _seed_cost_profile(env["EDGESPEC_HOME"], models, rpc)
        for strategy in STRATEGIES:
            local = generate(env, models, strategy)
            remote = generate(env, models, strategy, "--rpc", servers)
            if strategy == "auto":  # its trees follow the measured step times: other batches, other sums
                assert part_only_at_a_near_tie(remote, local), strategy
            else:
                assert remote["tokens"] == local["tokens"], strategy
            assert len(local["tokens"]) == TOKENS
            if strategy != "none":
                assert remote["stats"]["drafted"] > 0, f"{strategy} speculated over RPC"
        # With nothing here (a 0 share for this machine) the servers compute every layer and the logits:
        # equal up to a near-tie (attention without flash attention multiplies in the servers' order:
        # measured, the first difference at token 6, margins 0.115 here and 0.032 there).
        split = generate(env, models, "chain", "--rpc", servers, "--tensor-split", "1,1,0")
        assert part_only_at_a_near_tie(split, local)


def _stream_until_text(env, models, endpoints, *extra: str) -> subprocess.Popen:
    target, draft = models
    command = [sys.executable, "-m", "edgespec", "generate", "Write a long essay about recursion."]
    command += ["--target", target, "--draft", draft, "--rpc", ",".join(endpoints), "--strategy", "chain"]
    child = subprocess.Popen(
        [*command, "--threads", "1", "--max-tokens", "400", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = child.stdout.read(20)  # the answer is streaming
    assert first, child.stderr.read().decode()
    child.first = first
    return child


def test_generate_exits_with_a_clear_error_when_a_server_dies_mid_answer(env, models):
    with rpc_servers(env) as (endpoints, servers):
        child = _stream_until_text(env, models, endpoints, "--rpc-timeout", "30")
        servers[1].kill()
        killed = monotonic()
        try:
            out, err = child.communicate(timeout=30)
        finally:
            child.kill()
        seconds = monotonic() - killed
    assert child.returncode == 1
    assert seconds < 10, seconds  # noticed at once (the connection closes), well within the timeout
    err = err.decode()
    assert f"lost the connection to the RPC server {endpoints[1]} while decoding" in err, err
    assert "restart edgespec" in err and "Traceback" not in err
    assert len(child.first + out) >= 20  # the answer so far was printed (and stays printed)


def test_generate_gives_up_on_a_silent_server_after_the_timeout(env, models):
    with rpc_servers(env) as (endpoints, servers):
        child = _stream_until_text(env, models, endpoints, "--rpc-timeout", "3")
        servers[0].send_signal(signal.SIGSTOP)  # alive, connected, never answering
        stopped = monotonic()
        try:
            _, err = child.communicate(timeout=30)
        finally:
            child.kill()
        seconds = monotonic() - stopped
    assert child.returncode == 1 and 3 <= seconds < 10, seconds
    assert "did not answer within 3 s while decoding (--rpc-timeout)" in err.decode()


def test_chat_keeps_the_partial_answer_and_stays_up_when_a_server_dies(env, models, tmp_path):
    from tui.storage import ChatStore

    db = tmp_path / "chats.sqlite3"
    with rpc_servers(env) as (endpoints, servers):
        child = subprocess.Popen(
            [sys.executable, str(SUPPORT / "rpc_chat_child.py"), str(db), *models, ",".join(endpoints)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            line = child.stdout.readline()
            assert line.strip() == "streaming", line + child.stderr.read()
            servers[1].kill()
            out, err = child.communicate(timeout=120)
        finally:
            child.kill()
    assert child.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["loaded"] and report["status"].endswith(
        f"target: RPC {', '.join(endpoints)} + this machine (CPU)"
    )
    assert report["ended"] and report["state"] == "ready"
    assert any(f"lost the connection to the RPC server {endpoints[1]}" in n for n in report["notes"])
    assert report["shown"] and "failed" in report["meta"]
    assert report["second_ended"]  # the next question fails at once: the app is up and answers
    with ChatStore(db) as store:
        (conversation,) = store.conversations()
        messages = store.messages(conversation.id)
    answer = next(m for m in messages if m.role == "assistant")
    assert answer.content == report["shown"] and answer.finish_reason == "error"
