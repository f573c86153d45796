"""Python per speculative step, robust to a shared machine: the median over steps (not the mean) of
``time_split.python``, per prompt and pooled, for one strategy on three short prompts.

    OMP_NUM_THREADS=1 python scripts/python_per_step.py chain '{"gamma": 4}' [max_tokens]

For an A/B of two revisions, run it alternately from each checkout (PYTHONPATH=<checkout>) a few
times: single runs move by ±0.1 ms on a busy host, the alternation's medians by a few hundredths.
"""

import json
import statistics
import sys

from edgespec.decoding import decoder
from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.engine.pair import EngineSettings
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.profile.attach import attach
from edgespec.strategy import StrategyChoice, make_planner

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with tests.",
    "Explain the difference between a process and a thread, briefly.",
    "Write a bash script that renames every .txt file in a folder to .md.",
]
name, params = sys.argv[1], json.loads(sys.argv[2])
max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
resolved = resolve_pair()
with open_pair(resolved, EngineSettings(threads=1)) as pair:
    planner = attach(make_planner(StrategyChoice(name, params), resolved.defaults), pair)
    per_prompt, pooled = [], []
    for text in PROMPTS:
        prompt, _ = prompt_tokens(pair, [Message("user", text)], ChatSettings(max_tokens=max_tokens))
        request = decoder.Request(prompt=prompt, max_tokens=max_tokens)
        events = decoder.generate(pair, planner, request)
        steps = [event.timings.python * 1e3 for event in events if event.tokens]
        per_prompt.append(round(statistics.median(steps), 3))
        pooled.extend(steps)
    pooled_median = statistics.median(pooled)
    print(f"{name} {params}: python ms/step, median per prompt {per_prompt}, pooled {pooled_median:.3f}")
