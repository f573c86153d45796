"""Draft passes, MAL and MAL per verified token of DySpec and OPT-Tree at budget 16, with and without a
cap on the passes (greedy; counts only, so a loaded machine does not change them).

    OMP_NUM_THREADS=1 python scripts/draft_passes.py quick 6 docs/passes-quick-cpu.json
"""

import json
import statistics
import sys

from edgespec.decoding.chat import ChatSettings, Message, stream_reply
from edgespec.engine.pair import EngineSettings
from edgespec.measure.prompts import load_prompts
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.profile.attach import attach
from edgespec.strategy import StrategyChoice, make_planner

variants = [
    ("dyspec", {"budget": 16}),
    ("dyspec", {"budget": 16, "max_passes": 6}),
    ("opt-tree", {"budget": 16}),
    ("opt-tree", {"budget": 16, "max_depth": 6}),
]
cases = load_prompts(sys.argv[1])[: int(sys.argv[2])]
r = resolve_pair()
out = {}
with open_pair(r, EngineSettings(threads=1, n_ctx=4096)) as pair:
    for name, params in variants:
        planner = attach(make_planner(StrategyChoice(name, params), r.defaults), pair)
        committed = verified = steps = 0
        passes = []
        for case in cases:
            events = [
                e
                for e in stream_reply(
                    pair, planner, [Message(a, b) for a, b in case.messages], ChatSettings(max_tokens=64)
                )
                if e.verified_nodes
            ]
            committed += sum(e.committed for e in events)
            verified += sum(e.verified_nodes for e in events)
            steps += len(events)
            passes += [e.draft_decodes for e in events]
        key = f"{name} {planner.describe()}"
        out[key] = dict(
            mal=committed / steps,
            verified_per_step=verified / steps,
            mal_per_verified=committed / verified,
            passes_median=statistics.median(passes),
            passes_mean=sum(passes) / len(passes),
        )
        print(key, {k: round(v, 3) for k, v in out[key].items()}, flush=True)
json.dump(
    {"prompts": [c.name for c in cases], "max_tokens": 64, "runs": out}, open(sys.argv[3], "w"), indent=1
)
