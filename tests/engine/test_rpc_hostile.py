"""Hostile clients against a real `edgespec rpc-server` on 127.0.0.1 (no model: llama.cpp's RPC backend
on this machine's CPU).

- A connection that sends nothing, or one byte, does not keep another client's HELLO unanswered.
- Connections beyond the bound of waiting ones are closed at once, with a log line.
- The crafted GRAPH_COMPUTE of the issue (a tensor whose data lies 1 MiB past its 4 KiB buffer: an
  abort in ggml-rpc.cpp) is refused before llama.cpp sees it; the server stays up and answers HELLO.
- A well-formed graph llama.cpp aborts on (ADD of tensors of other shapes: an assert in the CPU
  backend) costs the backend's child process, which is restarted: the server stays up.
- Random framed messages (Hypothesis, derandomized: the same examples every run) leave the server up.

The messages are built from the vendored ggml-rpc.cpp's structs (rpc_wire.py), not with edgespec's own
encoder, so these tests run against any `edgespec rpc-server`; the checks in process are
test_rpc_checks.py.
"""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
from contextlib import closing, suppress
from time import monotonic, sleep

import pytest

from edgespec.engine.rpc_endpoints import check_server
from edgespec.errors import EngineError
from tests.support.rpc_wire import (
    COMPUTE,
    GET_DEVICE_MEMORY,
    GRAPH_COMPUTE,
    HELLO,
    OP_ADD,
    Client,
    frame,
    graph,
    tensor,
)

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

WAITING = 8  # the connections `edgespec rpc-server` lets wait (reading their HELLO or queued)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`edgespec rpc-server --threads 1` on a free port; its stderr in a file (``log()``)."""

    def __init__(self, tmp_path):
        self.port = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.err = tmp_path / "rpc-server.err"
        command = [sys.executable, "-m", "edgespec", "rpc-server", "--threads", "1", "--port", str(self.port)]
        with open(self.err, "wb") as err:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        self.hello(timeout=60)

    def log(self) -> str:
        return self.err.read_text(errors="replace")

    def hello(self, timeout: float = 10) -> float:
        """Seconds until a HELLO was answered (retried while the server starts or restarts)."""
        start = monotonic()
        while True:
            assert self.process.poll() is None, f"the server died: {self.log()}"
            try:
                assert check_server(self.endpoint, timeout=2) == (7, 0, 0)
                return monotonic() - start
            except EngineError:
                assert monotonic() - start < timeout, f"no HELLO answered within {timeout} s: {self.log()}"
                sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    served = Server(tmp_path_factory.mktemp("rpc"))
    yield served
    served.stop()


# -- stalled clients ---------------------------------------------------------------------------------------
def test_a_silent_or_one_byte_connection_does_not_block_another_clients_hello(server):
    silent = socket.create_connection(("127.0.0.1", server.port))
    one_byte = socket.create_connection(("127.0.0.1", server.port))
    one_byte.sendall(bytes([HELLO]))
    with closing(silent), closing(one_byte):
        sleep(0.3)  # both accepted first
        assert server.hello(timeout=5) < 5
        assert server.hello(timeout=5) < 5  # and again: nothing queued behind them


def test_a_stalled_hello_is_closed_after_the_timeout(server):
    with closing(socket.create_connection(("127.0.0.1", server.port))) as stalled:
        stalled.sendall(bytes([HELLO]))
        stalled.settimeout(20)
        start = monotonic()
        assert stalled.recv(16) == b""  # closed by the server
        assert 8 <= monotonic() - start < 15
    assert "no HELLO within 10 s" in server.log()


def test_connections_beyond_the_bound_are_closed_at_once_with_a_log_line(server):
    waiting = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(WAITING)]
    try:
        sleep(0.5)  # all of them accepted, reading their HELLO
        with closing(socket.create_connection(("127.0.0.1", server.port))) as extra:
            extra.settimeout(5)
            with suppress(ConnectionResetError):
                assert extra.recv(16) == b""
        assert f"{WAITING} connections already wait" in server.log()
    finally:
        for sock in waiting:
            sock.close()
    assert server.hello(timeout=5) < 5  # their places freed at once


# -- crafted messages ----------------------------------------------------------------------------------------
def test_the_crafted_graph_compute_is_refused_and_the_server_stays_up(server):
    client = Client(server.port)
    ptr, base = client.alloc(4096)
    outside = tensor(1, buffer=ptr, data=base + (1 << 20), ne=(16, 1, 1, 1))
    client.sock.sendall(frame(GRAPH_COMPUTE, graph([1], [outside])))
    assert client.closed_by_server()
    client.close()
    assert server.hello() < 5
    log = server.log()
    assert "GRAPH_COMPUTE: a tensor's data lies outside its buffer" in log
    assert "restarting" not in log  # refused before llama.cpp saw it: no backend died


