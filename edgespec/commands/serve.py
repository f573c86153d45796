"""`edgespec serve`: speculation behind an OpenAI-compatible HTTP API (one pair, one answer at a time)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .. import options
from ..decoding import checks
from ..engine.limits import check_engine
from ..errors import EdgespecError

LOOPBACK = ("127.0.0.1", "::1", "localhost")
KEY_ENV = "EDGESPEC_API_KEY"
DEFAULT_CACHE_RAM_MIB = 2048


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a pair over an OpenAI-compatible API (/v1/chat/completions) for editors and agents",
        description="An OpenAI-compatible server (POST /v1/chat/completions, streaming or not, with "
        "tools; POST /v1/completions with fill in the middle, and llama-server's /infill; GET "
        "/v1/models; GET /health) on one target/draft pair. Answers queue in arrival order and each "
        "carries usage and llama-server-style timings with acceptance statistics. A prompt decodes only "
        "what the prompt cache does not hold already (recent conversations are kept within --cache-ram). "
        "Request fields that are left out (temperature, top_p, seed, max_tokens) take the values given "
        "here. "
        "See docs/security.md before binding anything but loopback.",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument(
        "--api-key-file",
        action="append",
        default=[],
        metavar="PATH",
        help=f"require 'Authorization: Bearer KEY' with the key in this file (or set ${KEY_ENV}); "
        "repeatable: one key per user, each with a prompt cache of its own",
    )
    p.add_argument(
        "--api-key",
        help=f"the key itself (visible to every local user in the process list: prefer ${KEY_ENV} "
        "or --api-key-file)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also accept requests whose Host (or a browser's Origin) names NAME (repeatable; '*': any). "
        "Default: loopback names and the bound address",
    )
    p.add_argument("--max-tokens", type=int, default=512, help="answer length when a request sets none")
    p.add_argument(
        "--queue", type=int, default=8, help="requests that may wait for the model (default 8; 0: none)"
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=8 * 1024 * 1024, help="largest request body (default 8 MiB)"
    )
    p.add_argument(
        "--max-messages", type=int, default=1024, help="most messages in one request (default 1024)"
    )
    p.add_argument(
        "--special-tokens",
        action="store_true",
        help="read special-token text in messages (<|im_end|> …) as markup; by default it is plain text, "
        "so a client cannot forge turns",
    )
    p.add_argument("--model-name", help="the model id clients send and /v1/models lists (default: the pair)")
    p.add_argument(
        "--strict-model",
        action="store_true",
        help="answer 404 to a request naming another model (default: any name gets this pair, as with "
        "llama-server; the response's model says which)",
    )
    p.add_argument(
        "--no-prompt-cache",
        dest="prompt_cache",
        action="store_false",
        help="start every answer from empty KV caches (bit-reproducible answers; every prompt is decoded "
        "in full). Default: a prompt decodes only what the caches do not hold already",
    )
    p.add_argument(
        "--cache-ram",
        type=int,
        default=DEFAULT_CACHE_RAM_MIB,
        metavar="MIB",
        help="host memory for recent conversations' KV, so clients taking turns do not evict each other "
        f"(default {DEFAULT_CACHE_RAM_MIB} MiB; 0: keep only the conversation in the contexts)",
    )
    p.add_argument(
        "--measure-first",
        action="store_true",
        help="measure the pair's cost profile before listening, the first time on this machine (a minute "
        "or two). Default: listen at once and measure between requests (answers meanwhile decode "
        "plainly or copy from the conversation)",
    )
    options.add_run_args(p)
    p.set_defaults(run=run)


def api_keys(args) -> tuple[str, ...]:
    """The keys from --api-key-file (each file one key), else --api-key (with a warning), else
    $EDGESPEC_API_KEY; none: no key. Fails closed: a key source that is given but empty, or a key that
    cannot be sent in a header, stops the server instead of starting it open."""
    if args.api_key_file:
        return tuple(_key_from_file(path) for path in args.api_key_file)
    if args.api_key is not None:
        key = _checked_key(args.api_key, "--api-key")
        print(
            f"edgespec: note: --api-key is visible to every user of this machine (ps); prefer ${KEY_ENV} "
            "or --api-key-file.",
            file=sys.stderr,
        )
        return (key,)
    if KEY_ENV in os.environ:  # set, even to nothing: `EDGESPEC_API_KEY=$(cat /missing)` must not run open
        return (_checked_key(os.environ[KEY_ENV].strip(), f"${KEY_ENV}"),)
    return ()


def _key_from_file(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
        mode = os.stat(path).st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgespecError(f"cannot read --api-key-file {path}: {exc}.") from None
    key = _checked_key(text.strip(), f"--api-key-file {path}")
    if mode & 0o077:
        print(
            f"edgespec: warning: the key file {path} may be read by other users of this machine "
            f"(mode {mode & 0o777:o}); make it yours alone: chmod 600 {path}",
            file=sys.stderr,
        )
    return key


def _checked_key(key: str, source: str) -> str:
    if not key:
        raise EdgespecError(
            f"{source} is empty: the server would run without a key. Put the key there (or leave it unset "
            "to serve without one)."
        )
    if not all(33 <= ord(c) <= 126 for c in key):  # what a Bearer header can carry (RFC 6750)
        raise EdgespecError(
            f"the key in {source} holds a space, a line break or a non-ASCII character: no client can send "
            "it in an Authorization header. Use one line of printable ASCII (e.g. `openssl rand -hex 32`)."
        )
    return key


def check(args) -> None:
    """Everything the command line can get wrong, before the models load."""
    if not 0 <= args.port <= 65535:
        raise EdgespecError(f"--port must be from 0 to 65535 (0: any free port), not {args.port}.")
    if args.queue < 0:
        raise EdgespecError(f"--queue must be 0 (no waiting) or more, not {args.queue}.")
    if args.max_body_bytes < 1024:
        raise EdgespecError(f"--max-body-bytes must be at least 1024, not {args.max_body_bytes}.")
    if args.max_messages < 1:
        raise EdgespecError(f"--max-messages must be at least 1, not {args.max_messages}.")
    if args.cache_ram < 0:
        raise EdgespecError(f"--cache-ram must be 0 (none) or more MiB, not {args.cache_ram}.")
    checks.check_max_tokens(args.max_tokens)
    check_engine(options.engine_settings(args))  # --ctx, --max-tree-nodes …: before anything loads
    options.sampling_params(args)


def run(args) -> int:
    import uvicorn

    from ..progress import progress_bar
    from ..server.app import create_app
    from ..server.guard import allowed_hosts, setup_logging
    from ..server.protocol import Defaults
    from ..server.worker import Worker
    from ..session import ChatBackend, start_session

    check(args)
    keys = api_keys(args)
    if args.host not in LOOPBACK and not keys:
        print(
            f"edgespec: note: {args.host} is reachable from other machines and no API key is set "
            "(see docs/security.md).",
            file=sys.stderr,
        )
    sock = _bind(args.host, args.port)  # before loading: a taken port fails in a second, not a minute
    try:
        # loading the pair (with --measure-first, the first time on this machine measuring its costs)
        with progress_bar("starting the server") as progress:
            backend = ChatBackend.from_args(args)
            load = lambda: start_session(  # noqa: E731
                backend, progress, prompt_cache=args.prompt_cache, measure_first=args.measure_first
            )
            worker = Worker(load, max_queue=args.queue)
            session = worker.start()
    except BaseException:
        sock.close()
        raise
    name = args.model_name or session.name
    defaults = Defaults(
        model=name,
        strict_model=args.strict_model,
        sampling=options.sampling_params(args),
        max_tokens=args.max_tokens,
        max_messages=args.max_messages,
        special_tokens=args.special_tokens,
    )
    hosts = allowed_hosts(args.host, args.allow_host)
    app = create_app(worker, defaults, session.strategy, keys, hosts, args.max_body_bytes)
    setup_logging()
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    try:
        bound = sock.getsockname()[1]
        print(
            f"edgespec: serving {name} ({session.strategy}) on http://{_url_host(args.host)}:{bound}/v1",
            file=sys.stderr,
            flush=True,
        )
        server.run(sockets=[sock])
        return 0 if server.started else 1
    finally:
        worker.stop()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _bind(host: str, port: int):
    """The listening socket (so the printed address has the real port when --port 0)."""
    import socket

    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        raise EdgespecError(f"cannot listen on {host}:{port} ({exc}); pick another --port.") from None
    return sock
