"""The bench client's 6-turn conversation replayed in process as ``edgespec serve`` runs it: one
``PairEngine`` (its prompt cache, the draft absorbing between turns), each turn's history the pair's own
earlier answers, the system prompt the client sends. Per turn: prompt tokens, steps, wall time and the
steps priced by the cost profile; per step (``--log FILE``, JSON lines): verified nodes, tokens written
and the verify's milliseconds — what the served timings are made of, without HTTP.

    python lab/scripts/served_conversation.py [STRATEGY=auto] [--copy-depth N] [--log steps.jsonl]
"""

import argparse
import json
import threading
import time

from edgespec.decoding.chat import ChatSettings, Message
from edgespec.decoding.events import GenerationStats
from edgespec.engine.pair import EngineSettings
from edgespec.measure.bench_client import CONVERSATION, SYSTEM
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.profile.attach import attach
from edgespec.session import PairEngine
from edgespec.strategy import StrategyChoice, make_planner

parser = argparse.ArgumentParser()
parser.add_argument("strategy", nargs="?", default="auto")
parser.add_argument("--max-tokens", type=int, default=384)
parser.add_argument("--copy-depth", type=int, help="the copier's longest chain (Copier.max_depth)")
parser.add_argument("--log")
args = parser.parse_args()
resolved = resolve_pair()
log = open(args.log, "w") if args.log else None
with open_pair(resolved, EngineSettings(threads=2, n_ctx=8192)) as pair:
    engine = PairEngine(pair)
    planner = attach(make_planner(StrategyChoice(args.strategy, {}), resolved.defaults), pair)
    engine.prepare(planner, lambda *_: None)
    if args.copy_depth:
        planner.copier.max_depth = args.copy_depth
    costs = getattr(planner, "costs", None)
    history, total = [Message("system", SYSTEM)], 0.0
    for turn, text in enumerate(CONVERSATION, 1):
        history.append(Message("user", text))
        stats, answer, steps, priced = GenerationStats(), [], 0, 0.0
        start = time.perf_counter()
        settings = ChatSettings(max_tokens=args.max_tokens)
        for event in engine.stream(planner, history, settings, threading.Event(), stats):
            answer += event.token_ids
            steps += 1
            priced += float(costs.t(event.verified_nodes)) if costs is not None else 0.0
            if log:
                row = {"turn": turn, "n": event.verified_nodes, "ids": list(event.token_ids)}
                log.write(json.dumps({**row, "verify_ms": round(event.timings.verify * 1000, 1)}) + "\n")
        wall = time.perf_counter() - start
        total += wall
        while engine.idle():  # the server's worker between requests
            pass
        history.append(Message("assistant", b"".join(map(pair.target.model.piece, answer)).decode()))
        modelled = f", modelled {len(answer) * float(costs.t(1)) / priced:.3f}" if priced else ""
        print(f"turn {turn}: prompt {stats.prompt_tokens}, {len(answer)} tokens in {steps} steps, "
              f"{wall:.1f} s{modelled}", flush=True)
    print(f"whole conversation {total:.1f} s")
