"""`edgespec rpc-server`'s front: the port clients reach, in front of llama.cpp's RPC server (a child
process on a loopback port, rpc_backend.py).

llama.cpp's server serves one connection at a time and reads it without timeouts, so a connection that
sends nothing kept everyone else's HELLO unanswered, and it trusts every message, so one crafted
message aborted it. Here:

- each connection reads its HELLO on a thread of its own, within ``HELLO_TIMEOUT`` seconds in all;
  at most ``WAITING`` connections read theirs or wait for their turn, more are closed at once, with
  a log line;
- whoever sent a whole HELLO queues for the backend, first come first served (llama.cpp's one client
  at a time); a waiting client that hangs up leaves the queue; the session holds the backend until
  its client closes the connection — idle between messages is allowed (a chat sits idle between
  turns), but inside a message ``STALL_TIMEOUT`` seconds without a byte (either way) end it;
- every message is checked before the backend reads it (rpc_protocol.py); a refused one ends its
  session with a log line that names the peer and the reason;
- when the backend dies anyway, the supervisor (commands/rpc_server.py) calls ``lost``: the session
  in progress is closed, its peer named, and the queue waits for the restarted backend.

A session's relay is rpc_session.py.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
from collections import deque
from time import monotonic

from .rpc_protocol import CAPS, HELLO, Refused, TypeTraits, describe, frame
from .rpc_session import STALL_TIMEOUT, Closed, Session, close_quietly, hung_up, nodelay

HELLO_TIMEOUT = 10.0  # seconds for a new connection's whole HELLO
WAITING = 8  # connections reading their HELLO or waiting for the backend
LOG_EVERY = 10.0  # seconds between two log lines of one kind (the rest are counted)


class Log:
    """One line per event on stderr; a kind of event repeated (a flood of connections) at most once
    per ``LOG_EVERY`` seconds, with the count of the lines left out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def __call__(self, text: str, kind: str | None = None) -> None:
        with self._lock:
            if kind is not None:
                now = monotonic()
                if now - self._last.get(kind, -LOG_EVERY) < LOG_EVERY:
                    self._left_out[kind] = self._left_out.get(kind, 0) + 1
                    return
                self._last[kind] = now
                if self._left_out.get(kind):
                    text += f" ({self._left_out.pop(kind)} more like it since the last such line)"
            print(f"edgespec rpc-server: {text}", file=sys.stderr, flush=True)


class Gate:
    """The backend, one session at a time, in the order the HELLOs arrived; closed while it restarts."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[socket.socket] = deque()
        self._busy = False
        self.open = False

    def enter(self, sock: socket.socket) -> bool:
        """Wait for the turn of ``sock``'s client: False if it hung up meanwhile."""
        with self._cond:
            self._queue.append(sock)
            try:
                while not (self.open and not self._busy and self._queue[0] is sock):
                    self._cond.wait(1.0)
                    if hung_up(sock):
                        return False
                self._busy = True
                return True
            finally:
                self._queue.remove(sock)
                self._cond.notify_all()

    def leave(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def set_open(self, value: bool) -> None:
        with self._cond:
            self.open = value
            self._cond.notify_all()


class Proxy:
    """Listens on ``listener`` and serves each client through the backend at ``ready``'s port."""

    def __init__(self, listener: socket.socket, traits: TypeTraits, cache_dir: str | None, log: Log):
        self.listener, self.traits, self.cache_dir, self.log = listener, traits, cache_dir, log
        self.gate = Gate()
        self.port = 0
        self.memory: tuple[int, ...] = ()
        self.restart = threading.Event()  # a session found the backend unresponsive
        self.restart_reason = ""
        self._waiting = threading.BoundedSemaphore(WAITING)
        self._session: Session | None = None
        self._last: tuple[str | None, float] = (None, 0.0)  # the last session that talked to a backend
        self._lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._accept, name="edgespec-rpc-accept", daemon=True).start()

    def ready(self, port: int, memory: tuple[int, ...]) -> None:
        """A backend listens on ``port``, its devices of ``memory`` bytes: sessions may start."""
        self.port, self.memory = port, memory
        self.restart.clear()
        self.gate.set_open(True)

    def lost(self) -> str | None:
        """The backend is gone: hold the queue and close the session that talked to it; its peer (or
        the peer of a session the backend's death just ended), if any."""
        self.gate.set_open(False)
        with self._lock:
            session, (last, ended) = self._session, self._last
        if session is not None and session.started:
            session.close()
            return session.peer
        return last if monotonic() - ended < 5.0 else None

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.listener.accept()
            except OSError as exc:  # out of file descriptors, say: wait, rather than spin
                self.log(f"cannot accept a connection ({exc.strerror or exc})", kind="accept")
                threading.Event().wait(0.5)
                continue
            peer = f"{address[0]}:{address[1]}"
            if not self._waiting.acquire(blocking=False):
                self.log(
                    f"refused a connection from {peer}: {WAITING} connections already wait for the "
                    "server (it serves one client at a time)",
                    kind="full",
                )
                close_quietly(sock)
                continue
            threading.Thread(target=self._serve, args=(sock, peer), daemon=True).start()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        waiting, host = True, peer.rpartition(":")[0]
        try:
            nodelay(sock)
            try:
                self._read_hello(sock)
            except Refused as why:  # one line per host and LOG_EVERY: a flood stays a few lines
                self.log(f"closed the connection from {peer}: {why}", kind=f"hello {host}")
                return
            if not self.gate.enter(sock):
                return
            self._waiting.release()
            waiting = False
            session = Session(self, sock, peer)
            with self._lock:
                self._session = session
            try:
                session.run()
            except Refused as why:  # said before the connection closes
                self.log(f"closed the connection from {peer}: {why}", kind=f"refused {host}")
            except TimeoutError:
                self.log(
                    f"closed the connection from {peer}: {STALL_TIMEOUT:g} s without a byte inside a "
                    "message (sent or received)",
                    kind=f"stalled {host}",
                )
            finally:
                with self._lock:
                    self._session = None
                    if session.started:
                        self._last = (peer, monotonic())
                session.close()
                if session.backend is not None:
                    close_quietly(session.backend)
                self.gate.leave()
        except (Closed, OSError):
            pass  # the client left, or the backend closed the session (llama.cpp printed why)
        finally:
            if waiting:
                self._waiting.release()
            close_quietly(sock)

    def _read_hello(self, sock: socket.socket) -> None:
        """The HELLO, whole, within ``HELLO_TIMEOUT`` seconds (a connection that sends nothing, or a
        byte at a time, is closed then)."""
        deadline, data = monotonic() + HELLO_TIMEOUT, b""
        while len(data) < 9 + CAPS:
            left = deadline - monotonic()
            if left <= 0:
                raise Refused(f"no HELLO within {HELLO_TIMEOUT:g} s ({len(data)} of its {9 + CAPS} bytes)")
            sock.settimeout(left)
            try:
                chunk = sock.recv(9 + CAPS - len(data))
            except TimeoutError:
                continue
            if not chunk:
                raise Closed("left before its HELLO")
            data += chunk
            if len(data) >= 9 and data[:9] != frame(HELLO, bytes(CAPS))[:9]:
                cmd, size = struct.unpack_from("<BQ", data)
                raise Refused(
                    f"not llama.cpp's RPC protocol 7: it began with {describe(cmd)} of {size} bytes, "
                    "not HELLO"
                )
        sock.settimeout(STALL_TIMEOUT)
