"""Draft planners: pure Python + numpy. Draft distributions in, a ``DraftTree`` out.

This package never imports llama_cpp; it is tested on synthetic distributions.
"""

from .base import Planner
from .inputs import Drafter, PlanContext, sample_without_replacement
from .tree import ChildRule, DraftTree, PlanStats, SparseDist, TreeBuilder

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
