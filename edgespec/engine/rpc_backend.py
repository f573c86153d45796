"""`edgespec rpc-server`'s backend: llama.cpp's RPC server in a child process of its own
(rpc_child.py), on a loopback port that only the proxy (rpc_proxy.py) connects to; this module starts
it, watches it and asks it for its devices' memory, without loading llama.cpp.

llama.cpp's server aborts the process on a message it cannot handle (a ``GGML_ASSERT`` in an
operation, a crash in a kernel): in a child, that costs the client who sent it its session, and the
parent starts another child while everyone else keeps their place. llama.cpp's server has no stop
call, so the child is killed, as the process that ran it used to end under it; what a client sent
lives in its session's buffers, gone with the session, and only ``--cache`` is on disk. The child
leaves by itself when its parent goes (its stdin, a pipe from the parent, closes).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys

from .rpc_protocol import CAPS, DEVICE_COUNT, GET_DEVICE_MEMORY, HELLO, HELLO_REPLY, frame


class Backend:
    """The child process: ``is_alive`` and ``join`` as the thread that ran llama.cpp's server in process
    had, ``stop``, and how it ended."""

    def __init__(self, process: subprocess.Popen):
        self.process = process

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def ended(self) -> str:
        """How it ended, in words: ``killed by SIGABRT``, ``exited with status 3``."""
        code = self.process.poll()
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with status {code}"


def command(endpoint: str, threads: int, cache_dir: str | None) -> list[str]:
    """The child's command line: this package's module, or the single binary (which has no ``-m``)."""
    if getattr(sys, "frozen", False):
        cache = ["--cache", cache_dir] if cache_dir else []
        return [sys.executable, "rpc-server", "--backend", endpoint, str(threads), *cache]
    return [sys.executable, "-m", "edgespec.engine.rpc_child", endpoint, str(threads), cache_dir or ""]


def start(endpoint: str, threads: int, cache_dir: str | None) -> Backend:
    """The child started (not yet listening: ``probe`` says when it is). Its stdout and stderr are
    this process's: llama.cpp's banner and its lines about each client, as before."""
    env = dict(os.environ)
    env.setdefault("GGML_NO_BACKTRACE", "1")  # an abort would otherwise attach gdb before restarting
    process = subprocess.Popen(command(endpoint, threads, cache_dir), stdin=subprocess.PIPE, env=env)
    return Backend(process)


def probe(port: int, timeout: float) -> tuple[int, ...] | None:
    """The backend's devices' total memory (a session of HELLO, DEVICE_COUNT and GET_DEVICE_MEMORY),
    or None while it does not answer. The proxy's limit on allocations."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(frame(HELLO, bytes(CAPS)) + frame(DEVICE_COUNT))
            _reply(sock, HELLO_REPLY)
            (count,) = struct.unpack("<I", _reply(sock, 4))
            memory = []
            for device in range(count):
                sock.sendall(frame(GET_DEVICE_MEMORY, struct.pack("<I", device)))
                memory.append(struct.unpack("<QQ", _reply(sock, 16))[1])
            return tuple(memory)
    except (OSError, ValueError):
        return None


def _reply(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < 8 + size:
        chunk = sock.recv(8 + size - len(data))
        if not chunk:
            raise ValueError("closed")
        data += chunk
    if struct.unpack_from("<Q", data)[0] != size:
        raise ValueError("unexpected reply")
    return data[8:]
