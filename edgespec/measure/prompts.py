"""Built-in prompt sets, written for edgespec in the spirit of the papers' benchmarks, and JSONL loading.

Sets (``PROMPT_SETS``): ``code``, ``chat`` (multi-turn), ``math`` (word problems), ``summarisation``
and ``translation`` — the task mix of the speculative-decoding papers (MT-Bench-like chat, GSM8K-like
math, CNN/DM-like summaries, WMT-like translation, HumanEval-like code), in our own words. ``quick``
is one or two short prompts per set, for ``edgespec bench --quick``.

Sets where the answer repeats the conversation, so copying it (``ngram``, ``hybrid``) pays — ``edit``
(rewrite, fix, rename code that was pasted), ``summarise`` (proofread, quote, reformat a pasted text),
``follow-up`` (change the previous answer) — and ``prose``, free writing where nothing is there to
copy, live in ``data/copy_prompts.toml``.

A JSONL file has one prompt per line: ``{"prompt": "..."}`` or ``{"messages": [{"role": "user",
"content": "..."}, ...]}``, optionally with ``"name"`` and ``"category"``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import EdgespecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

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


@dataclass(frozen=True)
class PromptCase:
    name: str  # unique within a run, e.g. "code/binary-search"
    category: str  # code | chat | math | summarisation | translation | custom
    messages: tuple[tuple[str, str], ...]  # (role, content) turns; the last one is the user's

    @property
    def last_user_text(self) -> str:
        return self.messages[-1][1]


def _one(category: str, slug: str, text: str) -> PromptCase:
    return PromptCase(f"{category}/{slug}", category, (("user", text),))


def _turns(category: str, slug: str, *turns: str) -> PromptCase:
    roles = ("user", "assistant")
    return PromptCase(f"{category}/{slug}", category, tuple((roles[i % 2], t) for i, t in enumerate(turns)))


_ARTICLE_BRIDGE = (
    "The city council voted on Tuesday to close the old Harbour Bridge to cars from next spring. The "
    "bridge, built in 1931, carries about 18,000 vehicles a day, but engineers found corrosion in two of "
    "its steel supports last year. Repairs strong enough for heavy traffic would cost an estimated 42 "
    "million euros and take three years. Instead, the council will spend 9 million on turning the deck "
    "into a route for pedestrians, cyclists and the number 4 tram, which will run every six minutes. "
    "Shop owners on the east bank worry that fewer drivers will mean fewer customers; cycling groups "
    "welcomed the plan. A new road bridge two kilometres upstream is due to open in 2027."
)
_ARTICLE_SLEEP = (
    "A study of 2,400 secondary-school pupils found that those who started lessons at 9:30 instead of "
    "8:15 slept on average 34 minutes longer on school nights. Over two years their attendance rose by "
    "4 percent and their maths scores improved slightly, while reading scores did not change. The "
    "researchers note that the later start also shifted after-school activities, and that families with "
    "younger children found the new timetable harder to organise. They recommend that schools weigh "
    "these costs against the benefits before changing their hours."
)
_MEETING_NOTES = (
    "Notes, platform team, Monday: 1) The release moves from the 12th to the 19th because the database "
    "migration failed in staging. 2) Priya will rerun the migration with the fixed index script by "
    "Wednesday. 3) Tom asked for one more week of load testing; agreed. 4) The on-call rota changes: "
    "Ana takes next week, Ben the week after. 5) Budget for the new monitoring tool is approved, up to "
    "300 euros a month. 6) Next meeting Thursday at 10."
)

PROMPT_SETS: dict[str, tuple[PromptCase, ...]] = {
    "code": (
        _one(
            "code",
            "binary-search",
            "Write a Python function `binary_search(items, target)` that returns the index of target in "
            "a sorted list, or -1. Include a docstring and two doctest examples.",
        ),
        _one(
            "code",
            "lru-cache",
            "Implement an LRU cache class in Python with get(key) and put(key, value) in O(1), using "
            "collections.OrderedDict. Add type hints.",
        ),
        _one(
            "code",
            "fizzbuzz-js",
            "Write FizzBuzz in JavaScript for the numbers 1 to 100, then explain the modulo checks.",
        ),
        _one(
            "code",
            "sql-report",
            "Write a SQL query over tables orders(id, customer_id, total, created_at) and customers(id, "
            "name) that returns each customer's name and total spend in 2023, highest first.",
        ),
        _one(
            "code",
            "refactor",
            "Refactor this Python code to be more readable and explain the changes:\n\n"
            "def f(l):\n    r=[]\n    for i in range(len(l)):\n        if l[i]%2==0:\n"
            "            r.append(l[i]*l[i])\n    return r",
        ),
        _one(
            "code",
            "unit-tests",
            "Write pytest unit tests for a function `slugify(text: str) -> str` that lowercases text, "
            "replaces spaces with hyphens and removes characters other than letters, digits and hyphens.",
        ),
    ),
    "chat": (
        _turns(
            "chat",
            "trip",
            "I'm planning a weekend in Lisbon in March. What should I pack?",
            "Layers: mornings are cool and afternoons mild. Bring a light waterproof jacket, comfortable "
            "shoes for the hills and cobblestones, and a small umbrella.",
            "Great. Now suggest a two-day itinerary that avoids long queues.",
        ),
        _turns(
            "chat",
            "python-help",
            "What is the difference between a list and a tuple in Python?",
            "Lists are mutable and tuples are immutable; tuples can be dictionary keys and are slightly "
            "lighter, while lists suit collections that change.",
            "When would you choose a dataclass over a tuple? Give an example.",
        ),
        _turns(
            "chat",
            "cooking",
            "I have eggs, spinach, feta and some old bread. Any idea for dinner?",
            "A savoury bread pudding (strata): soak cubes of bread in beaten eggs and milk, fold in "
            "wilted spinach and crumbled feta, and bake until set.",
            "Sounds good. Give me exact quantities for two people and the oven temperature.",
        ),
        _turns(
            "chat",
            "email",
            "Help me write a polite email to my landlord about a broken heater.",
            "Sure. Do you want it formal, and should it mention how long the heater has been broken?",
            "Formal, and yes: it stopped working five days ago. Please write the email.",
        ),
        _turns(
            "chat",
            "advice",
            "How can I get better at remembering what I read?",
            "Summarise each chapter in your own words, test yourself later, and space your reviews.",
            "Turn that into a weekly routine I can follow, with times.",
        ),
    ),
    "math": (
        _one(
            "math",
            "apples",
            "A shop sells apples at 3 for 2 euros. Lena buys 18 apples and pays with a 20 euro note. How "
            "much change does she get? Solve step by step.",
        ),
        _one(
            "math",
            "train",
            "A train leaves at 9:40 and travels 210 km at an average of 84 km/h. At what time does it "
            "arrive? Show your reasoning.",
        ),
        _one(
            "math",
            "tank",
            "A water tank holds 1,200 litres. One pipe fills it in 6 hours, another empties it in 10 "
            "hours. If both are open, how long does it take to fill the empty tank? Explain.",
        ),
        _one(
            "math",
            "discount",
            "A jacket costs 80 euros. It is discounted by 25 percent, then the sale price is raised by 10 "
            "percent. What is the final price, and what is the overall percentage change?",
        ),
        _one(
            "math",
            "ages",
            "Maria is three times as old as her son. In 12 years she will be twice as old as him. How old "
            "are they now? Solve with equations, step by step.",
        ),
    ),
    "summarisation": (
        _one("summarisation", "bridge", f"Summarise this article in three sentences:\n\n{_ARTICLE_BRIDGE}"),
        _one("summarisation", "sleep", f"Summarise the key findings in two sentences:\n\n{_ARTICLE_SLEEP}"),
        _one(
            "summarisation",
            "meeting",
            f"Summarise these meeting notes as a short list of action items with owners:\n\n{_MEETING_NOTES}",
        ),
        _one(
            "summarisation",
            "bridge-tldr",
            f"Write a one-paragraph TL;DR of this article for a newsletter:\n\n{_ARTICLE_BRIDGE}",
        ),
    ),
    "translation": (
        _one(
            "translation",
            "de",
            "Translate into German: 'Our office will be closed on Friday for maintenance. Urgent requests "
            "can be sent to the support address, and we will answer them on Monday morning.'",
        ),
        _one(
            "translation",
            "fr",
            "Translate into French: 'The museum opens at ten. Tickets are cheaper online, and children "
            "under twelve enter for free. Please do not touch the paintings.'",
        ),
        _one(
            "translation",
            "es",
            "Translate into Spanish: 'Thank you for your order. The package left our warehouse today and "
            "should arrive within three working days.'",
        ),
        _one(
            "translation",
            "en",
            "Translate into English: 'Der Zug nach Hamburg fällt heute wegen eines Streiks aus. Reisende "
            "können ihre Fahrkarten morgen ohne Aufpreis nutzen.'",
        ),
        _one(
            "translation",
            "zh",
            "Translate into Chinese: 'The meeting has been moved to Thursday afternoon. Please bring the "
            "quarterly report.'",
        ),
    ),
}


def _copy_sets() -> dict[str, tuple[PromptCase, ...]]:
    """The sets of ``data/copy_prompts.toml``: set name → entries with a slug and the turns."""
    text = resources.files("edgespec").joinpath("data/copy_prompts.toml").read_text(encoding="utf-8")
    return {
        name: tuple(_turns(name, entry["slug"], *entry["turns"]) for entry in entries)
        for name, entries in tomllib.loads(text).items()
    }


PROMPT_SETS.update(_copy_sets())

# One short prompt per paper-style set and one edit: enough to show each task's acceptance, and fast
# on a CPU.
QUICK_PROMPTS: tuple[PromptCase, ...] = (
    PROMPT_SETS["code"][0],
    PROMPT_SETS["chat"][1],
    PROMPT_SETS["math"][0],
    PROMPT_SETS["summarisation"][1],
    PROMPT_SETS["translation"][0],
    PROMPT_SETS["edit"][0],
)


def set_names() -> tuple[str, ...]:
    return (*PROMPT_SETS, "quick", "all")


def prompt_set(names: str | Sequence[str]) -> list[PromptCase]:
    """Prompts of the named sets: ``code``, ``chat``, …, ``quick`` or ``all``; comma-separated works."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out: list[PromptCase] = []
    for name in names:
        if name == "all":
            out.extend(p for cases in PROMPT_SETS.values() for p in cases)
        elif name == "quick":
            out.extend(QUICK_PROMPTS)
        elif name in PROMPT_SETS:
            out.extend(PROMPT_SETS[name])
        else:
            raise EdgespecError(
                f"unknown prompt set {name!r}: use one of {', '.join(set_names())}, or a .jsonl file"
            )
    seen: set[str] = set()
    return [p for p in out if not (p.name in seen or seen.add(p.name))]


