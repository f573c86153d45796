"""One path from a strategy choice to a planner: `chat` (the chat facade, ``edgespec.session``),
`generate`, `bench` and `tune` run on the same choice, with non-default parameters, and build equal
planners.

The commands run for real through the CLI parser; only loading the models is replaced by the fake pair
(the loading facade, ``edgespec.models.pairs.open_pair``). Every planner built on the way is recorded where
all of them are made: ``edgespec.planner.strategies.build``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec import cli, options
from edgespec.models import pairs
from edgespec.models.paths import decision_model_path
from edgespec.planner import strategies
from edgespec.planner.earlystop import DecisionModel
from tests.support.fake_llama import ChatFakePair

MCSD = ["--strategy", "mcsd", "--k-config", "3,2", "--early-stop", "model", "--beta", "0.3"]
CHAIN = ["--strategy", "chain", "--gamma", "6", "--p-min", "0.05"]


@pytest.fixture
def world(edgespec_env, monkeypatch, tmp_path):
    """Local model files (a pair named t+d), the pair's decision model, the fake pair, and a record
    of every planner built."""
    for name in ("t.gguf", "d.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    rng = np.random.default_rng(0)
    model = DecisionModel.fit(rng.normal(size=(64, 11)), rng.random(64) < 0.5, hidden=0, epochs=5)
    path = decision_model_path("t+d")
    path.parent.mkdir(parents=True)
    model.save(path)
    built = []
    build = strategies.build

    def recording(name, params=None):
        planner = build(name, params)
        built.append(planner)
        return planner

    monkeypatch.setattr(strategies, "build", recording)
    fake = lambda resolved, settings: ChatFakePair(n_seq=33)  # noqa: E731
    monkeypatch.setattr(pairs, "open_pair", fake)
    monkeypatch.setattr(options, "open_pair", fake)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "one question"}\n')
    models = ["--target", str(tmp_path / "t.gguf"), "--draft", str(tmp_path / "d.gguf")]
    return built, models, prompts, tmp_path


def _run(argv: list[str]) -> None:
    args = cli.build_parser().parse_args(argv)
    assert args.run(args) == 0


def _chat(argv: list[str]):
    """What `edgespec chat` does before its first answer: load through the backend, build the planner."""
    from edgespec.session import ChatBackend

    args = cli.build_parser().parse_args(["chat", *argv])
    backend = ChatBackend.from_args(args)
    loaded = backend.load(None, lambda *progress: None)
    return backend.make_planner(loaded.defaults)


def test_mcsd_with_the_pairs_decision_model_is_built_alike_everywhere(world, capsys):
    built, models, prompts, _ = world
    _run(["generate", "hi", *models, *MCSD, "--max-tokens", "4", "--json"])
    generated = built[-1]
    chat = _chat([*models, *MCSD])
    short = ["--prompts", str(prompts), "--max-tokens", "4"]
    _run(["bench", *models, *MCSD[2:], "--strategies", "mcsd", *short])
    benched = built[-1]
    _run(["tune", *models, *MCSD[2:], *short, "--no-train", "--compare", "--variants", "model", "--json"])
    tuned = next(p for p in reversed(built) if p.early_stop == "model")
    capsys.readouterr()
    assert generated == chat == benched == tuned
    assert generated != strategies.build("mcsd")  # the choice is not the defaults
    assert (generated.k_config, generated.beta, generated.early_stop) == ((3, 2), 0.3, "model")
    assert generated.early_stop_model == str(decision_model_path("t+d"))  # the pair's own model, found
    for planner in (chat, benched, tuned):
        assert planner.model is not None


def test_chain_gamma_is_built_alike_everywhere(world, capsys):
    built, models, prompts, folder = world
    _run(["generate", "hi", *models, *CHAIN, "--max-tokens", "4", "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert answer["tokens"]  # it answered
    assert answer["runs_on"]["draft"] == {"device": "CPU", "gpu_layers": 0, "layers": 3}  # where it ran
    generated = built[-1]
    chat = _chat([*models, *CHAIN])
    _run(
        [
            "bench",
            *models,
            *CHAIN[2:],
            "--strategies",
            "chain",
            "--prompts",
            str(prompts),
            "--max-tokens",
            "4",
            "--json",
            str(folder / "bench.json"),
        ]
    )
    benched = built[-1]
    capsys.readouterr()
    assert generated == chat == benched
    assert json.loads((folder / "bench.json").read_text())["settings"]["runs_on"]["target"]["device"] == "CPU"
    assert (generated.gamma, generated.p_min) == (6, 0.05)


def test_a_budget_is_the_chains_gamma_on_every_path(world, capsys):
    built, models, prompts, _ = world
    budget = ["--strategy", "chain", "--budget", "5"]
    _run(["generate", "hi", *models, *budget, "--max-tokens", "4", "--json"])
    generated = built[-1]
    chat = _chat([*models, *budget])
    _run(["bench", *models, "--strategies", "chain:5", "--prompts", str(prompts), "--max-tokens", "4"])
    capsys.readouterr()
    assert generated == chat == built[-1] and generated.gamma == 5