def test_an_abort_inside_llama_cpp_restarts_the_backend_and_the_server_stays_up(server):
    """ADD of a 4-element and a 3-element tensor: well formed, in bounds, and an assert in ggml's CPU
    backend — the kind of abort no check before llama.cpp catches."""
    client = Client(server.port)
    ptr, base = client.alloc(4096)
    a = tensor(1, buffer=ptr, data=base, ne=(4, 1, 1, 1))
    b = tensor(2, buffer=ptr, data=base + 64, ne=(3, 1, 1, 1))
    c = tensor(3, buffer=ptr, data=base + 128, ne=(4, 1, 1, 1), op=OP_ADD, src=(1, 2), flags=COMPUTE)
    client.sock.sendall(frame(GRAPH_COMPUTE, graph([3], [a, b, c])))
    client.sock.sendall(frame(GET_DEVICE_MEMORY, struct.pack("<I", 0)))
    assert client.closed_by_server(timeout=20)
    client.close()
    assert server.hello(timeout=60) < 60
    assert server.process.poll() is None
    log = server.log()
    assert "llama.cpp's backend killed by SIGABRT during the session of 127.0.0.1:" in log, log
    assert "restarting it" in log and "the backend is back" in log


# -- fuzzing ------------------------------------------------------------------------------------------------
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
U32 = st.one_of(st.integers(0, 64), st.sampled_from([0, 1, 3, 255, 256, 2**31, 2**32 - 1]))
OFFSET = st.one_of(st.integers(-64, 4160), st.sampled_from([1 << 20, -(1 << 20), 2**63, 2**64 - 1]))
# Mostly what a real client sends (f32, f16; small shapes, their own strides; NONE, DUP, ADD), so that
# many examples pass the checks and reach llama.cpp; the rest anything.
SHAPE = st.one_of(st.tuples(*[st.integers(1, 8)] * 4), st.tuples(U32, U32, U32, U32))
STRIDES = st.one_of(st.none(), st.tuples(U32, U32, U32, U32))
TYPE = st.sampled_from([0, 0, 0, 1, 8, 4, 30, 43, 2**32 - 1])  # f32, f16, q8_0, removed, bf16, beyond
OP = st.one_of(st.sampled_from([0, 1, 2]), st.integers(0, 120))


@st.composite
def fuzzed_tensor(draw) -> tuple:
    """A tensor recipe: ids among the first few, in the session's buffer (or not), data near it."""
    return (
        draw(st.one_of(st.none(), st.integers(0, 5))),  # None: its place in the graph (1, 2, ...)
        draw(st.sampled_from(["buffer", "buffer", "none", "other"])),
        draw(st.one_of(st.integers(0, 1024).map(lambda x: 4 * x), OFFSET)),
        draw(SHAPE),
        draw(STRIDES),
        draw(TYPE),
        draw(OP),
        tuple(draw(st.lists(st.integers(0, 5), max_size=3))),
        draw(st.sampled_from([COMPUTE, 0])),
    )


def _build(recipe, ptr: int, base: int, place: int = 1) -> bytes:
    id, where, offset, ne, nb, type, op, src, flags = recipe
    id = place if id is None else id
    buffer = {"buffer": ptr, "none": 0, "other": ptr + 4096}[where]
    data = (base + offset) % 2**64
    return tensor(id, buffer=buffer, data=data, ne=ne, nb=nb, type=type, op=op, src=src, flags=flags)




@st.composite
def fuzzed_graph(draw) -> tuple:
    """A graph of 1-5 tensors (ids: their places, mostly), its nodes mostly among them."""
    recipes = draw(st.lists(fuzzed_tensor(), min_size=1, max_size=5))
    ours = st.lists(st.integers(1, len(recipes)), min_size=1, max_size=3, unique=True)
    return ("graph", draw(st.one_of(ours, st.lists(U32, max_size=4))), recipes)


VALUE = st.one_of(
    st.integers(0, 8),
    st.integers(-4096, 4096),
    st.sampled_from([4, 64, 4096, 1 << 20, -(1 << 20), 2**31, 2**32 - 1, 2**63, 2**64 - 1]),
)
FIELD = st.sampled_from(["ne", "nb", "data", "buffer", "type", "op", "src", "flags", "offset", "size"])
MUTATIONS = st.lists(st.tuples(st.integers(0, 2), FIELD, st.integers(0, 3), VALUE), min_size=1, max_size=3)
MESSAGE = st.one_of(
    st.tuples(st.just("mutated"), st.sampled_from([GRAPH_COMPUTE, 6, 8]), MUTATIONS),
    st.tuples(st.just("mutated"), st.sampled_from([GRAPH_COMPUTE, 6, 8]), MUTATIONS),
    fuzzed_graph(),
    st.tuples(st.just("tensor"), st.sampled_from([6, 7, 8, 9, 12, 13, 17]), fuzzed_tensor(), OFFSET, OFFSET),
    st.tuples(
        st.just("raw"),
        st.one_of(st.integers(0, 19), st.integers(0, 255)),
        st.binary(max_size=64),
        st.sampled_from([None, 0, 2**63]),
    ),
)


