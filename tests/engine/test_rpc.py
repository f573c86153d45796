"""The target across machines, without models: the RPC handshake check against fake servers, the
device split and fit checks, the flags, models.toml keys and cost-profile key, `edgespec rpc-server`
starting and stopping on Ctrl-C, and the latency-injecting proxy (scripts/netdelay.py).
The real split over two servers is tests/test_rpc_real.py."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import socket
import struct
import subprocess
import sys
import threading
from contextlib import contextmanager
from time import monotonic, perf_counter
from types import SimpleNamespace

import pytest

from edgespec import options
from edgespec.errors import EdgespecError, EngineError, RegistryError
from edgespec.models.registry import load_registry
from edgespec.profile import costs
from edgespec.profile.store import profile_path
from tests.support.scripts import load

DelayProxy = load("netdelay").DelayProxy  # scripts/netdelay.py: a dev tool, not in the package

rpc = pytest.importorskip("edgespec.engine.rpc", reason="llama-cpp-python is not installed")
EngineSettings = pytest.importorskip("edgespec.engine.pair").EngineSettings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def fake_server(answer):
    """A one-connection-at-a-time TCP server on 127.0.0.1; ``answer(conn)`` handles each connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def hello_reply(major: int, minor: int = 0, patch: int = 0):
    def answer(conn: socket.socket) -> None:
        request = conn.recv(1 + 8 + 24)
        assert request[0] == 14 and struct.unpack_from("<Q", request, 1)[0] == 24  # HELLO, v7's size
        conn.sendall(struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24))

    return answer


# -- checking a server before llama.cpp connects (it would abort the process) --------------------------------
def test_a_server_of_this_protocol_passes_the_check():
    with fake_server(hello_reply(7, 0, 0)) as endpoint:
        assert rpc.check_server(endpoint) == (7, 0, 0)


@pytest.mark.parametrize("version", [(8, 0, 0), (6, 1, 0), (7, 1, 0)])
def test_another_protocol_version_is_named(version):
    with fake_server(hello_reply(*version)) as endpoint:
        with pytest.raises(
            EngineError, match=rf"speaks protocol {'.'.join(map(str, version))}, this edgespec 7.0"
        ):
            rpc.check_server(endpoint)


def test_an_older_server_closing_the_handshake_is_a_version_mismatch():
    def close_at_once(conn: socket.socket) -> None:  # a v3 server rejects the 24-byte HELLO and hangs up
        conn.recv(64)

    with fake_server(close_at_once) as endpoint:
        with pytest.raises(EngineError, match="closed the handshake: it speaks another version"):
            rpc.check_server(endpoint)


def test_an_unreachable_server_says_how_to_start_one():
    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(EngineError, match=rf"cannot reach the RPC server {endpoint} .*edgespec rpc-server"):
        rpc.check_server(endpoint)


def test_a_silent_server_times_out_in_bounded_time():
    release = threading.Event()
    with fake_server(lambda conn: release.wait(5)) as endpoint:
        start = monotonic()
        with pytest.raises(EngineError, match="did not answer within 0.5 s: it serves one client at a time"):
            rpc.check_server(endpoint, timeout=0.5)
        assert monotonic() - start < 2
        release.set()


@pytest.mark.parametrize(
    "text, problem",
    [
        ("10.0.0.2", "not HOST:PORT"),
        ("[::1]:50052", "not HOST:PORT"),
        ("h:0", "not HOST:PORT"),
        ("", "no RPC"),
    ],
)
def test_endpoints_are_checked(text, problem):
    with pytest.raises(EngineError, match=problem):
        rpc.parse_endpoints(text)


def test_endpoints_parse():
    assert rpc.parse_endpoints(" 10.0.0.2:50052, gpu-box.lan:1 ") == ("10.0.0.2:50052", "gpu-box.lan:1")
    with pytest.raises(EngineError, match="named twice"):
        rpc.parse_endpoints("a:1,a:1")


# -- the split and the fit -----------------------------------------------------------------------------------
GiB = 2**30
DEVICES = [
    rpc.Device(1, "RPC0", "10.0.0.2:50052", 8 * GiB, 16 * GiB),
    rpc.Device(2, "RPC1", "10.0.0.3:50052", 2 * GiB, 16 * GiB),
    rpc.Device(3, "CPU", "this machine", 1 * GiB, 16 * GiB),
]


def test_weights_larger_than_a_servers_share_are_refused_before_loading():
    assert rpc.fit_problem(10 * GiB, (), DEVICES) is None  # by free memory: 11 GiB in all
    problem = rpc.fit_problem(10 * GiB, (1.0, 1.0, 1.0), DEVICES)  # a third each: RPC1 gets 3.3 > 2
    assert (
        problem and "RPC1 (10.0.0.3:50052), which has 2.0 GiB free" in problem and "--tensor-split" in problem
    )
    assert rpc.fit_problem(10 * GiB, (3.0, 0.0, 3.0), DEVICES) is None  # this machine maps its share


