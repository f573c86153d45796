"""Built-in prompt sets, written for edgespec in the spirit of the papers' benchmarks."""

from __future__ import annotations

# Varied on purpose: code, prose, non-English scripts and emoji (multi-byte UTF-8 across tokens).
ENGINE_PROMPTS: tuple[str, ...] = (
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain in three sentences why the sky is blue.",
    "Écris une courte description de Paris en français.",
    "用中文写两句关于春天的诗。",
    "Reply with a short cheerful message that uses at least three emoji 🎉.",
    "Write a SQL query that lists the ten customers with the highest total order value.",
    "Translate to German: 'The train leaves at seven, so we should hurry.'",
    "A farmer has 17 sheep; all but 9 run away. How many are left? Explain step by step.",
)
