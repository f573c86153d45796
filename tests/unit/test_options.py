"""Shared CLI options: which of a pair's defaults reach the planner."""

from __future__ import annotations

import argparse

from edgespec import options
from edgespec.strategy import make_planner as _make


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_model_args(parser)
    options.add_strategy_args(parser)
    return parser.parse_args(list(argv))


def _planner(args: argparse.Namespace, resolved):
    """What `generate` builds for these arguments (without loading the pair)."""
    return _make(options.strategy_choice(args), resolved.defaults)


RESOLVED = options.ResolvedPair(
    "fake+pair", "t.gguf", "d.gguf", {"strategy": "chain", "budget": 6, "p_min": 0.3}
)


def test_the_pairs_budget_applies_to_its_own_strategy_only():
    chain = _planner(_args("--strategy", "chain"), RESOLVED)
    assert (chain.gamma, chain.p_min) == (6, 0.3)
    assert _planner(_args("--strategy", "opt-tree"), RESOLVED).budget == 24  # OPT-Tree's own n
    assert _planner(_args("--strategy", "mcsd"), RESOLVED).budget == 0  # the full k-configuration
    assert _planner(_args("--strategy", "tsd", "--budget", "12"), RESOLVED).budget == 12  # flags win
