"""Random-weight GGUFs: shapes of real models, finite synthetic blocks, and a tiny file that llama.cpp
loads and decodes (with the tokenizer copied from the bundled draft)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from tests.support.scripts import load

R = load("randomgguf")


def test_builtin_shapes_match_the_real_parameter_counts():
    # Qwen2.5-7B: 7.6 B parameters (untied 152064-row embedding and output).
    specs = R.tensor_specs(R.BUILTIN["qwen2.5-7b"], 152064, "Q4_K")
    params = sum(int(np.prod(s.ne)) for s in specs)
    assert 7.5e9 < params < 7.7e9
    assert 4.0e9 < R.file_size(R.BUILTIN["qwen2.5-7b"], 152064, "Q4_K") < 4.6e9  # ≈ 4.5 bits per weight
    names = {s.name for s in specs}
    assert {"token_embd.weight", "output.weight", "output_norm.weight", "blk.27.ffn_down.weight"} <= names
    tied = R.tensor_specs(R.BUILTIN["qwen2.5-0.5b"], 151936, "Q4_K")
    assert "output.weight" not in {s.name for s in tied}


def test_k_quants_fall_back_to_q8_0_for_short_rows():
    specs = {s.name: s for s in R.tensor_specs(R.BUILTIN["qwen2.5-0.5b"], 151936, "Q4_K")}
    assert specs["blk.0.attn_q.weight"].qtype == "Q8_0"  # rows of 896 values: not a multiple of 256
    assert specs["blk.0.ffn_down.weight"].qtype == "Q4_K"  # rows of 4864 = 19 × 256
    assert specs["blk.0.attn_norm.weight"].qtype == "F32"


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K"])
def test_synthetic_blocks_are_finite_and_small(qtype):
    spec = R.TensorSpec("w", (256, 32), qtype)
    data = R.tensor_data(spec, np.random.default_rng(0))
    values = data if qtype == "F16" else dequantize(data, getattr(gguf.GGMLQuantizationType, qtype))
    assert values.shape == (32, 256)
    assert np.isfinite(values).all() and 0 < np.abs(values).max() <= R.MAX_WEIGHT * 1.01
    assert data.nbytes == R.nbytes(spec)


@pytest.fixture(scope="module")
def tokenizer_source() -> str:
    from tests.support.realmodels import bundled_paths

    return bundled_paths()[1]  # the draft: smallest file with the family's tokenizer (skips if absent)


def test_header_reader_gets_shapes_and_tokenizer(tokenizer_source):
    dims = R.dims_from_gguf(tokenizer_source)
    assert (dims.n_layer, dims.n_embd, dims.n_ff, dims.n_head, dims.n_head_kv) == (24, 896, 4864, 14, 2)
    tok = R.read_tokenizer(tokenizer_source)
    assert len(tok["tokenizer.ggml.tokens"]) == len(tok["tokenizer.ggml.token_type"]) == dims.n_vocab
    assert tok["tokenizer.ggml.model"] == "gpt2" and tok["tokenizer.ggml.eos_token_id"] == 151645


@pytest.mark.model  # loads llama.cpp twice and checks a 152k-token pairing: seconds, not milliseconds
def test_tiny_random_model_loads_and_decodes(tokenizer_source, tmp_path):
    from edgespec.decoding.decoder import Request, generate
    from edgespec.engine import EngineSettings, ModelPair
    from edgespec.planner.chain import ChainPlanner

    out = tmp_path / "tiny.gguf"
    argv = ["--like", tokenizer_source, "--out", str(out), "--type", "Q4_K", "--layers", "2"]
    argv += ["--embd", "320", "--ff", "512", "--heads", "4", "--kv-heads", "2"]
    assert R.main(argv) == 0  # Q4_K where rows allow (ffn_down: 512), Q8_0 elsewhere (320)
    dims = R.dims_from_gguf(out)
    assert (dims.n_layer, dims.n_embd, dims.n_ff, dims.n_head, dims.n_head_kv) == (2, 320, 512, 4, 2)
    with ModelPair(str(out), str(out), EngineSettings(n_ctx=256, max_tree_nodes=8)) as pair:
        model = pair.target.model
        assert model.n_vocab == 151936 and model.chat_template()
        prompt = model.tokenize("def add(a, b):", add_special=True)
        plain = [t.id for e in generate(pair, None, Request(prompt, max_tokens=8)) for t in e.tokens]
        spec = [
            t.id
            for e in generate(pair, ChainPlanner(gamma=3), Request(prompt, max_tokens=8))
            for t in e.tokens
        ]
    assert len(plain) == 8 and len(spec) == 8