def test_the_split_needs_one_share_per_device_in_order():
    assert rpc._check_shares((3, 1, 0), DEVICES) == (3.0, 1.0, 0.0)
    for bad in ((1, 1), (1, -1, 1), (0, 0, 0)):
        with pytest.raises(EngineError, match=r"needs 3 non-negative values.*RPC0 \(10.0.0.2:50052\), RPC1"):
            rpc._check_shares(bad, DEVICES)


def test_this_machines_cpu_keeps_the_first_layers_and_is_not_a_listed_device():
    """Listed as a device the CPU made two CPU backends and a second round trip per decode; it keeps
    its share of the layers (the first ones) as llama.cpp keeps layers it does not offload instead, the
    servers split the rest, and the output layer's weights are overridden to this machine's memory."""
    lib = rpc._library()
    cpu = rpc.local_devices(lib, gpu=False)[0]
    placement = rpc.Placement.__new__(rpc.Placement)
    placement.devices = [*DEVICES[:2], dataclasses.replace(DEVICES[2], ptr=cpu)]
    placement._progress = None

    def applied(shares):
        placement.shares = shares
        params = SimpleNamespace()
        placement.apply(params, 28)
        devices, split = placement._keep[0], placement._keep[1]
        return params, [devices[i] for i in range(3)], list(split)[:2]

    params, devices, split = applied((1.0, 1.0, 1.0))
    assert devices == [1, 2, None] and split == [1.0, 1.0]  # the RPC devices alone
    assert params.n_gpu_layers == 28 + 1 - 9  # 9 layers here (the first); 19 and the output offloaded
    override = rpc._BuftOverride * 2
    overrides = override.from_address(params.tensor_buft_overrides)
    assert overrides[0].pattern == rpc.OUTPUT_HERE and overrides[0].buft and overrides[1].pattern is None
    assert applied((1.0, 1.0, 0.0))[0].n_gpu_layers == -1  # nothing here but the output layer
    assert applied((0.0, 0.0, 1.0))[0].n_gpu_layers == 0  # everything here
    params, _, split = applied(())  # by free memory: 8, 2 and 1 GiB
    assert params.n_gpu_layers == 28 + 1 - round(28 / 11) and split == [8 * GiB, 2 * GiB]


# -- flags, models.toml and the profile key ------------------------------------------------------------------
def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_model_args(parser)
    return parser.parse_args(list(argv))


def test_rpc_flags_env_and_none(monkeypatch):
    monkeypatch.delenv("EDGESPEC_RPC", raising=False)
    assert options.engine_settings(_args()).rpc is None  # the pair's models.toml entry decides
    settings = options.engine_settings(
        _args("--rpc", "a:1,b:2", "--tensor-split", "3,1,1", "--rpc-timeout", "9")
    )
    assert (settings.rpc, settings.tensor_split, settings.rpc_timeout) == (
        ("a:1", "b:2"),
        (3.0, 1.0, 1.0),
        9.0,
    )
    monkeypatch.setenv("EDGESPEC_RPC", "c:3")
    assert options.engine_settings(_args()).rpc == ("c:3",)
    assert options.engine_settings(_args("--rpc", "none")).rpc == ()  # the flag wins, and 'none' means here
    for bad in (["--tensor-split", "1,x"], ["--rpc-timeout", "0"]):
        with pytest.raises(SystemExit):
            _args(*bad)


PAIR = """
[models.tiny]
tokenizer = "toy"
quant = "Q8_0"
hf = { repo = "a/b", file = "tiny.gguf" }

[pairs.far]
target = "tiny"
draft = "tiny"
strategy = "chain"
budget = 4
"""


def test_a_pair_entry_names_its_servers(edgespec_env):
    edgespec_env.write_registry(
        PAIR + 'rpc = ["10.0.0.2:50052", "gpu.lan:50052"]\ntensor_split = [2, 2, 1]\n'
    )
    spec = load_registry().pair("far")
    assert spec.rpc == ("10.0.0.2:50052", "gpu.lan:50052") and spec.tensor_split == (2.0, 2.0, 1.0)


@pytest.mark.parametrize(
    "extra, problem",
    [
        ('rpc = "10.0.0.2:50052"\n', "`rpc` must be a list"),
        ('rpc = ["10.0.0.2"]\n', "`rpc` must list HOST:PORT strings"),
        (
            "tensor_split = [1, 1]\n",
            "`tensor_split` must list non-negative numbers, one per device, next to `rpc`",
        ),
        ('rpc = ["a:1"]\ntensor_split = [1, -1]\n', "`tensor_split` must list non-negative numbers"),
    ],
)
def test_a_pair_entry_with_bad_servers_names_the_fix(edgespec_env, extra, problem):
    path = edgespec_env.write_registry(PAIR + extra)
    with pytest.raises(RegistryError, match=problem) as caught:
        load_registry()
    assert str(caught.value).startswith(f"{path}: [pairs.far]")


