"""ParallelSpec on the bundled pair, greedy: MAL, verified tokens and draft passes per step, and how
often each depth (the root's row, then each [MASK]) was accepted — untrained masks, or with an adapter.

    python lab/scripts/parallel_positions.py                              # untrained masks, quick prompts
    python lab/scripts/parallel_positions.py --adapter parallel.gguf --also chain:4,dyspec:16
"""

import argparse
import json
import sys
from pathlib import Path

from edgespec.engine import EngineSettings
from edgespec.measure.prompts import prompt_set
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.profile.attach import attach
from edgespec.strategy import StrategyChoice, make_planner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from depths import measure, report  # noqa: E402  (scripts/depths.py: a dev tool, not in the package)

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument(
    "--adapter",
    default="none",
    help="a parallel-drafter GGUF LoRA adapter (default: untrained masks; '': the pair's trained one)",
)
parser.add_argument("--k", type=int, default=4, help="masks per pass (≤ the adapter's K)")
parser.add_argument("--budget", type=int, default=16, help="draft tokens per tree (default 16)")
parser.add_argument("--prompts", default="quick", help="prompt sets (default quick)")
parser.add_argument("--limit", type=int, help="the first N prompts only")
parser.add_argument("--max-tokens", type=int, default=128)
parser.add_argument("--threads", type=int, default=0)
parser.add_argument("--also", default="", help="strategies to compare, e.g. chain:4,dyspec:16")
parser.add_argument("--json", help="write the results here")
args = parser.parse_args()

resolved = resolve_pair()
prompts = prompt_set(args.prompts)[: args.limit]
results = {}
settings = EngineSettings(threads=args.threads, max_tree_nodes=max(32, args.budget))
with open_pair(resolved, settings) as pair:
    choices = [StrategyChoice("parallelspec", {"k": args.k, "budget": args.budget, "adapter": args.adapter})]
    for item in filter(None, args.also.split(",")):
        name, _, budget = item.partition(":")
        choices.append(StrategyChoice(name, {"budget": int(budget)} if budget else {}))
    for choice in choices:
        planner = attach(make_planner(choice, resolved.defaults), pair)
        label = f"{planner.name} {planner.describe()}"
        result = measure(pair, planner, prompts, args.max_tokens)
        results[label] = result.as_dict()
        print(report(label, result), flush=True)
if args.json:
    with open(args.json, "w") as f:
        meta = {"prompts": [p.name for p in prompts], "max_tokens": args.max_tokens}
        json.dump({**meta, "runs": results}, f, indent=1)
