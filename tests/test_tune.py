"""`edgespec tune` on the strict fake engine: the logged examples, training and storage, the CLI, and
the decoder's support for mcsd-target-init (the root decoded alone first)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from fake_llama import VOCAB, FakePair

from edgespec import options
from edgespec import tune as tuning
from edgespec.commands import tune as tune_command
from edgespec.decoder import Request, generate
from edgespec.planner.earlystop import DecisionModel
from edgespec.planner.mcsd import MCSDPlanner, MCSDTargetInitPlanner
from edgespec.planner.registry import StrategyError, make_planner
from edgespec.prompts import PromptCase
from edgespec.sampling import SamplingParams

PROMPT = [5, 17, 3, 29, 8, 40, 12]
GREEDY = SamplingParams()
SMALL = (2, 2, 1)  # small trees keep the fake fast


class ChatFakePair(FakePair):
    """FakePair with what `stream_reply` needs: a chat template, a tokenizer, and `with`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        model = self.target.model
        model.apply_chat_template = lambda messages: "|".join(m["content"] for m in messages)
        model.tokenize = lambda text, add_special=True, parse_special=True: [
            1 + ord(c) % (VOCAB - 1) for c in text[:12]
        ]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _events(planner, sampling=GREEDY, max_tokens=30, pair=None):
    pair = pair or FakePair(n_seq=33)
    request = Request(prompt=PROMPT, max_tokens=max_tokens, sampling=sampling)
    return pair, [e for e in generate(pair, planner, request) if e.verified_nodes]


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.9, seed=4)])
def test_logged_examples_are_the_accepted_paths(sampling):
    _, events = _events(MCSDPlanner(k_config=SMALL), sampling)
    assert sum(e.accepted for e in events) > 0
    for event in events:
        x, y, depth = tuning.step_examples(event.tree, event.accepted_path)
        assert x.shape == (event.tree.size - 1, 11) and y.shape == depth.shape == (event.tree.size - 1,)
        assert int(y.sum()) == event.accepted
        accepted_nodes = [u for u in range(1, event.tree.size) if y[u - 1]]
        assert accepted_nodes == list(event.accepted_path[1:])
        # the accepted draft tokens are the ones the step emitted before the target's own
        assert [int(event.tree.tokens[u]) for u in accepted_nodes] == [t.id for t in event.tokens][
            : len(accepted_nodes)
        ] or event.finish_reason is not None
        assert np.array_equal(depth, event.tree.depth[1:])


def test_training_features_are_what_model_mode_predicts_on():
    _, events = _events(MCSDPlanner(k_config=SMALL))
    examples = tuning.Examples.empty()
    examples.add(events, 0)
    model = DecisionModel.fit(examples.x, examples.y, hidden=4, epochs=20)
    planner = MCSDPlanner(k_config=SMALL, early_stop="model", model=model)
    for event in events[:5]:
        nodes = list(range(1, event.tree.size))
        expected = model.predict_proba(tuning.node_features(event.tree, nodes))
        assert np.allclose(planner.predicted_acceptance(event.tree, nodes), expected)


def _collected(n_prompts=5, max_tokens=24):
    pair = ChatFakePair(n_seq=33)
    cases = [PromptCase(f"t/{i}", "t", (("user", f"prompt number {i}"),)) for i in range(n_prompts)]
    seen = []
    examples = tuning.collect(pair, MCSDPlanner(k_config=SMALL), cases, max_tokens, GREEDY, seen.append)
    assert seen == list(range(n_prompts))
    return examples


def test_collect_train_save_load_roundtrip(edgespec_env):
    examples = _collected()
    assert set(np.unique(examples.prompt)) == set(range(5)) and examples.y.any() and not examples.y.all()
    model, report = tuning.train(examples, held_out=0.2, seed=0, hidden=4, epochs=50)
    assert report.split.startswith("by prompt") and len(report.held_out_prompts) == 1
    assert report.n_train + report.n_held_out == examples.y.size
    assert 0.0 <= report.auc <= 1.0 and 0.0 <= report.auc_draft_prob <= 1.0
    assert 0.0 < report.base_rate < 1.0 and 0.0 <= report.accuracy <= 1.0
    again, same = tuning.train(examples, held_out=0.2, seed=0, hidden=4, epochs=50)
    assert same == report and np.array_equal(again.w2, model.w2)  # fixed seed: reproducible
    path = tuning.save(model, report, tuning.decision_model_path("fake/pair+draft"), {"pair": "fake"})
    assert path == edgespec_env.home / "decision-models" / "fake_pair+draft.npz" and path.is_file()
    loaded = DecisionModel.load(path)
    assert np.allclose(loaded.predict_proba(examples.x), model.predict_proba(examples.x))
    info = json.loads(path.with_suffix(".json").read_text())
    assert info["pair"] == "fake" and info["held_out"]["auc"] == pytest.approx(report.auc)


def test_collect_refuses_early_stop():
    with pytest.raises(Exception, match="early stop off"):
        tuning.collect(
            ChatFakePair(), MCSDPlanner(early_stop="threshold"), tuning.load_cases("quick"), 4, GREEDY
        )


def test_train_refuses_data_without_both_labels():
    examples = tuning.Examples.empty()
    examples.x, examples.y = np.zeros((20, 11)), np.zeros(20, dtype=bool)
    examples.prompt, examples.depth = np.zeros(20, dtype=np.int32), np.ones(20, dtype=np.int32)
    with pytest.raises(Exception, match="too little training data"):
        tuning.train(examples)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_model_args(parser)
    options.add_strategy_args(parser)
    return parser.parse_args(list(argv))


