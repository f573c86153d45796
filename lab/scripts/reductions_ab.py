"""The target's rows reduced by numpy vs by llama.cpp's backend samplers (issue 60), paired prompt by prompt.

One pair is loaded with backend reductions; every strategy answers every prompt twice, once per mode,
the order flipped from prompt to prompt (drift cancels to first order). A switch of mode changes the
context's sampler chains, which re-reserves its graph at the next decode: a warm-up answer of a few
tokens in the new mode runs first, outside the clock. Reported per strategy: the geometric mean over
prompts of tokens/s backend / numpy (> 1: the backend is faster), each prompt's ratio, and the tokens
being equal in both modes (greedy: they must be).

    python lab/scripts/reductions_ab.py --prompts quick --strategies plain,chain,auto --threads 2 \\
        --max-tokens 64 --json docs/bench/xeon-reductions.json

Check that it runs: ``--prompts quick --limit 1 --max-tokens 8``.
"""

from __future__ import annotations

import argparse
import json
import math
from time import perf_counter

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.decoding.decoder import Request, generate
from edgespec.engine.pair import EngineSettings
from edgespec.measure.prompts import load_prompts
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.profile.attach import PairProfile, attach
from edgespec.strategy import StrategyChoice, make_planner

MODES = ("numpy", "backend")
WARMUP_TOKENS = 4


def answer(pair, planner, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    """The tokens of one answer and its tokens/s after the prompt (its prefill left out)."""
    start, prefill, tokens = perf_counter(), 0.0, []
    for event in generate(pair, planner, Request(prompt, max_tokens)):
        prefill += event.prefill_seconds
        tokens.extend(event.token_ids)
    return tokens, len(tokens) / max(perf_counter() - start - prefill, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="quick")
    parser.add_argument("--limit", type=int, default=0, help="the first N prompts only (0: all)")
    parser.add_argument("--strategies", default="plain,chain,auto")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    cases = load_prompts(args.prompts)[: args.limit or None]
    resolved = resolve_pair()
    settings = EngineSettings(threads=args.threads, reductions="backend")
    results: dict[str, dict] = {}
    with open_pair(resolved, settings) as pair, PairProfile(pair, show_progress=True, quick=True) as profile:
        ctx = pair.target.ctx
        if ctx.reductions != "backend":
            raise SystemExit(f"the target could not use backend reductions here (got {ctx.reductions})")
        for name in args.strategies.split(","):
            planner = (
                None
                if name == "plain"
                else attach(make_planner(StrategyChoice(name, {}), resolved.defaults), profile)
            )
            ratios, same = [], True
            for i, case in enumerate(cases):
                messages = [Message(role, text) for role, text in case.messages]
                prompt, _ = prompt_tokens(pair, messages, ChatSettings(max_tokens=args.max_tokens))
                speed, tokens = {}, {}
                for mode in MODES if i % 2 == 0 else MODES[::-1]:
                    ctx.use_reductions(mode)
                    answer(pair, planner, prompt, WARMUP_TOKENS)  # the graph re-reserved, outside the clock
                    tokens[mode], speed[mode] = answer(pair, planner, prompt, args.max_tokens)
                ratios.append(speed["backend"] / speed["numpy"])
                same &= tokens["backend"] == tokens["numpy"]
                print(
                    f"{name:10s} {case.name:28s} numpy {speed['numpy']:6.2f} tok/s, backend "
                    f"{speed['backend']:6.2f}: {ratios[-1]:.3f}",
                    flush=True,
                )
            geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
            results[name] = {"backend_over_numpy": geomean, "per_prompt": ratios, "same_tokens": same}
            print(f"{name}: backend / numpy tokens/s, geometric mean {geomean:.3f}; same tokens: {same}")
    if args.json:
        meta = {
            "pair": resolved.name,
            "threads": args.threads,
            "max_tokens": args.max_tokens,
            "prompts": [case.name for case in cases],
        }
        with open(args.json, "w") as out:
            json.dump({"settings": meta, "strategies": results}, out, indent=1)


if __name__ == "__main__":
    main()
