"""`edgespec serve`: speculation behind an OpenAI-compatible HTTP API (one pair, one answer at a time)."""

from __future__ import annotations

import os
import sys

from .. import options
from ..errors import EdgespecError

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a pair over an OpenAI-compatible API (/v1/chat/completions) for editors and agents",
        description="An OpenAI-compatible server (POST /v1/chat/completions, streaming or not; GET "
        "/v1/models; GET /health) on one target/draft pair. Answers queue in arrival order and each "
        "carries usage and llama-server-style timings with acceptance statistics. Request fields that "
        "are left out (temperature, top_p, seed, max_tokens) take the values given here.",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("EDGESPEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every request (default: $EDGESPEC_API_KEY, else none)",
    )
    p.add_argument("--max-tokens", type=int, default=512, help="answer length when a request sets none")
    p.add_argument("--queue", type=int, default=8, help="requests that may wait for the model (default 8)")
    p.add_argument("--model-name", help="the model id clients send and /v1/models lists (default: the pair)")
    options.add_run_args(p)
    p.set_defaults(run=run)


def run(args) -> int:
    import uvicorn

    from ..server.app import create_app
    from ..server.protocol import Defaults
    from ..server.worker import Worker
    from ..session import ChatBackend, start_session

    if args.host not in LOOPBACK and not args.api_key:
        print(
            f"edgespec: note: {args.host} is reachable from other machines and no --api-key is set.",
            file=sys.stderr,
        )
    worker = Worker(lambda: start_session(ChatBackend.from_args(args)), max_queue=args.queue)
    session = worker.start()
    name = args.model_name or session.name
    defaults = Defaults(model=name, sampling=options.sampling_params(args), max_tokens=args.max_tokens)
    app = create_app(worker, defaults, session.strategy, api_key=args.api_key)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    try:
        return 0 if _serve(server, args.host, args.port, name, session.strategy) else 1
    finally:
        worker.stop()


def _serve(server, host: str, port: int, name: str, strategy: str) -> bool:
    """Bind first (so the printed address has the real port when --port 0), then hand uvicorn the socket."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise EdgespecError(f"cannot listen on {host}:{port} ({exc}); pick another --port.") from None
    bound = sock.getsockname()[1]
    print(f"edgespec: serving {name} ({strategy}) on http://{host}:{bound}/v1", file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    return server.started
