"""`edgespec rpc-server`: this machine's backend (its CPU, or the GPUs of a CUDA build) served to
another machine's edgespec through llama.cpp's own RPC server (engine/rpc.py), until Ctrl-C."""

from __future__ import annotations

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
    p.set_defaults(run=run)


def run(args) -> int:
    from ..engine import rpc
    from ..models.paths import home_dir

    host, port = args.host, args.port
    try:
        loopback = ipaddress.IPv4Address(host).is_loopback
    except ValueError:
        raise EdgespecError(
            f"--host {host!r} is not an IPv4 address (llama.cpp's server binds IPv4 only)."
        ) from None
    _check_port(host, port)
    cache = None
    if args.cache is not None:
        cache = args.cache or str(home_dir() / "rpc-cache")
        os.makedirs(cache, exist_ok=True)
    if not loopback:
        print(WARNING.format(host=host, port=port), file=sys.stderr, flush=True)
    threads = args.threads or os.cpu_count() or 1  # (os.sched_getaffinity is Linux only)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops it like Ctrl-C does
    server = rpc.serve(f"{host}:{port}", threads, cache)
    print(
        f"edgespec rpc-server on {host}:{port} ({threads} threads); Ctrl-C stops it",
        file=sys.stderr,
        flush=True,
    )
    try:
        while server.is_alive():
            server.join(0.5)
    except KeyboardInterrupt:
        print("edgespec rpc-server: stopped", file=sys.stderr, flush=True)
        # llama.cpp's server has no stop call and its thread may be inside a computation: leave without
        # running the library's static destructors under it.
        sys.stdout.flush()
        os._exit(0)
    raise EdgespecError(f"llama.cpp's RPC server stopped: it could not listen on {host}:{port} (see above).")


def _check_port(host: str, port: int) -> None:
    """A port in use is a plain error, before llama.cpp tries (it would only print that it failed)."""
    if not 0 < port < 65536:
        raise EdgespecError(f"--port {port} is not a port number (1-65535).")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as llama.cpp's server does
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise EdgespecError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}): another server may use the port; "
                "pick another with --port, or check that the address belongs to this machine."
            ) from None
