"""ParallelSpec on the bundled pair, greedy: MAL, verified tokens and draft passes per step, and how
often each depth (the root's row, then each [MASK]) was accepted — untrained masks, or with an adapter.

    python scripts/parallel_positions.py                              # untrained masks, quick prompts
    python scripts/parallel_positions.py --adapter parallel.gguf --also chain:4,dyspec:16
"""

import argparse
import json

from edgespec.bench.depths import measure, report
from edgespec.engine import EngineSettings, ModelPair
from edgespec.planner.parallel import ParallelSpecPlanner
from edgespec.planner.registry import make_planner
from edgespec.prompts import prompt_set
from edgespec.store import ModelStore

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--adapter", help="a parallel-drafter GGUF LoRA adapter (default: untrained masks)")
parser.add_argument("--k", type=int, help="masks (untrained only; an adapter says its own K)")
parser.add_argument("--budget", type=int, default=16, help="draft tokens per tree (default 16)")
parser.add_argument("--prompts", default="quick", help="prompt sets (default quick)")
parser.add_argument("--limit", type=int, help="the first N prompts only")
parser.add_argument("--max-tokens", type=int, default=128)
parser.add_argument("--threads", type=int, default=0)
parser.add_argument("--also", default="", help="strategies to compare, e.g. chain:4,dyspec:16")
parser.add_argument("--json", help="write the results here")
args = parser.parse_args()

store = ModelStore()
spec = store.registry.pair("qwen2.5-coder-1.5b+0.5b")
paths = (str(store.path_for(spec.target.name)), str(store.path_for(spec.draft.name)))
prompts = prompt_set(args.prompts)[: args.limit]
results = {}
with ModelPair(*paths, EngineSettings(threads=args.threads, max_tree_nodes=max(32, args.budget))) as pair:
    drafter = pair.use_parallel_drafter(args.adapter, args.k)
    label = f"parallelspec K={drafter.k} n={args.budget} " + ("trained" if drafter.adapter else "untrained")
    runs = [(label, ParallelSpecPlanner(k=drafter.k, budget=args.budget))]
    for item in filter(None, args.also.split(",")):
        name, _, budget = item.partition(":")
        runs.append((item, make_planner(name, {"budget": int(budget)} if budget else {})))
    for label, planner in runs:
        result = measure(pair, planner, prompts, args.max_tokens)
        results[label] = result.as_dict()
        print(report(label, result), flush=True)
if args.json:
    with open(args.json, "w") as f:
        meta = {"prompts": [p.name for p in prompts], "max_tokens": args.max_tokens}
        json.dump({**meta, "runs": results}, f, indent=1)
