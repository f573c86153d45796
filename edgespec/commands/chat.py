"""`edgespec chat`: the terminal chat app, with speculation shown live."""

from __future__ import annotations

import sys

from .. import options
from ..decoding import checks
from ..decoding.chat import ChatSettings
from ..engine.limits import check_engine
from ..errors import EdgespecError


def register(sub) -> None:
    p = sub.add_parser(
        "chat",
        help="chat in the terminal; answers stream with accepted draft tokens highlighted",
        description="A terminal chat on a target/draft pair (default: the bundled pair). Answers stream "
        "token by token, coloured by who chose each token; the status bar shows tokens/s, mean accepted "
        "length and acceptance. Conversations are kept in <data dir>/chats.sqlite3 (EDGESPEC_HOME). "
        "Inside: ctrl+p for commands, Esc stops an answer, ctrl+q quits.",
    )
    p.add_argument("--max-tokens", type=int, default=512, help="longest answer in tokens (default 512)")
    p.add_argument("--system", default="", help="system prompt")
    options.add_run_args(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from tui.app import ChatApp
    from tui.storage import ChatStore

    from ..session import ChatBackend

    if not has_terminal():  # the app would draw into a pipe and wait for keys that never come
        raise EdgespecError(
            "edgespec chat needs a terminal (standard input and output are not one); for one answer "
            "use `edgespec generate PROMPT` (or `generate -` to read a pipe), for programs `edgespec serve`."
        )
    checks.check_max_tokens(args.max_tokens)
    checks.check_text(args.system, "--system")
    check_engine(options.engine_settings(args))  # --ctx, --max-tree-nodes …: before anything loads
    settings = ChatSettings(
        sampling=options.sampling_params(args), max_tokens=args.max_tokens, system_prompt=args.system
    )
    app = ChatApp(ChatBackend.from_args(args), ChatStore(exclusive=True), settings=settings)
    app.run()
    return int(app.return_code or 0)


def has_terminal() -> bool:
    """Both standard input and standard output are a terminal (closed ones are not)."""
    try:
        return all(stream is not None and stream.isatty() for stream in (sys.stdin, sys.stdout))
    except ValueError:  # a closed stream
        return False
