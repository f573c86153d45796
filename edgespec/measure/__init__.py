"""`edgespec bench`: plain decoding and strategies on the same prompts, interleaved and paired.

``runner`` runs and summarises (no UI); ``document`` is the JSON a run writes (schema, machine,
models); ``report`` renders the table, the plot and comparisons. The command itself is
``edgespec.commands.bench``.
"""

from .runner import BenchConfig, BenchResult, Variant, run_bench, schedule, summarise

__all__ = ["BenchConfig", "BenchResult", "Variant", "run_bench", "schedule", "summarise"]
