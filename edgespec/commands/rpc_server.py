"""`edgespec rpc-server`: this machine's backend (its CPU, or the GPUs of a CUDA build) served to
another machine's edgespec through llama.cpp's own RPC server, until Ctrl-C.

llama.cpp's server runs in a child process on a loopback port (engine/rpc_backend.py, rpc_child.py);
this process listens on the address given and passes each client's checked messages to it
(engine/rpc_proxy.py), and starts a new child when one dies (docs/security.md: what a peer can still
do)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import sys

from ..errors import EdgespecError

WARNING = """\
WARNING: serving on {host}, not on loopback. llama.cpp's RPC protocol has no authentication and no
encryption: anyone who can reach {host}:{port} can run code on this machine's backend and read or
write its memory. Use it only on a trusted network (a home LAN, a VPN), never on the internet."""
READY_TIMEOUT = 60.0  # seconds for a backend to start listening (it loads llama.cpp's libraries)
ATTEMPTS = 3  # starts of a backend that never listens before giving up (an ephemeral port raced)


def register(sub) -> None:
    p = sub.add_parser(
        "rpc-server",
        help="serve this machine's CPU (or GPU) to another machine's edgespec (--rpc)",
        description="Serve this machine's backend through llama.cpp's RPC server, so that an edgespec "
        "elsewhere can put part of its target model here (`edgespec chat --rpc THIS-HOST:PORT`). One "
        "client at a time. The protocol has no authentication or encryption: the default binds to "
        "loopback only; bind another address only on a trusted network.",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="IPv4 address to bind (default 127.0.0.1: this machine)"
    )
    p.add_argument("--port", type=int, default=50052, help="port (default 50052)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument(
        "--cache",
        nargs="?",
        const="",
        metavar="DIR",
        help="keep received weights in DIR (default: <data home>/rpc-cache), so a client loading the same "
        "model again sends hashes instead of weights",
    )
    # The backend's child process, when edgespec is the single binary (no `python -m` there).
    p.add_argument("--backend", nargs=2, metavar=("ENDPOINT", "THREADS"), help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def run(args) -> int:
    if args.backend:
        from ..engine.rpc_child import child

        return child(args.backend[0], int(args.backend[1]), args.cache or None)
    from ..engine import rpc
    from ..engine.rpc_child import type_traits
    from ..engine.rpc_proxy import Log, Proxy
    from ..models.paths import home_dir

    host, port = args.host, args.port
    try:
        loopback = ipaddress.IPv4Address(host).is_loopback
    except ValueError:
        raise EdgespecError(
            f"--host {host!r} is not an IPv4 address (llama.cpp's server binds IPv4 only)."
        ) from None
    listener = _listen(host, port)
    try:
        cache = None
        if args.cache is not None:
            cache = args.cache or str(home_dir() / "rpc-cache")
            os.makedirs(cache, exist_ok=True)
        if not loopback:
            print(WARNING.format(host=host, port=port), file=sys.stderr, flush=True)
        threads = args.threads or os.cpu_count() or 1  # (os.sched_getaffinity is Linux only)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops it like Ctrl-C does
        log = Log()
        proxy = Proxy(listener, type_traits(), cache, log)
        backend, ready = _start(rpc, threads, cache)
        proxy.ready(*ready)
    except BaseException:
        listener.close()
        raise
    proxy.start()
    print(
        f"edgespec rpc-server on {host}:{port} ({threads} threads); Ctrl-C stops it",
        file=sys.stderr,
        flush=True,
    )
    try:
        while True:
            backend.join(0.5)
            if backend.is_alive() and not proxy.restart.is_set():
                continue
            if backend.is_alive():  # a session found it unresponsive
                why = proxy.restart_reason
                proxy.lost()
                backend.stop()
            else:
                peer = proxy.lost()
                during = f"during the session of {peer}" if peer else "with no client connected"
                why = f"llama.cpp's backend {backend.ended()} {during}"
                if peer:
                    why += " (that client was disconnected)"
            log(f"{why}; restarting it")
            backend, ready = _start(rpc, threads, cache)
            log("the backend is back; serving")
            proxy.ready(*ready)
    except KeyboardInterrupt:
        print("edgespec rpc-server: stopped", file=sys.stderr, flush=True)
        backend.stop()
        # A session's thread may be inside a relay: leave without waiting for it.
        sys.stdout.flush()
        os._exit(0)


def _start(rpc, threads: int, cache: str | None):
    """A backend child listening on a free loopback port, and (its port, its devices' memory) for the
    proxy; an ``EdgespecError`` when it stops before it listens (llama.cpp printed why)."""
    from time import monotonic

    from ..engine.rpc_backend import probe

    for _ in range(ATTEMPTS):
        port = _free_loopback_port()
        backend = rpc.serve(f"127.0.0.1:{port}", threads, cache)
        deadline = monotonic() + READY_TIMEOUT
        while backend.is_alive() and monotonic() < deadline:
            memory = probe(port, timeout=2.0)
            if memory is not None:
                return backend, (port, memory)
            backend.join(0.1)
        if backend.is_alive():  # never listened within the time
            backend.stop()
    raise EdgespecError(
        "llama.cpp's RPC server stopped: it could not listen on a loopback port for edgespec rpc-server's "
        "backend (see above)."
    )


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listen(host: str, port: int) -> socket.socket:
    """The clients' socket; a port in use is a plain error."""
    if not 0 < port < 65536:
        raise EdgespecError(f"--port {port} is not a port number (1-65535).")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama.cpp's server does
    try:
        listener.bind((host, port))
        listener.listen(16)
    except OSError as exc:
        listener.close()
        raise EdgespecError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): another server may use the port; "
            "pick another with --port, or check that the address belongs to this machine."
        ) from None
    return listener
