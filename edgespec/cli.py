"""The `edgespec` command: one module per subcommand under ``edgespec/commands``."""

from __future__ import annotations

import argparse
import errno
import sys
import warnings
from importlib import import_module

from . import __version__
from .errors import EdgespecError

PROBE_COMMAND = "--engine-probe"  # hidden: see edgespec.engine.probe

SUBCOMMANDS = ("chat", "generate", "bench", "models", "tune", "serve", "rpc_server", "train")


class _Version(argparse.Action):
    """edgespec, llama-cpp-python and llama.cpp versions, and the native backend's compiled-in features
    (what a bug report needs)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from .engine import backend_versions

        print(f"edgespec {__version__}" + (" (single binary)" if getattr(sys, "frozen", False) else ""))
        for line in backend_versions():
            print(line)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgespec",
        description="Faster local LLM answers through tree- and graph-structured speculative decoding.",
    )
    parser.add_argument("--version", action=_Version, help="print versions and the CPU backend, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        import_module(f".commands.{name}", __package__).register(sub)
    return parser


def _note(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings meant for users (e.g. the AMX guard) as one plain line, not a source excerpt."""
    print(f"edgespec: note: {message}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _note
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [PROBE_COMMAND]:  # the backend probe's child, when frozen (no `python -m` there)
        from .engine.probe import child

        return child(argv[1:])
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not args.command:
            parser.print_help()
            return 2
        return int(args.run(args) or 0)
    except EdgespecError as exc:
        print(f"edgespec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgespec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `edgespec … | head`: the reader left; nothing more to say
        sys.stderr.close()
        return 141
    except OSError as exc:  # a file or directory edgespec needs: unreadable, read-only, full
        print(f"edgespec: error: {os_error(exc)}", file=sys.stderr)
        return 1


_DISK_ERRNOS = {
    errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOENT, errno.ENOTDIR
}


def os_error(exc: OSError) -> str:
    """An ``OSError`` as one line: what failed, on which file, and what to do."""
    what = exc.strerror or str(exc) or type(exc).__name__
    where = f": {exc.filename}" if exc.filename else ""
    hint = ""
    if exc.errno in _DISK_ERRNOS:
        hint = (
            ". Check that the directory is writable and has free space, or point EDGESPEC_HOME "
            "(models, chats) or EDGESPEC_CONFIG (models.toml) at another one"
        )
    return f"{what}{where}{hint}."


if __name__ == "__main__":
    sys.exit(main())