def _valid(cmd: int, ptr: int, base: int, mutations=()) -> bytes:
    """A well-formed message — ADD of two 4x2 f32 tensors, computed; SET_TENSOR or GET_TENSOR of one —
    with ``mutations`` (tensor, field, index, value) applied: deep into the checks, or past them."""
    tensors = [
        dict(buffer=ptr, data=base + 32 * i, ne=[4, 2, 1, 1], nb=[4, 16, 32, 32], op=0, src=[], flags=0)
        for i in range(3)
    ]
    tensors[2].update(op=OP_ADD, src=[1, 2], flags=COMPUTE)
    offset, size = 0, 32
    for which, name, index, value in mutations:
        t = tensors[which]
        if name in ("ne", "nb"):
            t[name][index] = value % 2**32
        elif name == "data":
            t["data"] = (t["data"] + value) % 2**64
        elif name == "buffer":
            t["buffer"] = (ptr + value) % 2**64 if value else 0
        elif name == "src":
            t["src"] = [*t["src"], 0, 0][:2] + [value % 8]
        elif name in ("type", "op", "flags"):
            t[name] = value % 2**32 if name != "flags" else value % 2**31
        elif name == "offset":
            offset = value % 2**64
        else:
            size = value % 2**64 if cmd == 8 else value % 97
    a, b, c = (
        tensor(i + 1, **{**t, "ne": tuple(t["ne"]), "nb": tuple(t["nb"]), "src": tuple(t["src"])})
        for i, t in enumerate(tensors)
    )
    if cmd == GRAPH_COMPUTE:
        return graph([3], [a, b, c])
    if cmd == 6:  # SET_TENSOR
        return a + b"\x00" + struct.pack("<Q", offset) + bytes(size)
    return a + struct.pack("<QQ", offset, size)  # GET_TENSOR


def _encode(message, ptr: int, base: int) -> bytes:
    kind = message[0]
    if kind == "mutated":
        _, cmd, mutations = message
        return frame(cmd, _valid(cmd, ptr, base, mutations))
    if kind == "graph":
        _, nodes, recipes = message
        tensors = [_build(r, ptr, base, place) for place, r in enumerate(recipes, start=1)]
        return frame(GRAPH_COMPUTE, graph(nodes, tensors))
    if kind == "tensor":  # SET_TENSOR(_HASH), GET_TENSOR, COPY_TENSOR, INIT_TENSOR, GET_ALLOC_SIZE, MEMSET
        _, cmd, recipe, a, b = message
        t = _build(recipe, ptr, base)
        a, b = a % 2**64, b % 2**64
        payload = {
            6: t + b"\x00" + struct.pack("<Q", a) + bytes(b % 97),
            7: t + struct.pack("<QQ", a, b),
            8: t + struct.pack("<QQ", a, b % 8193),
            9: t + t,
            12: t,
            13: struct.pack("<I", 0) + t + bytes(10 * 296),
            17: t + struct.pack("<QQB", a, b, 0),
        }[cmd]
        return frame(cmd, payload)
    _, cmd, payload, size = message  # any command byte, any bytes, maybe a size that lies
    return struct.pack("<BQ", cmd, len(payload) if size is None else size) + payload


@FUZZ
@given(messages=st.lists(MESSAGE, min_size=1, max_size=4))
def test_random_framed_messages_leave_the_server_up(server, messages):
    client = Client(server.port, timeout=60)  # after a restart, the HELLO waits for the new backend
    try:
        ptr, base = client.alloc(4096)
        with suppress(OSError):
            for message in messages:
                client.sock.sendall(_encode(message, ptr, base))
            client.sock.sendall(frame(GET_DEVICE_MEMORY, struct.pack("<I", 0)))
            client.sock.shutdown(socket.SHUT_WR)  # the example's end: the server closes the session
        assert client.closed_by_server(timeout=40)
    finally:
        client.close()  # a session left open would hold the server: it serves one client at a time
    assert server.process.poll() is None, server.log()


def test_after_the_fuzzing_the_server_answers(server):
    assert server.hello(timeout=60) < 60
    assert "Traceback" not in server.log()
