"""`edgespec bench --like`: a random-weight target of a (here tiny) shape with the bundled draft, end to end:
timing-only JSON, the temporary folder gone after, and the shape's curves cached for ``measure_like``."""

from __future__ import annotations

import argparse
import json
import tempfile

import pytest

from edgespec.commands import bench as bench_command
from edgespec.measure import document
from edgespec.profile.costs import CostProfile

TINY = "qwen2.5-0.5b:layers=1,embd=64,ff=128,heads=4,kv_heads=2,quant=Q8_0"


@pytest.fixture
def quick_like(tmp_path, monkeypatch):
    """A fresh profile cache with few sizes, a temporary folder to watch, one prompt."""
    from edgespec.profile import costs, fit, store
    from tests.support.realmodels import bundled_paths

    bundled_paths()  # skips without the models
    monkeypatch.setattr(store, "home_dir", lambda: tmp_path)  # profiles: a fresh cache
    monkeypatch.setattr(costs, "QUICK_SIZES", (1, 2, 4))
    monkeypatch.setattr(costs, "QUICK_CATCHUP_SIZES", (1, 4))
    monkeypatch.setattr(costs, "BUSY_SPREAD", float("inf"))  # kept even when other work shares the cores
    monkeypatch.setattr(fit, "FIT_TOKENS", 4)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "Write a Python function that adds two numbers."}\n')
    return scratch, prompts


@pytest.mark.model
def test_bench_like_writes_timing_only_json_and_caches_the_shapes_curves(
    quick_like, tmp_path, monkeypatch, capsys
):
    from edgespec.models import shapes
    from edgespec.profile import like

    scratch, prompts = quick_like
    out_json = tmp_path / "like.json"
    parser = argparse.ArgumentParser()
    bench_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["bench", "--like", TINY, "--prompts", str(prompts), "--strategies", "chain:3,auto"]
        + ["--max-tokens", "8", "--warmup-tokens", "2", "--ctx", "1024", "--max-tree-nodes", "8"]
        + ["--threads", "1", "--json", str(out_json)]
    )
    assert args.run(args) == 0
    assert "timing only" in capsys.readouterr().out
    assert list(scratch.iterdir()) == []  # the random target's folder is gone

    doc = document.read_json(out_json)
    assert doc["timing_only"] is True and "random weights" in doc["timing_only_why"]
    assert doc["settings"]["like"] == TINY and "(random weights)" in doc["pair"]["name"]
    figures = [doc["baseline"], doc["cost_profile"], *doc["results"], *doc["per_prompt"]]
    assert {r["key"] for r in doc["results"]} == {"chain:3", "auto"}
    assert all(figure["timing_only"] is True for figure in figures)
    assert doc["cost_profile"]["key"]["target"] == {"like": shapes.like_key(TINY)}

    def no_writing(*args, **kwargs):
        raise AssertionError("measure_like wrote a file: the curves bench measured were not found")

    monkeypatch.setattr(like, "make_like", no_writing)
    cached = like.measure_like(TINY, threads=1)  # the shape's curves from the bench run: instant
    assert cached.target == CostProfile.from_dict(doc["cost_profile"]).target


@pytest.mark.model
def test_tune_like_times_the_variants_without_training(quick_like, capsys):
    from edgespec.commands import tune as tune_command

    scratch, prompts = quick_like
    parser = argparse.ArgumentParser()
    tune_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["tune", "--like", TINY, "--prompts", str(prompts), "--variants", "off,model", "--max-tokens", "6"]
        + ["--ctx", "1024", "--max-tree-nodes", "8", "--threads", "1", "--json"]
    )
    assert args.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["timing_only"] is True and out["cost_profile"]["timing_only"] is True
    assert [row["variant"] for row in out["compare"]["rows"]][0] == "plain" and len(
        out["compare"]["rows"]
    ) == 2
    assert all(row["timing_only"] is True for row in out["compare"]["rows"])  # "model" left out: no training
    assert "training" not in out and list(scratch.iterdir()) == []