def test_early_stop_model_picks_up_the_pairs_stored_model(edgespec_env):
    resolved = options.ResolvedPair("fake+pair", "t.gguf", "d.gguf", {"strategy": "chain", "budget": 4})
    args = _args("--strategy", "mcsd", "--early-stop", "model", "--budget", "0")
    with pytest.raises(StrategyError, match="edgespec tune"):
        options.make_planner(args, resolved)
    examples = _collected(n_prompts=2, max_tokens=16)
    model = DecisionModel.fit(examples.x, examples.y, hidden=0, epochs=30)
    edgespec_env.home.mkdir()
    model.save(edgespec_env.home / "x.npz")  # saving elsewhere does not count
    with pytest.raises(StrategyError):
        options.make_planner(args, resolved)
    stored = tuning.decision_model_path("fake+pair")
    stored.parent.mkdir(parents=True)
    model.save(stored)
    planner = options.make_planner(args, resolved)
    assert planner.early_stop == "model" and planner.k_config == (4, 2, 2, 1)
    assert np.allclose(planner.model.predict_proba(examples.x), model.predict_proba(examples.x))
    # an explicit path still wins
    other = DecisionModel.fit(examples.x, ~examples.y, hidden=0, epochs=30)
    other.save(edgespec_env.home / "other.npz")
    explicit = _args(
        *(
            "--strategy",
            "mcsd",
            "--early-stop",
            "model",
            "--early-stop-model",
            str(edgespec_env.home / "other.npz"),
        )
    )
    chosen = options.make_planner(explicit, resolved)
    assert np.allclose(chosen.model.predict_proba(examples.x), other.predict_proba(examples.x))


def test_tune_command_trains_stores_and_compares(edgespec_env, monkeypatch, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(f'{{"prompt": "question {i}"}}\n' for i in range(5)))
    monkeypatch.setattr(
        options,
        "open_pair",
        lambda args, need_draft=True: (
            options.ResolvedPair("fake+pair", "t", "d", {}),
            ChatFakePair(n_seq=33),
        ),
    )
    parser = argparse.ArgumentParser()
    tune_command.register(parser.add_subparsers())
    argv = ["tune", "--prompts", str(prompts), "--max-tokens", "16", "--k-config", "2,2,1", "--hidden", "4"]
    args = parser.parse_args([*argv, "--compare", "--variants", "off,model,target-init", "--json"])
    assert args.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pair"] == "fake+pair" and 0.0 <= out["held_out"]["auc"] <= 1.0
    assert tuning.decision_model_path("fake+pair").is_file()
    rows = {r["variant"].split(" ")[0]: r for r in out["compare"]["rows"]}
    assert [r["variant"].split(" ")[0] for r in out["compare"]["rows"]] == [
        "plain",
        "mcsd",
        "mcsd",
        "mcsd-target-init",
    ]
    assert len(out["compare"]["prompts"]) == 1  # the held-out prompt
    assert rows["plain"]["mal"] == 1.0 and rows["mcsd"]["mal"] > 1.0
    assert rows["mcsd-target-init"]["target_decodes_per_step"] == 2
    assert all(r["speedup"] > 0 for r in out["compare"]["rows"])
    assert all(r["agreement"] == 1.0 for r in out["compare"]["rows"])  # the fake has no batch noise
    assert any("(lossy)" in r["variant"] for r in out["compare"]["rows"])
    again = parser.parse_args([*argv, "--no-train", "--compare", "--variants", "threshold", "--json"])
    assert again.run(again) == 0
    compared = json.loads(capsys.readouterr().out)["compare"]
    assert len(compared["rows"]) == 2 and compared["prompts"] == out["compare"]["prompts"]  # held out


def test_prompt_sets():
    engine = tuning.load_cases("engine")
    assert len(engine) == 8 and engine[0].messages[0][0] == "user"
    assert len(tuning.load_cases("code,math")) > 2
    with pytest.raises(Exception, match="unknown prompt set"):
        tuning.load_cases("no-such-set")


def test_agreement():
    assert tuning.agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.5
    assert tuning.agreement([1, 2], [1, 2]) == 1.0


# -- mcsd-target-init: the root decoded alone, then a tree whose root is already committed ------------
def _assert_cache_is_committed(runner):
    view = runner.ctx.committed_view()
    assert [pos for pos, _, _ in view] == list(range(len(runner.committed)))
    assert [tok for _, tok, _ in view] == runner.committed
    assert all(seqs == frozenset(runner.tagged_seqs) for _, _, seqs in view)


def test_target_init_greedy_equals_plain_decoding_and_keeps_the_cache_committed():
    _, plain = _events(None, max_tokens=40)
    expected = [t.id for e in plain for t in e.tokens]
    planner = MCSDTargetInitPlanner(w=2, k_config=SMALL)
    assert planner.lossy
    pair = FakePair(n_seq=33)
    decodes_before = pair.target.ctx.decodes
    _, events = _events(planner, max_tokens=40, pair=pair)
    assert [t.id for e in events for t in e.tokens] == expected
    # Greedy: the target's own top token is the first child, so every step accepts at least it.
    assert all(e.accepted >= 1 for e in events if not e.finish_reason)
    assert pair.target.ctx.decodes - decodes_before == 1 + 2 * len(events)  # prefill, then 2 per step
    assert all(size == 1 for size in pair.target.ctx.batch_sizes[1::2])  # the root alone
    _assert_cache_is_committed(pair.target)
    _assert_cache_is_committed(pair.draft)


def test_target_init_samples_on_the_engine():
    pair, events = _events(
        make_planner("mcsd-target-init", {"k_config": "2,1", "w": 2}), SamplingParams(temperature=0.9, seed=2)
    )
    assert sum(len(e.tokens) for e in events) == 30 and sum(e.accepted for e in events) > 0
    _assert_cache_is_committed(pair.target)
