"""Shared CLI options: which of a pair's defaults reach the planner."""

from __future__ import annotations

import argparse

from edgespec import options


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_model_args(parser)
    options.add_strategy_args(parser)
    return parser.parse_args(list(argv))


RESOLVED = options.ResolvedPair(
    "fake+pair", "t.gguf", "d.gguf", {"strategy": "chain", "budget": 6, "p_min": 0.3}
)


def test_the_pairs_budget_applies_to_its_own_strategy_only():
    chain = options.make_planner(_args("--strategy", "chain"), RESOLVED)
    assert (chain.gamma, chain.p_min) == (6, 0.3)
    assert options.make_planner(_args("--strategy", "opt-tree"), RESOLVED).budget == 24  # OPT-Tree's own n
    assert options.make_planner(_args("--strategy", "mcsd"), RESOLVED).budget == 0  # the full k-configuration
    assert (
        options.make_planner(_args("--strategy", "tsd", "--budget", "12"), RESOLVED).budget == 12
    )  # flags win
