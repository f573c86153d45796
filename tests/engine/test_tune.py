"""`edgespec tune` on the strict fake engine: the logged examples, training and storage, the CLI, and
the decoder's support for mcsd-target-init (the root decoded alone first)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from edgespec import options
from edgespec.commands import tune as tune_command
from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams
from edgespec.measure import tune as tuning
from edgespec.measure.prompts import PromptCase
from edgespec.models.paths import decision_model_path
from edgespec.planner.earlystop import DecisionModel
from edgespec.planner.mcsd import MCSDPlanner, MCSDTargetInitPlanner
from edgespec.planner.strategies import StrategyError
from edgespec.planner.strategies import build as make_planner
from edgespec.planner.tree import ChildRule, SparseDist, TreeBuilder
from edgespec.strategy import make_planner as _make
from tests.support.fake_llama import ChatFakePair, FakePair

PROMPT = [5, 17, 3, 29, 8, 40, 12]
GREEDY = SamplingParams()
SMALL = (2, 2, 1)  # small trees keep the fake fast


def _events(planner, sampling=GREEDY, max_tokens=30, pair=None):
    pair = pair or FakePair(n_seq=33)
    request = Request(prompt=PROMPT, max_tokens=max_tokens, sampling=sampling)
    return pair, [e for e in generate(pair, planner, request) if e.verified_nodes]


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.9, seed=4)])
def test_logged_examples_are_the_reached_nodes_labelled_by_the_accepted_path(sampling):
    _, events = _events(MCSDPlanner(k_config=SMALL), sampling)
    assert sum(e.accepted for e in events) > 0
    unreached = 0
    for event in events:
        tree, path = event.tree, event.accepted_path
        nodes = tuning.reached_nodes(tree, path)
        x, y, depth = tuning.step_examples(tree, path)
        assert x.shape == (len(nodes), 11) and y.shape == depth.shape == (len(nodes),)
        assert [u for u, accepted in zip(nodes, y) if accepted] == list(path[1:])
        assert all(int(tree.parents[u]) in path for u in nodes)  # only children of accepted nodes
        # the accepted draft tokens are the ones the step emitted before the target's own
        assert [int(tree.tokens[u]) for u in path[1:]] == [t.id for t in event.tokens][
            : len(path) - 1
        ] or event.finish_reason is not None
        assert np.array_equal(depth, tree.depth[nodes])
        unreached += tree.size - 1 - len(nodes)
    assert unreached > 0  # the fix matters on these trees: some nodes were never reached


def test_reached_nodes_stop_at_the_accepted_sibling_and_below_rejections():
    tree = TreeBuilder(root_token=1)
    a, b, c = (tree.add(0, t, 0.3) for t in (10, 11, 12))
    a1 = tree.add(a, 20, 0.5)  # below a rejected node: never reached
    b1, b2 = tree.add(b, 21, 0.5), tree.add(b, 22, 0.4)
    b11 = tree.add(b1, 23, 0.5)
    for node in (0, a, b, b1):  # the distributions the children were drawn from (features need them)
        tree.dists[node] = SparseDist(ids=np.arange(10, 30, dtype=np.int32), probs=np.full(20, 0.05))
    frozen = tree.freeze()
    # b accepted after a was rejected (c never tried); then b1 rejected, b2 rejected: the step ends at b
    assert tuning.reached_nodes(frozen, (0, b)) == [a, b, b1, b2]
    assert tuning.reached_nodes(frozen, (0, b, b1)) == [a, b, b1, b11]  # b2 never tried
    assert tuning.reached_nodes(frozen, (0,)) == [a, b, c]
    assert a1 not in tuning.reached_nodes(frozen, (0, b, b1, b11))
    y = tuning.step_examples(frozen, (0, b))[1]
    assert y.tolist() == [False, True, False, False]
    tree.set_children_rule(0, ChildRule.LONGEST)  # mcsd-target-init: a, b, c are the target's tokens
    assert tuning.reached_nodes(tree.freeze(), (0, b)) == [b1, b2]


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
    path = tuning.save(model, report, decision_model_path("fake/pair+draft"), {"pair": "fake"})
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


def _planner(args: argparse.Namespace, resolved):
    """What `generate` builds for these arguments (without loading the pair)."""
    return _make(options.strategy_choice(args), resolved.defaults)


def test_early_stop_model_picks_up_the_pairs_stored_model(edgespec_env):
    resolved = options.ResolvedPair("fake+pair", "t.gguf", "d.gguf", {"strategy": "chain", "budget": 4})
    args = _args("--strategy", "mcsd", "--early-stop", "model", "--budget", "0")
    with pytest.raises(StrategyError, match="edgespec tune"):
        _planner(args, resolved)
    examples = _collected(n_prompts=2, max_tokens=16)
    model = DecisionModel.fit(examples.x, examples.y, hidden=0, epochs=30)
    edgespec_env.home.mkdir()
    model.save(edgespec_env.home / "x.npz")  # saving elsewhere does not count
    with pytest.raises(StrategyError):
        _planner(args, resolved)
    stored = decision_model_path("fake+pair")
    stored.parent.mkdir(parents=True)
    model.save(stored)
    planner = _planner(args, resolved)
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
    chosen = _planner(explicit, resolved)
    assert np.allclose(chosen.model.predict_proba(examples.x), other.predict_proba(examples.x))


def test_tune_command_trains_stores_and_compares(edgespec_env, monkeypatch, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(f'{{"prompt": "question {i}"}}\n' for i in range(5)))
    monkeypatch.setattr(
        options,
        "load",
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
    assert decision_model_path("fake+pair").is_file()
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
    # the fake has no batch noise: the lossless variants reproduce plain decoding; the lossy one may not
    assert all(r["agreement"] == 1.0 for r in out["compare"]["rows"] if "(lossy)" not in r["variant"])
    assert 0.0 <= rows["mcsd-target-init"]["agreement"] <= 1.0
    # the target's log-likelihood of what each produced: the lossless variants' text is plain decoding's
    assert all(r["target_loglik"] < 0.0 for r in out["compare"]["rows"])
    lossless = [r for r in out["compare"]["rows"] if "(lossy)" not in r["variant"]]
    assert all(r["loglik_vs_plain"] == pytest.approx(0.0, abs=1e-9) for r in lossless)
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


def test_target_init_decodes_the_root_alone_and_keeps_the_cache_committed():
    planner = MCSDTargetInitPlanner(w=2, k_config=SMALL)
    assert planner.lossy  # it keeps the branch accepted longest, not the target's own choice
    pair = FakePair(n_seq=33)
    decodes_before = pair.target.ctx.decodes
    _, events = _events(planner, max_tokens=40, pair=pair)
    assert sum(len(e.tokens) for e in events) == 40
    later = events[1:]  # the first token comes with the prompt's decode
    # Every step emits one of the target's own candidates first: at least that token is accepted.
    assert all(e.accepted >= 1 for e in later if not e.finish_reason)
    assert pair.target.ctx.decodes - decodes_before == 1 + 2 * len(later)  # the prompt, then 2 per step
    assert all(size == 1 for size in pair.target.ctx.batch_sizes[1::2])  # the root alone
    _assert_cache_is_committed(pair.target)
    _assert_cache_is_committed(pair.draft)


def test_target_init_samples_on_the_engine():
    pair, events = _events(
        make_planner("mcsd-target-init", {"k_config": "2,1", "w": 2}), SamplingParams(temperature=0.9, seed=2)
    )
    assert sum(len(e.tokens) for e in events) == 30 and sum(e.accepted for e in events) > 0
    _assert_cache_is_committed(pair.target)


def test_target_log_likelihood_matches_token_by_token_decoding():
    pair = FakePair(n_seq=33)
    answer = [3, 9, 4, 11, 7]
    got = tuning.target_log_likelihood(pair, PROMPT, answer)
    pair.target.sync(PROMPT[:-1])
    chain = [PROMPT[-1], *answer[:-1]]
    rows = np.stack([pair.target.decode_root(t).rows[0].copy() for t in chain]).astype(float)
    peak = rows.max(axis=1, keepdims=True)
    log_p = rows - peak - np.log(np.exp(rows - peak).sum(axis=1, keepdims=True))  # log softmax per row
    assert got == pytest.approx(float(np.mean(log_p[np.arange(len(answer)), answer])), rel=1e-9)
    assert np.isnan(tuning.target_log_likelihood(pair, PROMPT, []))
