"""MCSD on the real bundled pair: static and early-stopped MCSD at temperature 0 against plain
decoding (divergence only at a near-tie within the measured batch noise, see realmodels.py), the
lossy mcsd-target-init, MCSD sampling at temperature 0.8, and `edgespec tune` end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.measure.tune import agreement
from edgespec.planner.earlystop import DecisionModel
from edgespec.planner.mcsd import MCSDPlanner, MCSDTargetInitPlanner
from edgespec.planner.tree import ChildRule
from tests.support.realmodels import BUNDLED_PAIR, chat_prompt, first_divergence, greedy_steps

pytestmark = pytest.mark.model

TOKENS = 32  # compared against the first 32 tokens of plain decoding
PROMPTS = ENGINE_PROMPTS[:2]
K_CONFIG = (3, 2, 1)  # 15 draft tokens: inside the batch sizes batch_noise measures (≤ 16)
PLANNERS = {
    "mcsd": lambda: MCSDPlanner(k_config=K_CONFIG),
    "mcsd-threshold": lambda: MCSDPlanner(k_config=K_CONFIG, early_stop="threshold"),
}


@pytest.mark.parametrize("name", list(PLANNERS))
def test_greedy_equals_plain_decoding(pair, plain_runs, batch_noise, name):
    flips = steps = accepted = 0
    agreements = []
    for text in PROMPTS:
        plain_tokens, plain_margins = plain_runs[text]
        events = greedy_steps(pair, PLANNERS[name](), text, max_tokens=TOKENS)
        tokens = [t.id for e in events for t in e.tokens]
        steps += len(events)
        accepted += sum(e.accepted for e in events)
        where = first_divergence(tokens, plain_tokens, plain_margins, batch_noise, f"{name}, {text!r}")
        if where is None:
            assert tokens == plain_tokens[: len(tokens)] and len(tokens) == min(TOKENS, len(plain_tokens))
        flips += where is not None
        agreements.append((len(tokens) if where is None else where) / len(tokens))
    print(
        f"\n{name}: MAL {1 + accepted / steps:.2f} over {steps} steps; {flips} near-tie flips; "
        f"agreement with plain decoding {np.mean(agreements):.3f}"
    )
    assert accepted > 0


def test_target_init_runs_and_says_how_far_it_follows_plain_decoding(pair, plain_runs):
    """Lossy by design: no equality with plain decoding is asserted, only that every step emits one of
    the target's own top-w tokens first (so accepts ≥ 1); MAL and agreement are printed."""
    steps = accepted = 0
    agreements = []
    for text in PROMPTS:
        request = Request(prompt=chat_prompt(pair, text), max_tokens=TOKENS)
        planner = MCSDTargetInitPlanner(w=2, k_config=(2, 1, 1))
        events = [e for e in generate(pair, planner, request) if e.verified_nodes]
        tokens = [t.id for e in events for t in e.tokens]
        assert events[0].verified_nodes == 1  # the first token is the target's alone
        for event in events[1:-1]:
            assert event.accepted >= 1 and event.tree.child_rule[0] == ChildRule.LONGEST
            assert event.tokens[0].id in [int(event.tree.tokens[c]) for c in event.tree.children(0)]
        steps, accepted = steps + len(events), accepted + sum(e.accepted for e in events)
        agreements.append(agreement(tokens, plain_runs[text][0][: len(tokens)]))
    mal = 1 + accepted / steps
    print(f"\nmcsd-target-init: MAL {mal:.2f}; agreement with plain {np.mean(agreements):.3f}")


def test_sampling_at_temperature_stays_coherent(pair):
    request = Request(
        prompt=chat_prompt(pair, "Write two sentences about the ocean."),
        max_tokens=48,
        sampling=SamplingParams(temperature=0.8, top_p=0.95, seed=5),
    )
    events = [e for e in generate(pair, MCSDPlanner(k_config=K_CONFIG), request) if e.verified_nodes]
    rules = {int(r) for e in events for r in e.tree.child_rule if r != ChildRule.NONE}
    assert rules == {int(ChildRule.SAMPLED)}  # children sampled from q: the residual rule verifies them
    text = "".join(e.text for e in events)
    words = text.split()
    produced = sum(len(e.tokens) for e in events)
    assert produced == 48 or events[-1].finish_reason == "stop"  # the answer may end on its own
    assert len(words) >= 10, text
    assert sum(c.isalpha() or c.isspace() or c in ".,;:'!-\"" for c in text) / len(text) > 0.9
    assert max(words.count(w) for w in set(words)) < len(words) / 3  # no degenerate repetition
    assert sum(e.accepted for e in events) > 0


def test_tune_trains_stores_and_the_model_runs(pair, plain_runs, batch_noise, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ENGINE_PROMPTS[3:6]))
    output = tmp_path / "model.npz"
    cmd = [sys.executable, "-m", "edgespec", "tune", "--pair", BUNDLED_PAIR, "--prompts", str(prompts)]
    cmd += ["--max-tokens", "24", "--k-config", "2,2,1", "--ctx", "1024", "--output", str(output), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    held_out = report["held_out"]
    print(f"\ntune: {report['training']['examples']} examples, held out: {held_out}")
    assert 0.0 <= held_out["auc"] <= 1.0 and 0.0 <= held_out["accuracy"] <= 1.0
    assert 0.0 < held_out["base_rate"] < 1.0
    assert output.is_file() and output.with_suffix(".json").is_file()
    # The stored model drives early stopping on the real pair; the output stays plain decoding's.
    planner = MCSDPlanner(k_config=K_CONFIG, early_stop="model", model=DecisionModel.load(output))
    text = PROMPTS[0]
    events = greedy_steps(pair, planner, text, max_tokens=24)
    tokens = [t.id for e in events for t in e.tokens]
    plain_tokens, plain_margins = plain_runs[text]
    if first_divergence(tokens, plain_tokens, plain_margins, batch_noise, f"mcsd model, {text!r}") is None:
        assert tokens == plain_tokens[: len(tokens)]