def test_the_cost_profile_of_a_target_over_rpc_has_its_own_key(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    runner = SimpleNamespace(model=SimpleNamespace(path=str(model)))

    def key(**settings):
        defaults = EngineSettings(threads=2, target_gpu_layers=0, draft_gpu_layers=0)  # as loaded: resolved
        pair = SimpleNamespace(
            settings=dataclasses.replace(defaults, **settings), target=runner, draft=runner
        )
        return costs.profile_key(pair)

    local = key()
    assert "rpc" not in local and key(rpc=()) == local  # local profiles keep their old keys
    far = key(rpc=("10.0.0.2:50052",), tensor_split=(1.0, 1.0))
    assert far["rpc"] == {"servers": ["10.0.0.2:50052"], "tensor_split": [1.0, 1.0]}
    assert profile_path(far) != profile_path(local)
    # flash attention: off on CPUs (here and RPC servers: a split target decodes as a local one), llama.cpp's
    # choice with GPU offload
    offloaded = key(target_gpu_layers=-1)
    assert (local["flash_attn"], far["flash_attn"], offloaded["flash_attn"]) == (False, False, None)
    cpu, gpu = EngineSettings(target_gpu_layers=0), EngineSettings(target_gpu_layers=-1)
    far_cpu = EngineSettings(rpc=("h:1",), target_gpu_layers=0)
    assert cpu.target_on_cpu and not gpu.target_on_cpu and far_cpu.target_on_cpu
    # --flash-attn on|off: that, on a CPU or a GPU, in the settings and in the key
    for flag, value in (("auto", None), ("on", True), ("off", False)):
        chosen = options.engine_settings(_args("--flash-attn", flag))
        assert chosen.flash_attn is value
    on = key(flash_attn=True)
    assert on["flash_attn"] is True and profile_path(on) != profile_path(local)
    assert EngineSettings(flash_attn=True).context(cpu_only=True).flash_attn is True
    assert EngineSettings(flash_attn=False).context(cpu_only=False).flash_attn is False
    with pytest.raises(SystemExit):
        _args("--flash-attn", "yes")


# -- edgespec rpc-server -------------------------------------------------------------------------------------
def test_rpc_server_serves_until_ctrl_c():
    port = free_port()
    command = [sys.executable, "-m", "edgespec", "rpc-server", "--port", str(port), "--threads", "1"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = monotonic() + 30
        while True:
            try:
                assert rpc.check_server(f"127.0.0.1:{port}", timeout=2) == (7, 0, 0)
                break
            except EngineError:
                assert server.poll() is None and monotonic() < deadline, server.communicate()
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, err
    assert "Ctrl-C stops it" in err and "stopped" in err and "WARNING" not in err
    assert "Starting RPC server v7.0.0" in out


def test_rpc_server_errors(monkeypatch, capsys):
    from edgespec.cli import main

    assert main(["rpc-server", "--host", "localhost"]) == 1
    assert "'localhost' is not an IPv4 address" in capsys.readouterr().err
    with socket.create_server(("127.0.0.1", 0)) as taken:
        assert main(["rpc-server", "--port", str(taken.getsockname()[1])]) == 1
    assert "Address already in use" in capsys.readouterr().err
    # Not on loopback: the warning first (a fake server that cannot listen, so nothing is served).
    monkeypatch.setattr(rpc, "serve", lambda *a: threading.Thread(target=lambda: None))
    assert main(["rpc-server", "--host", "0.0.0.0", "--port", str(free_port())]) == 1
    err = capsys.readouterr().err
    assert "no authentication and no" in err and "trusted network" in err and "could not listen" in err


# -- the latency-injecting proxy -----------------------------------------------------------------------------
@contextmanager
def echo_server():
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield ("127.0.0.1", listener.getsockname()[1])


def _round_trips(port: int, n: int = 10) -> list[float]:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for i in range(n):
            start = perf_counter()
            sock.sendall(b"ping %d" % i)
            assert sock.recv(64) == b"ping %d" % i
            times.append(perf_counter() - start)
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(64) == b""  # the end of the stream is relayed too
    return times


def test_the_proxy_adds_its_delay_in_each_direction():
    with echo_server() as upstream, DelayProxy(upstream, delay=0.03) as proxy:
        times = _round_trips(proxy.port)
    assert min(times) >= 0.06  # 30 ms there and 30 ms back
    assert sorted(times)[len(times) // 2] < 0.06 + 0.03  # and not much more (a busy 2-core machine)


def test_the_proxy_pipelines_instead_of_throttling():
    with echo_server() as upstream, DelayProxy(upstream, delay=0.05) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            start = perf_counter()
            for _ in range(20):  # 20 chunks sent at once arrive ~100 ms later, not 20 × 100 ms
                sock.sendall(b"x" * 100)
            received = 0
            while received < 2000:
                received += len(sock.recv(4096))
            elapsed = perf_counter() - start
    assert 0.1 <= elapsed < 0.5


def test_proxy_reports_an_unreachable_upstream_by_closing():
    with DelayProxy(("127.0.0.1", free_port()), delay=0.0) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.settimeout(5)
            assert sock.recv(16) == b""


def test_edgespec_error_is_the_base():
    assert issubclass(rpc.RpcLost, EngineError) and issubclass(EngineError, EdgespecError)
