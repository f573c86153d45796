"""Draft planners: pure Python + numpy. Draft distributions in, a ``DraftTree`` out.

This package never imports llama_cpp; it is tested on synthetic distributions.
"""

from .tree import (
    ChildRule,
    Drafter,
    DraftTree,
    PlanContext,
    Planner,
    PlanStats,
    SparseDist,
    TreeBuilder,
    sample_without_replacement,
)

__all__ = [
    "ChildRule",
    "Drafter",
    "DraftTree",
    "PlanContext",
    "PlanStats",
    "Planner",
    "SparseDist",
    "TreeBuilder",
    "sample_without_replacement",
]
