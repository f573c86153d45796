"""The training prompt set: short coding and chat instructions, generated from templates.

Disjoint from the bench sets on purpose (``edgespec.measure.prompts`` and ``data/copy_prompts.toml``): the
drafter is measured on prompts it never saw. The set is deterministic (a fixed product of templates
and subjects, shuffled with a fixed seed), so a data run can resume by prompt index.
"""

from __future__ import annotations

import random

_LANGUAGES = ("Python", "JavaScript", "Rust", "Go", "C", "Java", "TypeScript", "Bash")

_CODE_TASKS = (
    "reverses the words of a sentence",
    "counts the vowels in a string",
    "checks whether a number is prime",
    "returns the largest element of a list",
    "removes duplicates from a list while keeping order",
    "converts Celsius to Fahrenheit",
    "computes the factorial of n recursively",
    "merges two sorted arrays",
    "checks whether a string is a palindrome",
    "flattens a nested list",
    "returns the n-th triangular number",
    "parses a date string in YYYY-MM-DD format",
    "reads a text file and counts its lines",
    "computes the greatest common divisor of two integers",
    "transposes a matrix",
    "finds the second smallest number in an array",
    "capitalises the first letter of every word",
    "groups words by their first letter",
    "computes a running average of a stream of numbers",
    "validates an email address with a simple rule",
    "converts a Roman numeral to an integer",
    "implements a stack with push, pop and peek",
    "rotates an array by k positions",
    "returns the intersection of two lists",
    "checks whether two strings are anagrams",
    "sums the digits of an integer",
    "generates the first n prime numbers",
    "implements a simple LRU cache",
    "counts word frequencies in a text",
    "chunks a list into pieces of size n",
)

_CODE_TEMPLATES = (
    "Write a {lang} function that {task}.",
    "Show a short {lang} snippet that {task}, with a one-line comment.",
    "In {lang}, how would I write code that {task}? Keep it brief.",
)

_CHAT_SUBJECTS = (
    "a hash table", "recursion", "garbage collection", "a REST API", "version control with git",
    "unit tests", "a race condition", "Big-O notation", "a linked list", "TCP versus UDP",
    "a compiler", "an operating system kernel", "caching", "public-key cryptography", "a database index",
    "functional programming", "containers like Docker", "a binary search tree", "floating-point rounding",
    "photosynthesis", "the water cycle", "compound interest", "how vaccines work", "the seasons on Earth",
    "a black hole", "supply and demand", "the French Revolution", "plate tectonics", "machine learning",
    "an electric motor",
)

_CHAT_TEMPLATES = (
    "Explain {subject} to a beginner in a few sentences.",
    "Give three bullet points about {subject}.",
    "What is a common misconception about {subject}?",
)

_CHAT_EXTRA = (
    "Suggest five names for a small coffee shop.",
    "Write a haiku about debugging at night.",
    "Give me three tips for writing clear commit messages.",
    "Write a short polite email declining a meeting invitation.",
    "List four healthy breakfast ideas.",
    "Summarise the plot of a typical detective story in two sentences.",
    "Write a limerick about a cat who learns to code.",
    "What should I pack for a weekend hiking trip?",
    "Give a short motivational message for a student before an exam.",
    "Describe a sunset over the sea in three sentences.",
    "What are good habits for reviewing someone else's code?",
    "Write a short product description for a reusable water bottle.",
)


def training_prompts(n: int | None = None, seed: int = 13) -> list[str]:
    """Up to ``n`` distinct instructions (all of them when ``n`` is None), in a fixed shuffled order."""
    code = [t.format(lang=lang, task=task)
            for t in _CODE_TEMPLATES for lang in _LANGUAGES for task in _CODE_TASKS]
    chat = [t.format(subject=s) for t in _CHAT_TEMPLATES for s in _CHAT_SUBJECTS] + list(_CHAT_EXTRA)
    rng = random.Random(seed)
    rng.shuffle(code)
    rng.shuffle(chat)
    # interleave: two code prompts per chat prompt, so any prefix of the list has both kinds
    mixed: list[str] = []
    while code or chat:
        mixed.extend(code[:2])
        del code[:2]
        if chat:
            mixed.append(chat.pop())
    return mixed if n is None else mixed[:n]
