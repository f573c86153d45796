"""ParallelSpec's mask step and LoRA adapter on a real llama.cpp: a tiny random-weight GGUF with a
synthetic tokenizer padded to Qwen2.5's 151,936 ids (so the default [MASK] ids exist; no model file
needed), and a tiny LoRA adapter written here with the ``gguf`` package in the format
``edgespec train parallel`` exports."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.engine import DEFAULT_MASK_IDS, EngineSettings, ModelPair, read_adapter
from edgespec.engine._context import Context, ContextSettings
from edgespec.engine._model import Model
from edgespec.engine.draft import Draft
from edgespec.engine.parallel import file_sha256
from edgespec.engine.rows import draft_dists
from edgespec.engine.runners import CachedModel
from edgespec.errors import EngineError
from edgespec.planner.inputs import DraftSetup
from edgespec.planner.tree import TreeBuilder
from tests.support.scripts import load

R = load("randomgguf")

EMBD, FF, RANK = 64, 128, 4
QWEN_VOCAB = 151936  # padded like Qwen2.5's, so that the default [MASK] ids exist


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("parallel") / "tiny.gguf"
    # Untied, as the 0.5B's file: on a tied output llama.cpp applies token_embd's LoRA to the output
    # matmul too, and aborts (edgespec's export refuses such bases: edgespec/train/export.py).
    dims = R.Dims(2, EMBD, FF, n_head=4, n_head_kv=2, n_vocab=QWEN_VOCAB, tied_output=False)
    return str(R.write_random_gguf(out, dims, R.synthetic_tokenizer(), "Q8_0"))


def write_adapter(path, base_sha256: str, k: int = 4, scale: float = 0.5) -> str:
    """A LoRA on one attention matrix and on the token embeddings (where trained masks live), with
    ParallelSpec's metadata. Shapes in ggml order: A (n_in, r), B (r, n_out); for token_embd llama.cpp
    flips them (A (r, n_vocab), B (r, n_embd))."""
    import gguf

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), R.ARCH)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(RANK))
    writer.add_uint32("parallelspec.k", k)
    writer.add_array("parallelspec.mask_ids", list(DEFAULT_MASK_IDS[:k]))
    writer.add_string("parallelspec.base_sha256", base_sha256)
    tensors = {
        "blk.0.attn_q.weight.lora_a": rng.normal(0, scale, (RANK, EMBD)),  # numpy: reversed ggml order
        "blk.0.attn_q.weight.lora_b": rng.normal(0, scale, (EMBD, RANK)),
        "token_embd.weight.lora_a": rng.normal(0, scale, (QWEN_VOCAB, RANK)),
        "token_embd.weight.lora_b": rng.normal(0, scale, (EMBD, RANK)),
    }
    for name, data in tensors.items():
        writer.add_tensor(name, data.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def draft_on(model: Model) -> Draft:
    draft = Draft(Context(model, ContextSettings(n_ctx=256, n_batch=512, n_seq_max=8, n_threads=1)))
    draft.mask_ids = DEFAULT_MASK_IDS
    return draft


def test_mask_step_leaves_the_cache_as_if_only_the_real_tokens_were_decoded(tiny):
    model = Model(tiny, repack=False)  # without repacking, batches of ≤ 8 compute like one token
    masked, plain = draft_on(model), draft_on(model)
    try:
        prompt = model.tokenize("def add(a, b):\n    return", add_special=False)
        pending = [prompt[-1], 11, 23]  # the old root, an accepted token, the new root
        for draft in (masked, plain):
            draft.sync(prompt)
            draft.pending = list(pending)
            draft.begin_step(0.0)
        start = masked.ctx.decode_seconds
        dists = masked.parallel_dists(TreeBuilder(pending[-1]), 4)
        assert len(dists) == 5 and masked.decodes == 1 and masked.decode_seconds > 0
        assert masked.ctx.decode_seconds > start
        root_row = plain.decode_committed(pending, want_last=True)
        reference = draft_dists(root_row[None, :], masked.top_k, 1.0, masked.vocab_limit, DEFAULT_MASK_IDS)[0]
        np.testing.assert_array_equal(dists[0].ids, reference.ids)  # depth 1: the root's own row
        np.testing.assert_allclose(dists[0].probs, reference.probs, rtol=1e-6)
        assert all(not set(d.ids.tolist()) & set(DEFAULT_MASK_IDS) for d in dists)

        assert masked.committed == plain.committed == prompt[:-1] + pending and masked.pending == []
        for seq in range(8):  # the same cells under every sequence id, and nothing past the root
            assert masked.ctx.seq_pos_max(seq) == plain.ctx.seq_pos_max(seq)
            assert masked.ctx.seq_state_bytes(seq) == plain.ctx.seq_state_bytes(seq)
        assert masked.ctx.seq_pos_max(0) == len(plain.committed) - 1
        following = masked.decode_committed([42], want_last=True).copy()
        np.testing.assert_array_equal(following, plain.decode_committed([42], want_last=True))
    finally:
        masked.close()
        plain.close()
        model.close()


@pytest.fixture(scope="module")
def tiny_pair(tiny, tmp_path_factory):
    probes = tmp_path_factory.mktemp("probes")  # the backend probe runs once for both loads of the file
    settings = EngineSettings(n_ctx=256, max_tree_nodes=8, threads=1, probe_dir=probes)
    with ModelPair(tiny, tiny, settings) as pair:
        yield pair


def _root_row(runner, prompt) -> np.ndarray:
    """The logits after ``prompt``, decoded from an empty cache."""
    CachedModel.sync(runner, [])  # the base sync: Draft.sync wants a pending root
    return runner.decode_committed(prompt, want_last=True).copy()


def test_the_adapter_loads_applies_to_the_draft_only_and_comes_off(tiny, tiny_pair, tmp_path):
    pair = tiny_pair
    path = write_adapter(tmp_path / "parallel.gguf", file_sha256(tiny))
    spec = read_adapter(path)
    assert (spec.k, spec.mask_ids, spec.adapter) == (4, DEFAULT_MASK_IDS, path)
    prompt = pair.target.model.tokenize("print('hello')", add_special=False) + [DEFAULT_MASK_IDS[0]]

    assert pair.set_up_draft(DraftSetup(masks=4)).adapter is None  # untrained: the default masks, no adapter
    assert pair.draft.mask_ids == DEFAULT_MASK_IDS
    before = _root_row(pair.draft, prompt)
    target_before = _root_row(pair.target, prompt)

    assert pair.set_up_draft(DraftSetup(masks=4, adapter=path)) == spec
    assert pair.draft.committed == []  # its cells were computed without the adapter: forgotten
    with_adapter = _root_row(pair.draft, prompt)
    assert np.abs(with_adapter - before).max() > 1e-3  # the LoRA changes the draft …
    np.testing.assert_array_equal(_root_row(pair.target, prompt), target_before)  # … only
    assert pair._adapter.meta("parallelspec.base_sha256") == spec.base_sha256

    pair.set_up_draft(DraftSetup(masks=4))  # back to the plain draft with untrained masks
    np.testing.assert_array_equal(_root_row(pair.draft, prompt), before)


def test_an_adapter_for_another_draft_is_refused(tiny_pair, tmp_path):
    path = write_adapter(tmp_path / "other.gguf", "0" * 64)
    with pytest.raises(EngineError, match="trained on another draft"):
        tiny_pair.set_up_draft(DraftSetup(masks=4, adapter=path))
    not_parallel = tmp_path / "plain-lora.gguf"
    import gguf

    writer = gguf.GGUFWriter(str(not_parallel), R.ARCH)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(EngineError, match="not a parallel drafter"):
        tiny_pair.set_up_draft(DraftSetup(masks=4, adapter=str(not_parallel)))
