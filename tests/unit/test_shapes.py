"""Named model shapes and random-weight GGUFs of them (edgespec/models/shapes.py, random_gguf.py): names,
aliases and overrides; files written once, reused while they match, never left half-written."""

from __future__ import annotations

import threading

import pytest

from edgespec.errors import EdgespecError
from edgespec.models.random_gguf import WriteCancelled, dims_from_gguf
from edgespec.models.shapes import SHAPES, like_key, make_like, shape_of
from tests.support.scripts import load

R = load("randomgguf")
SMALL = "qwen2.5-0.5b:layers=2,embd=64,ff=256,heads=4,kv_heads=2"


@pytest.fixture(scope="module")
def tokenizer_gguf(tmp_path_factory):
    """A GGUF with a tokenizer to copy (the tiny test model's synthetic one)."""
    return R.write_tiny_gguf(tmp_path_factory.mktemp("tok") / "tok.gguf")


def test_names_aliases_and_registry_entries_share_a_shape():
    seven = shape_of("qwen2.5-7b")
    assert (seven.n_layer, seven.n_embd, seven.n_ff, seven.n_head, seven.n_head_kv) == (
        28,
        3584,
        18944,
        28,
        4,
    )
    assert seven.qtype == "Q4_K" and not seven.tied_output
    assert shape_of("qwen2.5-coder-7b") == seven == shape_of("qwen2.5-coder-7b-instruct-q4_k_m")
    assert like_key("qwen2.5-coder-7b-instruct-q4_k_m") == like_key("qwen2.5-7b") == "qwen2.5-7b-Q4_K"
    q8 = shape_of("qwen2.5-coder-0.5b-instruct-q8_0")  # a registry entry: its quant
    assert q8.qtype == "Q8_0" and q8.n_layer == SHAPES["qwen2.5-0.5b"].n_layer


def test_overrides_shrink_a_shape_and_name_it():
    small = shape_of(f"{SMALL},quant=q8_0")
    assert (small.n_layer, small.n_embd, small.n_ff, small.qtype) == (2, 64, 256, "Q8_0")
    assert like_key(f"{SMALL},quant=Q8_0") == "qwen2.5-0.5b-Q8_0:embd=64,ff=256,heads=4,kv_heads=2,layers=2"
    assert shape_of("qwen2.5-7b:quant=Q4_K_M").qtype == "Q4_K"  # a K-quant mix: its main type


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("llama-3-8b", "qwen2.5-7b"),  # the error lists the known shapes
        ("qwen2.5-9b", "qwen2.5-0.5b"),
        ("qwen2.5-7b:depth=3", "layers="),
        ("qwen2.5-7b:layers=0", "positive whole number"),
        ("qwen2.5-7b:embd=100", "divide"),
        ("qwen2.5-7b:quant=IQ2_XS", "cannot be written"),
    ],
)
def test_unknown_shapes_and_bad_overrides_say_what_to_use(name, says):
    with pytest.raises(EdgespecError, match=says):
        shape_of(name)


def test_make_like_writes_the_shape_then_reuses_it(tokenizer_gguf, tmp_path):
    path = make_like(SMALL, tmp_path, tokenizer_from=tokenizer_gguf)
    dims = dims_from_gguf(path)
    assert (dims.n_layer, dims.n_embd, dims.n_ff, dims.n_head, dims.n_head_kv) == (2, 64, 256, 4, 2)
    assert dims.qtype == "Q4_K" and dims.n_vocab == len(R.synthetic_tokenizer()["tokenizer.ggml.tokens"])
    written = path.stat().st_mtime_ns
    seen = []
    again = make_like(SMALL, tmp_path, tokenizer_from=tokenizer_gguf, progress=lambda *a: seen.append(a))
    assert again == path and path.stat().st_mtime_ns == written and not seen  # not written again


def test_make_like_rewrites_a_file_that_is_not_the_shape(tokenizer_gguf, tmp_path):
    path = make_like(SMALL, tmp_path, tokenizer_from=tokenizer_gguf)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # cut short (copied in half)
    seen = []
    make_like(SMALL, tmp_path, tokenizer_from=tokenizer_gguf, progress=lambda *a: seen.append(a))
    assert seen and seen[-1][1] == seen[-1][2]  # written again, to the last byte
    assert dims_from_gguf(path).n_layer == 2


def test_progress_counts_bytes_to_the_end(tokenizer_gguf, tmp_path):
    seen = []
    path = make_like(SMALL, tmp_path, tokenizer_from=tokenizer_gguf, progress=lambda *a: seen.append(a))
    done = [d for _, d, _ in seen]
    assert done == sorted(done) and seen[-1][1] == seen[-1][2] <= path.stat().st_size
    assert [name for name, _, _ in seen][:2] == ["token_embd.weight", "blk.0.attn_norm.weight"]


def test_cancel_and_ctrl_c_leave_no_file(tokenizer_gguf, tmp_path):
    cancel = threading.Event()

    def cancel_midway(name, done, total):
        if name.startswith("blk.1"):
            cancel.set()

    with pytest.raises(WriteCancelled):
        make_like(SMALL, tmp_path, tokenizer_from=tokenizer_gguf, progress=cancel_midway, cancel=cancel)
    assert list(tmp_path.iterdir()) == []

    def interrupt(name, done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        make_like(SMALL, tmp_path, tokenizer_from=tokenizer_gguf, progress=interrupt)
    assert list(tmp_path.iterdir()) == []
