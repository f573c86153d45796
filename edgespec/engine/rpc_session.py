"""One client's session of `edgespec rpc-server` (rpc_proxy.py): its messages read whole, checked
(rpc_protocol.py) and passed to llama.cpp's backend, the backend's replies passed back.

The data path stays short: messages are read through a 256 KiB buffer and forwarded whole with one
``sendall``; tensor data (weights, activations) passes through in 1 MiB chunks; TCP_NODELAY on both
sides, as llama.cpp sets it. A reply is waited for before the client's next message is read — the
client (llama.cpp's) waits for it too — so the checks always know the session's buffers.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from time import monotonic, sleep
from typing import Protocol

from .rpc_protocol import (
    ALLOC_BUFFER,
    BUFFER_GET_BASE,
    CAPS,
    FREE_BUFFER,
    GET_TENSOR,
    GRAPH_COMPUTE,
    HELLO,
    HELLO_REPLY,
    MAX_GRAPH_BYTES,
    SET_TENSOR,
    SET_TENSOR_HEAD,
    SIZES,
    TENSOR,
    VARIABLE,
    Checks,
    Refused,
    TypeTraits,
    describe,
    frame,
)

STALL_TIMEOUT = 30.0  # seconds without a byte inside a message, or of a reply the client does not read
BACKEND_TIMEOUT = 30.0  # seconds for the backend to answer a session's HELLO (else it is restarted)
RECV, CHUNK = 256 << 10, 1 << 20


class Closed(Exception):
    """The peer closed its connection in the middle of a message, or the backend its session."""


class Reader:
    """Buffered reads of whole messages from a socket. A read that waits ``STALL_TIMEOUT`` (the
    socket's timeout) inside a message raises ``TimeoutError``; at a message's start it waits on."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf, self.pos = sock, bytearray(), 0
        self._chunk: memoryview | None = None

    def take(self, n: int, start: bool = False) -> bytes | bytearray | None:
        """``n`` bytes; at a message's ``start``, None if the peer closed the connection there."""
        while len(self.buf) - self.pos < n:
            if n > RECV and not start:  # a large message (a graph): read into its own buffer
                return self._large(n)
            at_start = start and len(self.buf) == self.pos
            try:
                data = self.sock.recv(RECV)
            except TimeoutError:
                if at_start:
                    continue
                raise
            if not data:
                if at_start:
                    return None
                raise Closed("closed in the middle of a message")
            if self.pos:
                del self.buf[: self.pos]
                self.pos = 0
            self.buf += data
        with memoryview(self.buf) as view:
            out = bytes(view[self.pos : self.pos + n])
        self.pos += n
        return out

    def _large(self, n: int) -> bytearray:
        out = bytearray(n)
        held = len(self.buf) - self.pos
        out[:held] = self.buf[self.pos :]
        self.buf.clear()
        self.pos = 0
        with memoryview(out) as view:
            while held < n:
                got = self.sock.recv_into(view[held:])
                if not got:
                    raise Closed("closed in the middle of a message")
                held += got
        return out

    def pipe(self, n: int, out: socket.socket) -> None:
        """``n`` bytes passed on to ``out``: what is buffered, then straight through."""
        held = min(n, len(self.buf) - self.pos)
        if held:
            with memoryview(self.buf) as view:
                out.sendall(view[self.pos : self.pos + held])
            self.pos += held
            n -= held
        if self._chunk is None and n:
            self._chunk = memoryview(bytearray(CHUNK))
        while n:
            got = self.sock.recv_into(self._chunk, min(n, CHUNK))
            if not got:
                raise Closed("closed in the middle of a message")
            out.sendall(self._chunk[:got])
            n -= got

    @property
    def buffered(self) -> bool:
        return len(self.buf) > self.pos


def send(sock: socket.socket, head: bytes, body: bytes | bytearray = b"") -> None:
    """``head`` then ``body``: joined when small (one system call), else with ``sendmsg`` where the
    platform has it (no copy of a large body)."""
    if len(body) < 65536 or not hasattr(sock, "sendmsg"):
        if len(body) < 65536:
            sock.sendall(head + body)
        else:
            sock.sendall(head)
            sock.sendall(body)
        return
    sent = sock.sendmsg([head, body])
    with memoryview(head) as first, memoryview(body) as rest:
        if sent < len(head):
            sock.sendall(first[sent:])
            sent = len(head)
        sock.sendall(rest[sent - len(head) :])


def nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def hung_up(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (readable, with nothing to read), without reading from it."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class Front(Protocol):
    """What a session needs of the proxy (rpc_proxy.Proxy): where the backend is, what the checks
    need, and how to ask for the backend's restart."""

    port: int
    traits: TypeTraits
    memory: tuple[int, ...]
    cache_dir: str | None
    restart: threading.Event
    restart_reason: str


class Session:
    """One client's turn on the backend: its messages checked and relayed, the backend's replies
    passed back, until the client closes the connection."""

    def __init__(self, proxy: Front, client: socket.socket, peer: str):
        self.proxy, self.client, self.peer = proxy, client, peer
        self.backend: socket.socket | None = None
        self.checks = Checks(proxy.traits, proxy.memory, proxy.cache_dir)
        self.replies: Reader | None = None
        self.started = False  # the backend answered its HELLO: it talks to the backend now

    def close(self) -> None:
        """Wake and end the session's thread (from the supervisor's thread too)."""
        for sock in (self.client, self.backend):
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def run(self) -> None:
        if not self._connect():
            return
        requests = Reader(self.client)
        while True:
            head = requests.take(9, start=True)
            if head is None:
                return
            self._relay(requests, head)

    def _connect(self) -> bool:
        """The backend's session opened and its HELLO reply passed on; False if the client left first.
        A backend that is restarting (refused, or closed at once) is waited for: the client keeps its
        turn. One that accepts but does not answer is restarted (the client is let go)."""
        deadline = monotonic() + BACKEND_TIMEOUT
        while monotonic() < deadline and not hung_up(self.client):
            try:
                backend = nodelay(
                    socket.create_connection(("127.0.0.1", self.proxy.port), timeout=BACKEND_TIMEOUT)
                )
            except OSError:
                sleep(0.2)
                continue
            replies = Reader(backend)
            try:
                backend.sendall(frame(HELLO, bytes(CAPS)))  # no transport upgrade (RDMA) through a proxy
                reply = replies.take(8 + HELLO_REPLY)
            except TimeoutError:
                close_quietly(backend)
                self.proxy.restart_reason = (
                    f"the backend did not answer {self.peer}'s HELLO within {BACKEND_TIMEOUT:g} s (still "
                    "busy with the previous client's work)"
                )
                self.proxy.restart.set()
                return False
            except (Closed, OSError):
                close_quietly(backend)
                sleep(0.2)
                continue
            backend.settimeout(None)  # a long computation is the client's to time out
            self.backend, self.replies, self.started = backend, replies, True
            self.client.sendall(reply[:12] + bytes(CAPS))
            return True
        return False

    def _relay(self, requests: Reader, head: bytes) -> None:
        cmd, size = struct.unpack("<BQ", head)
        if cmd not in SIZES:
            raise Refused(
                "a second HELLO" if cmd == HELLO else f"unknown command {cmd} (protocol 7 has 0-17)"
            )
        want, answer = SIZES[cmd]
        if want != VARIABLE and size != want:
            raise Refused(f"{describe(cmd)} of {size} bytes (protocol 7's is {want})")
        checks, backend = self.checks, self.backend
        if cmd == SET_TENSOR:  # the fixed part checked, the data streamed: weights may be GBs
            if size < SET_TENSOR_HEAD:
                raise Refused(f"SET_TENSOR of {size} bytes, shorter than its header")
            fixed = checks.set_tensor(requests.take(SET_TENSOR_HEAD), size - SET_TENSOR_HEAD)
            send(backend, head, fixed)
            requests.pipe(size - SET_TENSOR_HEAD, backend)
            return
        if cmd == GRAPH_COMPUTE and size > MAX_GRAPH_BYTES:
            raise Refused(f"GRAPH_COMPUTE of {size} bytes (at most {MAX_GRAPH_BYTES})")
        payload = requests.take(size)
        if cmd == GRAPH_COMPUTE:
            checks.graph(payload)
        else:
            checks.check(cmd, payload)
        send(backend, head, payload)
        if cmd == FREE_BUFFER:
            checks.free(checks.known(payload))
        if answer is not None:
            self._reply(cmd, payload, answer)

    def _reply(self, cmd: int, payload: bytes, size: int) -> None:
        replies = self.replies
        if not replies.buffered:
            self._await_backend()
        if cmd == GET_TENSOR:  # as much as it asked for (checked against the tensor)
            (size,) = struct.unpack_from("<Q", payload, TENSOR + 8)
        head = replies.take(8)
        if struct.unpack("<Q", head)[0] != size:
            raise Closed(f"the backend's reply to {describe(cmd)} has an unexpected size")
        if cmd == GET_TENSOR:
            self.client.sendall(head)
            replies.pipe(size, self.client)
            return
        body = replies.take(size)
        if cmd == ALLOC_BUFFER:  # learn the buffer's base and size, for the checks of its tensors
            ptr, allocated = struct.unpack("<QQ", body)
            if ptr:
                self.backend.sendall(frame(BUFFER_GET_BASE, struct.pack("<Q", ptr)))
                if replies.take(8) != struct.pack("<Q", 8):
                    raise Closed("the backend's reply to BUFFER_GET_BASE has an unexpected size")
                (base,) = struct.unpack("<Q", replies.take(8))
                self.checks.allocated_buffer(payload, ptr, allocated, base)
        send(self.client, head, body)

    def _await_backend(self) -> None:
        """Wait for the backend's reply, ending the session if the client hangs up meanwhile: a
        client that left does not hold the backend for the rest of a long computation."""
        watched = [self.backend, self.client]
        while True:
            readable, _, _ = select.select(watched, [], [])
            if self.backend in readable:
                return
            if hung_up(self.client):
                raise Closed("the client left while the backend computed")
            watched = [self.backend]  # the client sent its next message already: it waits its turn


def close_quietly(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
