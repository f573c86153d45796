"""The cache of a shape's cost curves (edgespec/profile/like.py), on tiny random GGUFs: the key known before
anything is written or loaded is the loaded pair's own key with the target named by its shape."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from edgespec.commands import bench, tune
from edgespec.engine import EngineSettings, ModelPair
from edgespec.errors import EdgespecError
from edgespec.models.shapes import like_key, make_like
from edgespec.profile.costs import CostProfile, profile_key
from edgespec.profile.like import keep_like, load_like, shape_profile_key
from tests.support.scripts import load

R = load("randomgguf")
TINY_SHAPE = "qwen2.5-0.5b:layers=1,embd=64,ff=128,heads=4,kv_heads=2,quant=Q8_0"


def test_the_shape_key_is_the_loaded_pairs_key_with_the_target_by_shape(tmp_path):
    draft = R.write_tiny_gguf(tmp_path / "draft.gguf")
    target = make_like(TINY_SHAPE, tmp_path, tokenizer_from=draft)
    settings = EngineSettings(n_ctx=256, threads=1, max_tree_nodes=8, target_gpu_layers=0, draft_gpu_layers=0)
    before = shape_profile_key(TINY_SHAPE, settings, str(draft))
    with ModelPair(str(target), str(draft), settings) as pair:
        loaded = profile_key(pair)
    assert loaded["target"] != before["target"] == {"like": like_key(TINY_SHAPE)}
    assert {**loaded, "target": before["target"]} == before
    other = shape_profile_key(TINY_SHAPE.replace("layers=1", "layers=2"), settings, str(draft))
    threads = shape_profile_key(TINY_SHAPE, replace(settings, threads=2), str(draft))
    assert other != before and threads != before


def test_kept_curves_load_by_the_shape_key_and_busy_ones_are_not_kept(tmp_path):
    steady = {n: (0.01 * n, 0.0101 * n) for n in (1, 2)}  # repeats within 1 %
    profile = CostProfile(
        target={1: 0.01, 2: 0.02}, draft={1: 0.001, 2: 0.002}, catchup={1: 0.001}, repeats=2,
        spread={"draft": steady},
    )  # fmt: skip
    key = {"target": {"like": "qwen2.5-7b-Q4_K"}, "threads": 2}
    assert load_like(key, tmp_path) is None
    kept = keep_like(profile, key, tmp_path)
    assert kept.key == key and load_like(key, tmp_path) == kept
    assert load_like({**key, "threads": 3}, tmp_path) is None
    busy = replace(profile, spread={"draft": {1: (0.01, 0.02), 2: (0.02, 0.04)}})  # repeats 2x apart
    other = {**key, "threads": 4}
    assert keep_like(busy, other, tmp_path).busy and load_like(other, tmp_path) is None


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_like_refuses_other_models_and_unknown_shapes_before_loading(command):
    parser = argparse.ArgumentParser()
    {"bench": bench, "tune": tune}[command].register(parser.add_subparsers(dest="command"))
    args = parser.parse_args([command, "--like", "qwen2.5-7b", "--target", "t.gguf", "--draft", "d.gguf"])
    with pytest.raises(EdgespecError, match="leave out --target, --draft"):
        args.run(args)
    args = parser.parse_args([command, "--like", "llama-3-8b"])
    with pytest.raises(EdgespecError, match="unknown model shape 'llama-3-8b'.*qwen2.5-7b"):
        args.run(args)
