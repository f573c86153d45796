"""The target's verify of n tokens (a chain) in ms at two context lengths, median of interleaved repeats,
with flash attention as given (FA: -1 llama.cpp decides, 0 off, 1 on; the engine's own choice is
overridden) — lab/runs/conversation-epyc/flash-attn-curves.txt. Run the settings alternately:

    for fa in -1 0 -1 0; do FA=$fa python lab/scripts/verify_cost_by_context.py; done
    GGML_CPU_TILED_MM=0 FA=0 python lab/scripts/verify_cost_by_context.py 1,8,16 160,2000
"""

import json
import os
import sys
from dataclasses import replace
from statistics import median

from edgespec.engine.pair import EngineSettings
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.profile.costs import context_tokens, time_target

FA = int(os.environ.get("FA", "-1"))
sizes = [int(n) for n in (sys.argv[1] if len(sys.argv) > 1 else "1,4,8,16,32").split(",")]
contexts = [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "160,2000").split(",")]
engine_context = EngineSettings.context


def with_flash_attention(self, cpu_only: bool = True):
    return replace(engine_context(self, cpu_only), flash_attn=None if FA < 0 else bool(FA))


EngineSettings.context = with_flash_attention
with open_pair(resolve_pair(), EngineSettings(threads=2, n_ctx=4096)) as pair:
    for length in contexts:
        base = context_tokens(pair.target.model.n_vocab, length)
        for n in sizes:  # warm-up
            time_target(pair, base, n)
        ms = {n: [] for n in sizes}
        for rep in range(4):
            for n in sizes if rep % 2 else sizes[::-1]:
                ms[n].append(time_target(pair, base, n) * 1000)
        print("FA", FA, length, json.dumps({n: round(median(v), 1) for n, v in ms.items()}), flush=True)
