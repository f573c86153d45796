"""A copying strategy's speedup as the pair's cost profile prices its steps, per prompt: tokens · c_t(1)
÷ Σ c_t(tokens verified in step i) — counts only, so noise in the timings does not enter (for ``ngram``
the decisions depend on the profile alone; ``auto`` also weighs measured step times, so its decisions
move a little between runs). One planner for the whole set, each prompt ``runs`` times in a row, as
``edgespec bench`` keeps it.

    python scripts/modelled_speedup.py edit auto 2
    PYTHONPATH=/tmp/before python scripts/modelled_speedup.py edit ngram 1    # another checkout
    python lab/scripts/modelled_speedup.py conversation.jsonl auto 1 384     # tokens per answer (128)
"""

import statistics
import sys

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.decoding.decoder import Request, generate
from edgespec.engine.pair import EngineSettings
from edgespec.measure.prompts import load_prompts
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.profile.attach import attach
from edgespec.strategy import StrategyChoice, make_planner

prompt_set, strategy = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 128
resolved = resolve_pair()
ratios = []
with open_pair(resolved, EngineSettings(threads=2)) as pair:
    planner = attach(make_planner(StrategyChoice(strategy, {}), resolved.defaults), pair)
    plain_step = float(planner.costs.t(1))
    for case in load_prompts(prompt_set):
        messages = [Message(role, content) for role, content in case.messages]
        prompt, _ = prompt_tokens(pair, messages, ChatSettings(max_tokens=max_tokens))
        for run in range(runs):
            tokens = steps = verified = 0
            priced = 0.0  # seconds the profile charges for this run's target decodes
            for event in generate(pair, planner, Request(prompt=prompt, max_tokens=max_tokens)):
                tokens += len(event.tokens)
                steps += 1
                verified += event.verified_nodes
                priced += float(planner.costs.t(event.verified_nodes))
            ratios.append(tokens * plain_step / priced)
            print(
                f"{case.name} run {run}: {tokens} tokens in {steps} steps, {verified} verified, "
                f"modelled speedup {ratios[-1]:.3f}"
            )
print(
    f"modelled speedup over {len(ratios)} runs: median {statistics.median(ratios):.3f}, "
    f"mean {statistics.fmean(ratios):.3f}"
)
