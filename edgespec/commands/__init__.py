"""Subcommands of the `edgespec` CLI. Each module has ``register(subparsers)``; the parser it adds
sets ``run`` (a function taking the parsed args and returning an exit code)."""
