"""The `edgespec` command: one module per subcommand under ``edgespec/commands``."""

from __future__ import annotations

import argparse
import sys
import warnings
from importlib import import_module

from . import __version__
from .errors import EdgespecError

SUBCOMMANDS = ("chat", "generate", "bench", "models", "tune")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgespec",
        description="Faster local LLM answers through tree- and graph-structured speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"edgespec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        import_module(f".commands.{name}", __package__).register(sub)
    return parser


def _note(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings meant for users (e.g. the AMX guard) as one plain line, not a source excerpt."""
    print(f"edgespec: note: {message}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _note
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except EdgespecError as exc:
        print(f"edgespec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgespec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
