"""llama.cpp's RPC protocol (7.0.0) built from the vendored ggml-rpc.cpp's structs, for tests: not with
edgespec's own encoder (edgespec/engine/rpc_protocol.py), so they run against any RPC server."""

from __future__ import annotations

import socket
import struct

ALLOC_BUFFER, BUFFER_GET_BASE, GRAPH_COMPUTE, GET_DEVICE_MEMORY, HELLO = 0, 3, 10, 11, 14
OP_ADD, COMPUTE = 2, 16  # GGML_OP_ADD; GGML_TENSOR_FLAG_COMPUTE (a node without it is skipped)


def frame(cmd: int, payload: bytes = b"") -> bytes:
    return struct.pack("<BQ", cmd, len(payload)) + payload


def tensor(
    id: int,
    *,
    buffer: int = 0,
    data: int = 0,
    ne=(1, 1, 1, 1),
    nb=None,
    type: int = 0,
    op: int = 0,
    src=(),
    flags: int = 0,
) -> bytes:
    """``struct rpc_tensor`` (296 bytes, packed); f32 strides unless ``nb`` is given."""
    if nb is None:
        nb = tuple(x % 2**32 for x in (4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]))
    srcs = [*src, *[0] * (10 - len(src))]
    fields = [id, type, buffer, *ne, *nb, op, *[0] * 16, flags, *srcs, 0, 0, data, b"t", 0]
    return struct.pack("<QIQ4I4II16ii10QQQQ64si", *fields)


def graph(nodes: list[int], tensors: list[bytes]) -> bytes:
    ids = b"".join(struct.pack("<Q", n) for n in nodes)
    return struct.pack("<II", 0, len(nodes)) + ids + struct.pack("<I", len(tensors)) + b"".join(tensors)


class Client:
    """A session: HELLO answered, then requests."""

    def __init__(self, port: int, timeout: float = 10):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.sendall(frame(HELLO, bytes(24)))
        size, = struct.unpack("<Q", self.recv(8))
        assert size == 28 and self.recv(28)[:3] == bytes([7, 0, 0])

    def recv(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def call(self, cmd: int, payload: bytes, reply: int) -> bytes:
        self.sock.sendall(frame(cmd, payload))
        assert struct.unpack("<Q", self.recv(8))[0] == reply
        return self.recv(reply)

    def alloc(self, size: int) -> tuple[int, int]:
        ptr, _ = struct.unpack("<QQ", self.call(ALLOC_BUFFER, struct.pack("<IQ", 0, size), 16))
        assert ptr
        (base,) = struct.unpack("<Q", self.call(BUFFER_GET_BASE, struct.pack("<Q", ptr), 8))
        return ptr, base

    def closed_by_server(self, timeout: float = 10) -> bool:
        """Whether the server closes the session (anything it still sends is read and dropped)."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
            return True
        except TimeoutError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()
