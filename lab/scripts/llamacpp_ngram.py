#!/usr/bin/env python3
"""edgespec's copying next to llama.cpp's own n-gram speculation, in one run (issue 14).

Per prompt of a set, alternately: edgespec's plain decoding and its strategies (in this process, as
``edgespec bench`` times them: prefill outside the clock, planners kept across prompts), then
``llama-speculative-simple`` (built from the llama-cpp-python sdist's vendored llama.cpp) on the same
chat-templated text, each n-gram mode between two plain runs of llama.cpp's own loop (plain there:
``ngram-simple`` with a 1024-token lookup key, which never matches, so every step verifies one
token). Each side's ratio is to its own plain runs next to it; MAL = tokens ÷ target steps.

    python scripts/llamacpp_ngram.py edit BUILD/bin/llama-speculative-simple [ngram,auto] [128]
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.decoding.sampling import SamplingParams
from edgespec.engine.pair import EngineSettings
from edgespec.measure.prompts import load_prompts
from edgespec.measure.runner import timed_run
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.profile.attach import attach
from edgespec.strategy import StrategyChoice, make_planner

MODES = ("ngram-simple", "ngram-map-k", "ngram-mod")
NEVER_MATCHES = ("ngram-simple", "--spec-ngram-simple-size-n", "1024")
THREADS = 2


def llama_run(binary: str, model: str, prompt: Path, spec: tuple[str, ...], tokens: int) -> dict:
    command = [binary, "-m", model, "-f", str(prompt), "--spec-type", *spec, "-n", str(tokens),
               "--temp", "0", "--top-k", "1", "-t", str(THREADS), "-c", "4096"]
    log = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    n, seconds = int(decoded.group(1)), float(decoded.group(2))
    accepted = int(re.search(r"n_accept\s+= (\d+)", log).group(1))
    drafted = int(re.search(r"n_drafted = (\d+)", log).group(1))
    steps = n - accepted  # a step commits its accepted drafts and one token of the target's own
    return {"tokens": n, "seconds": seconds, "steps": steps, "verified": steps + drafted}


def rate(runs: list[dict]) -> float:
    """Pooled tokens/s."""
    return sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs)


def ratio(run: dict, plain: list[dict]) -> float:
    """tokens/s over the pooled tokens/s of the plain runs next to it."""
    return rate([run]) / rate(plain)


def line(prompt: str, name: str, run: dict, r: float) -> str:
    return (f"{prompt:24} {name:13} MAL {run['tokens'] / run['steps']:5.2f}  verified/step "
            f"{run['verified'] / run['steps']:5.2f}  {run['tokens'] / run['seconds']:6.2f} tok/s  "
            f"ratio {r:5.2f}  ({run['tokens']} tokens)")


def main(argv: list[str]) -> int:
    prompt_set, binary = argv[0], argv[1]
    strategies = argv[2].split(",") if len(argv) > 2 else ["ngram", "auto"]
    max_tokens = int(argv[3]) if len(argv) > 3 else 128
    resolved = resolve_pair()
    pooled: dict[str, dict] = {}

    def add(name: str, run: dict, r: float) -> None:
        p = pooled.setdefault(name, {"tokens": 0, "steps": 0, "verified": 0, "ratios": []})
        for key in ("tokens", "steps", "verified"):
            p[key] += run[key]
        p["ratios"].append(r)

    with open_pair(resolved, EngineSettings(threads=THREADS)) as pair, tempfile.TemporaryDirectory() as tmp:
        planners = {
            s: attach(make_planner(StrategyChoice(s, {}), resolved.defaults), pair) for s in strategies
        }
        planners["plain"] = None
        greedy = SamplingParams()

        def ours(key: str, case, prompt: list[int], tokens: int) -> dict:
            run = timed_run(pair, planners[key], key, case.name, prompt, tokens, greedy)
            s = run.stats
            return {"tokens": len(run.tokens), "seconds": run.seconds, "steps": s.target_calls,
                    "verified": s.verified_nodes}

        for index, case in enumerate(load_prompts(prompt_set)):
            chat = [Message(role, content) for role, content in case.messages]
            prompt, _ = prompt_tokens(pair, chat, ChatSettings(max_tokens=max_tokens))
            pair.target.sync(prompt[:-1])
            pair.draft.sync(prompt)
            if index == 0:  # warm-up, as bench does
                for key in planners:
                    ours(key, case, prompt, 8)
            plain = [ours("plain", case, prompt, max_tokens)]
            for key in strategies:
                run = ours(key, case, prompt, max_tokens)
                plain.append(ours("plain", case, prompt, max_tokens))
                add(f"edgespec {key}", run, r := ratio(run, plain[-2:]))
                print(line(case.name, key, run, r), flush=True)
            print(f"{case.name:24} edgespec plain {median(rate([p]) for p in plain):6.2f} tok/s")
            messages = [{"role": role, "content": content} for role, content in case.messages]
            text = pair.target.model.apply_chat_template(messages)
            path = Path(tmp) / "prompt.txt"
            path.write_text(text + "\n", encoding="utf-8")  # llama.cpp strips one trailing newline from -f
            model = str(pair.target.model.path)
            plain = [llama_run(binary, model, path, NEVER_MATCHES, max_tokens)]
            for mode in MODES:
                run = llama_run(binary, model, path, (mode,), max_tokens)
                plain.append(llama_run(binary, model, path, NEVER_MATCHES, max_tokens))
                add(f"llama.cpp {mode}", run, r := ratio(run, plain[-2:]))
                print(line(case.name, mode, run, r), flush=True)
            print(f"{case.name:24} llama.cpp plain {median(rate([p]) for p in plain):6.2f} tok/s")
    for name, p in pooled.items():
        r = p["ratios"]
        print(f"pooled {name:24} MAL {p['tokens'] / p['steps']:.2f}  verified/step "
              f"{p['verified'] / p['steps']:.2f}  ratio median {median(r):.3f} "
              f"(min {min(r):.2f}, max {max(r):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