def load_jsonl(path: str | Path) -> list[PromptCase]:
    """Prompts from a JSONL file; errors name the file and line and say what a line must look like."""
    path = Path(path)
    fix = 'each line must be {"prompt": "..."} or {"messages": [{"role": "user", "content": "..."}]}'
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EdgespecError(f"cannot read prompts from {path}: {exc}") from exc
    cases: list[PromptCase] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise EdgespecError(f"{where}: not JSON ({exc}); {fix}") from exc
        if not isinstance(item, dict):
            raise EdgespecError(f"{where}: not a JSON object; {fix}")
        if isinstance(item.get("prompt"), str):
            messages = (("user", item["prompt"]),)
        elif isinstance(item.get("messages"), list) and item["messages"]:
            try:
                messages = tuple((str(m["role"]), str(m["content"])) for m in item["messages"])
            except (TypeError, KeyError) as exc:
                raise EdgespecError(f"{where}: a message lacks role or content; {fix}") from exc
            if messages[-1][0] != "user":
                raise EdgespecError(f"{where}: the last message must be the user's (role 'user')")
        else:
            raise EdgespecError(f"{where}: no 'prompt' or 'messages'; {fix}")
        name = str(item.get("name") or f"{path.stem}/{len(cases) + 1}")
        cases.append(PromptCase(name, str(item.get("category") or "custom"), messages))
    if not cases:
        raise EdgespecError(f"{path} has no prompts; {fix}")
    return cases


def load_prompts(spec: str) -> list[PromptCase]:
    """A .jsonl file (if ``spec`` names an existing file or ends in .jsonl) or built-in set names."""
    if spec.endswith(".jsonl") or Path(spec).is_file():
        return load_jsonl(spec)
    return prompt_set(spec)
