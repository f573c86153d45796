"""Where a speculative step's Python time goes: wall time per step of each phase, with the time inside
llama_decode taken out (wrappers around the engine's and decoder's functions; a phase's time excludes
the phases it calls).

    OMP_NUM_THREADS=1 python lab/scripts/python_phases.py chain '{"gamma": 4}' [max_tokens] [prompt]
    OMP_NUM_THREADS=1 python lab/scripts/python_phases.py auto '{}' 128 "Write the opening of a short story …"
    OMP_NUM_THREADS=1 python lab/scripts/python_phases.py plain "{}" 128 "…"  # plain, for reference

Run it on a quiet machine with 1 thread: the figures are a few hundred microseconds per call.

It wraps public names only: the llama.cpp context's class is taken from the open pair
(``type(pair.target.ctx)``), and ``Context.decode``'s own time (the batch fill around llama_decode) is
the "batch fill" phase. Until issue 59 it also wrapped two private methods, ``Draft._decode_level``
(now inside ``Draft.expand``) and ``Context._fill``; the notebook's tables were taken with that version
(git history).
"""

import collections
import json
import sys
from time import perf_counter

from edgespec.decoding import decoder
from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.engine import Draft, Target
from edgespec.engine import draft as draft_module
from edgespec.engine import rows as rows_module
from edgespec.engine.pair import EngineSettings
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.planner import tree as tree_mod
from edgespec.profile.attach import attach
from edgespec.strategy import StrategyChoice, make_planner

PROMPT = "Write a Python function that checks whether a string is a palindrome, with tests."
own_seconds: collections.Counter = collections.Counter()  # phase → time outside the phases it calls
calls: collections.Counter = collections.Counter()
open_phases: list[float] = []  # per open phase: time spent in the phases (and decodes) it called


def timed(owner, name: str, label: str, decodes_in_c: bool = False) -> None:
    """Time ``owner.name`` as phase ``label``. ``decodes_in_c``: a Context method that decodes inside
    (its decode time, what it adds to ``decode_seconds``, counts as llama_decode's)."""
    inner_fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = perf_counter()
        open_phases.append(0.0)
        ctx = args[0] if decodes_in_c else None
        decoded = ctx.decode_seconds if ctx is not None else 0.0
        try:
            return inner_fn(*args, **kwargs)
        finally:
            if ctx is not None and ctx.decode_seconds > decoded:
                own_seconds["llama_decode"] += ctx.decode_seconds - decoded
                open_phases[-1] += ctx.decode_seconds - decoded
            nested = open_phases.pop()
            spent = perf_counter() - start
            own_seconds[label] += spent - nested
            calls[label] += 1
            if open_phases:
                open_phases[-1] += spent

    setattr(owner, name, wrapper)


for owner, name, label in [
    (draft_module, "draft_dists", "draft_dists (top-k rows)"),
    (rows_module, "argmax_margin", "argmax_margin"),
    (Draft, "expand", "Draft.expand"),
    (Target, "start_verify", "Target.start_verify (pack)"),
    (Target, "commit", "Target.commit"),
    (Draft, "commit", "Draft.commit"),
    (decoder, "decide", "decide (verification rule)"),
    (decoder, "provenance", "provenance (+ margins)"),
    (decoder, "plan", "planner"),
    (decoder, "speculative_step", "step (the rest)"),
    (tree_mod.TreeBuilder, "freeze", "TreeBuilder.freeze"),
]:
    timed(owner, name, label)
name, params = sys.argv[1], json.loads(sys.argv[2])
max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 128
PROMPT = sys.argv[4] if len(sys.argv) > 4 else PROMPT
resolved = resolve_pair()
with open_pair(resolved, EngineSettings(threads=1)) as pair:
    context = type(pair.target.ctx)  # llama.cpp's context, both models'
    timed(context, "decode", "batch fill", decodes_in_c=True)  # its llama_decode is taken out below
    timed(context, "logits_rows", "logits view")
    timed(context, "seq_cp", "seq_cp")
    timed(context, "seq_rm", "seq_rm")
    planner = None if name == "plain" else make_planner(StrategyChoice(name, params), resolved.defaults)
    attach(planner, pair)
    prompt, _ = prompt_tokens(pair, [Message("user", PROMPT)], ChatSettings(max_tokens=max_tokens))
    steps = tokens = 0
    python = 0.0
    request = decoder.Request(prompt=prompt, max_tokens=max_tokens)
    for event in decoder.generate(pair, planner, request):
        if event.tokens:
            steps += 1
            tokens += len(event.tokens)
            python += event.timings.python
own_seconds.pop("llama_decode", None)
print(f"{name} {params}: {steps} steps, {tokens} tokens, python {python / steps * 1e3:.2f} ms/step")
for label, seconds in own_seconds.most_common():
    print(f"  {label:28s} {seconds / steps * 1e3:6.3f} ms/step  ({calls[label] / steps:.1f} calls/step)")
