"""ParallelSpec training, the pure pieces (no torch): group layout, loss weights, prompts, data resume,
and the GGUF LoRA export (tensor names, shapes, metadata, exact mask rows) from numpy arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.train.distill import done_indices, read_records
from edgespec.train.groups import (
    IGNORE,
    build_layout,
    choose_anchors,
    default_mask_ids,
    loss_weights,
)
from edgespec.train.prompts import training_prompts


def test_default_mask_ids_are_the_qwen_padding_ids():
    assert default_mask_ids() == (151665, 151666, 151667, 151668)
    assert default_mask_ids(2, base=99) == (100, 101)


def test_loss_weights_decay_geometrically():
    assert np.allclose(loss_weights(4), [1, 0.8, 0.64, 0.512, 0.4096])
    assert np.allclose(loss_weights(2, decay=0.5), [1, 0.5, 0.25])


def test_layout_matches_the_runtime_decode():
    # prompt x0..x2, answer x3..x5; groups at t=2 and t=4, K=2
    x = [10, 11, 12, 13, 14, 15]
    lay = build_layout(x, prompt_len=3, anchors=[2, 4], mask_ids=[90, 91])
    assert lay.input_ids.tolist() == x + [90, 91, 90, 91]
    assert lay.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6]  # MASK_k of anchor t at t+k
    assert lay.depth.tolist() == [0] * 6 + [1, 2, 1, 2]
    # real rows predict the next answer token; MASK_k of anchor t predicts x_{t+k+1}
    assert lay.labels.tolist() == [IGNORE, IGNORE, 13, 14, 15, IGNORE, 14, 15, IGNORE, IGNORE]
    allowed = lay.allowed.astype(int)
    assert (allowed[:6, :6] == np.tril(np.ones((6, 6), dtype=int))).all()  # real: causal
    assert allowed[:6, 6:].sum() == 0  # real tokens never see masks
    assert allowed[6].tolist() == [1, 1, 1, 0, 0, 0, 1, 0, 0, 0]  # MASK_1@t=2: x0..x2 and itself
    assert allowed[7].tolist() == [1, 1, 1, 0, 0, 0, 1, 1, 0, 0]  # MASK_2: also MASK_1 of its group
    assert allowed[9].tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 1, 1]  # t=4: never the other group's masks


def test_layout_rows_see_exactly_what_a_causal_decode_of_prefix_plus_masks_sees():
    # the runtime decodes x_0..x_t, MASK_1..K causally: each mask row's visible (token, position) set
    rng = np.random.default_rng(1)
    x = rng.integers(0, 50, size=20).tolist()
    lay = build_layout(x, 5, [4, 9, 17], [90, 91, 92])
    for g, t in enumerate([4, 9, 17]):
        runtime = x[: t + 1] + [90, 91, 92]
        runtime_pos = list(range(t + 4))
        for k in range(3):
            row = 20 + 3 * g + k
            visible = np.flatnonzero(lay.allowed[row])
            seen = {(int(lay.input_ids[j]), int(lay.position_ids[j])) for j in visible}
            assert seen == set(zip(runtime[: t + 2 + k], runtime_pos[: t + 2 + k]))


def test_additive_mask_is_zero_where_allowed():
    lay = build_layout([1, 2, 3], 1, [1], [9])
    mask = lay.additive_mask(-1e30)
    assert mask.shape == (1, 1, 4, 4) and mask.dtype == np.float32
    assert ((mask[0, 0] == 0) == lay.allowed).all()


def test_anchors_are_answer_positions_and_distinct():
    rng = np.random.default_rng(0)
    a = choose_anchors(prompt_len=10, total_len=50, n_groups=8, rng=rng)
    assert len(set(a.tolist())) == 8 and a.min() >= 9 and a.max() <= 48 and (np.diff(a) > 0).all()
    assert choose_anchors(10, 13, 8, rng).tolist() == [9, 10, 11]  # fewer candidates than groups


def test_training_prompts_are_deterministic_distinct_and_not_bench_prompts():
    from edgespec.measure.prompts import prompt_set, set_names

    prompts = training_prompts()
    assert prompts == training_prompts() and len(set(prompts)) == len(prompts) > 300
    assert training_prompts(10) == prompts[:10]
    bench = {case.last_user_text for name in set_names() for case in prompt_set(name)}
    assert not bench & set(prompts)


def test_data_resume_skips_done_prompts_and_ignores_a_torn_line(tmp_path):
    path = tmp_path / "data.jsonl"
    done = [json.dumps({"index": i, "prompt_ids": [1], "answer_ids": [2]}) for i in (0, 3)]
    path.write_text("\n".join(done) + '\n{"index": 5, "pro')
    assert done_indices(path) == {0, 3}
    assert [r["index"] for r in read_records(path)] == [0, 3]
    assert done_indices(tmp_path / "missing.jsonl") == set()


# -- export ----------------------------------------------------------------------------------------
N_VOCAB, N_EMBD, RANK, K = 300, 64, 4, 2
MASKS = (290, 291)


def _tiny_base(tmp_path, tied: bool):
    from tests.support.scripts import load

    randomgguf = load("randomgguf")
    Dims, write_random_gguf = randomgguf.Dims, randomgguf.write_random_gguf

    tokenizer = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(N_VOCAB)]}
    dims = Dims(n_layer=2, n_embd=N_EMBD, n_ff=128, n_head=4, n_head_kv=2, tied_output=tied)
    return write_random_gguf(tmp_path / f"base-{tied}.gguf", dims, tokenizer, qtype="F16")


def _state(rng):
    lora = {}
    for layer in range(2):
        for part, module, n_in, n_out in (("self_attn", "q_proj", 64, 64), ("mlp", "down_proj", 128, 64)):
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            lora[f"{prefix}.lora_A.default.weight"] = rng.normal(size=(RANK, n_in))
            lora[f"{prefix}.lora_B.default.weight"] = rng.normal(size=(n_out, RANK))
    return {"lora": lora, "mask_delta": rng.normal(size=(K, N_EMBD))}


def test_export_writes_a_lora_gguf_with_exact_mask_rows(tmp_path):
    gguf = pytest.importorskip("gguf")
    from edgespec.models.paths import sha256_file
    from edgespec.train.export import export_adapter

    base = _tiny_base(tmp_path, tied=False)
    state = _state(np.random.default_rng(0))
    alpha = 8.0
    info = export_adapter(state, base, tmp_path / "a.gguf", MASKS, alpha, dtype="f32")
    assert info["base_sha256"] == sha256_file(base) and info["sha256"] == sha256_file(tmp_path / "a.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "a.gguf"))

    def field(key):
        f = reader.fields[key]
        values = [f.parts[i] for i in f.data]
        return [bytes(v).decode() if v.dtype == np.uint8 else v.tolist()[0] for v in values]

    assert field("general.type") == ["adapter"] and field("adapter.type") == ["lora"]
    assert field("general.architecture") == ["qwen2"] and field("adapter.lora.alpha") == [alpha]
    assert field("parallelspec.k") == [K] and field("parallelspec.mask_ids") == list(MASKS)
    assert reader.fields["parallelspec.mask_ids"].types[-1] == gguf.GGUFValueType.INT32
    assert reader.fields["parallelspec.k"].types[0] == gguf.GGUFValueType.UINT32
    assert field("parallelspec.base_sha256") == [info["base_sha256"]]
    tensors = {t.name: np.array(t.data) for t in reader.tensors}
    a = tensors["blk.1.ffn_down.weight.lora_a"]
    assert a.shape == (RANK, 128)  # numpy (r, in): ggml ne [in, r]
    peft_a = state["lora"]["base_model.model.model.layers.1.mlp.down_proj.lora_A.default.weight"]
    assert np.allclose(a, peft_a)
    assert tensors["blk.0.attn_q.weight.lora_b"].shape == (64, RANK)
    # llama.cpp's embedding delta of token i: (alpha / K) * B @ A[i] — the mask row, zero elsewhere
    emb_a, emb_b = tensors["token_embd.weight.lora_a"], tensors["token_embd.weight.lora_b"]
    assert emb_a.shape == (N_VOCAB, K) and emb_b.shape == (N_EMBD, K)
    delta = (alpha / K) * (emb_a @ emb_b.T)  # (V, d)
    assert np.allclose(delta[list(MASKS)], state["mask_delta"], atol=1e-5)
    others = np.setdiff1d(np.arange(N_VOCAB), MASKS)
    assert not delta[others].any()  # exactly zero: ordinary tokens keep their embedding


def test_export_refuses_mask_rows_on_a_tied_output(tmp_path):
    pytest.importorskip("gguf")
    from edgespec.train.export import export_adapter

    base = _tiny_base(tmp_path, tied=True)
    with pytest.raises(ValueError, match="output.weight"):
        export_adapter(_state(np.random.default_rng(0)), base, tmp_path / "a.gguf", MASKS, 8.0)


def test_ship_copies_the_adapter_and_finds_it_by_base_sha(tmp_path):
    from edgespec.errors import EdgespecError
    from edgespec.models.drafters import shipped_adapter
    from edgespec.models.paths import sha256_file
    from edgespec.train.export import ship

    work, dest = tmp_path / "work", tmp_path / "ship"
    work.mkdir()
    (work / "a.gguf").write_bytes(b"adapter bytes")
    (work / "loss.csv").write_text("step,wall_seconds,loss\n1,2.0,9.5\n2,4.0,7.25\n")
    settings = {"k": 2, "mask_ids": [7, 8]}
    run = {"target": "/m/t.gguf", "draft": "/m/d.gguf", "prompts": 3, "data": {"records": 3},
           "train": {"steps": 2, "settings": settings},
           "adapter": {"path": str(work / "a.gguf"), "sha256": sha256_file(work / "a.gguf"),
                       "base_sha256": "ab"}}
    (work / "record.json").write_text(json.dumps(run))
    record = ship(work, dest, "d.k2", "edgespec train parallel --k 2")
    assert record["loss_curve"]["rows"] == [[1.0, 2.0, 9.5], [2.0, 4.0, 7.25]]
    assert record["base_model"] == "d.gguf" and record["mask_ids"] == [7, 8]
    found = shipped_adapter("ab", dest)
    assert found is not None and found.path == dest / "d.k2.gguf"
    assert (found.k, found.mask_ids) == (2, (7, 8))
    assert shipped_adapter("other", dest) is None
    (dest / "d.k2.gguf").write_bytes(b"tampered")
    with pytest.raises(EdgespecError, match="sha256"):
        shipped_adapter("ab", dest)


def test_missing_training_stack_names_the_extra(monkeypatch):
    import sys

    from edgespec.errors import EdgespecError
    from edgespec.train.deps import require

    monkeypatch.setitem(sys.modules, "peft", None)  # makes `import peft` raise ImportError
    with pytest.raises(EdgespecError, match=r"peft.*pip install 'edgespec\[train\]'"):
        require()


def test_a_fresh_run_refuses_to_overwrite_a_checkpoint(tmp_path, monkeypatch):
    from edgespec.errors import EdgespecError
    from edgespec.train import deps
    from edgespec.train.pipeline import ParallelJob, run_job

    monkeypatch.setattr(deps, "require", lambda: None)
    record = {"index": 0, "prompt_ids": [1], "answer_ids": [2]}
    (tmp_path / "data.jsonl").write_text(json.dumps(record) + "\n")
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    job = ParallelJob(target="t.gguf", draft="d.gguf", work=tmp_path, out=tmp_path / "a.gguf", skip_data=True)
    with pytest.raises(EdgespecError, match="--resume"):
        run_job(job, say=lambda line: None)


def test_report_plots_the_curve_and_tabulates_held_out_accuracy(tmp_path):
    pytest.importorskip("matplotlib")
    from edgespec.train.report import plot_curve, smooth, summary_markdown

    assert smooth(np.array([1.0, 3.0, 5.0]), window=2).tolist() == [1.0, 2.0, 4.0]
    evals = {"rows": [10, 5], "ce": [0.5, 9.0], "top1": [0.9, 0.01]}
    record = {"k": 1, "base_model": "d.gguf", "eval_before": evals,
              "eval_after": {"rows": [10, 5], "ce": [0.4, 3.0], "top1": [0.91, 0.3]},
              "loss_curve": {"columns": ["step", "ce0", "ce1"], "rows": [[1, 0.5, 9.0], [2, 0.4, 3.0]]}}
    assert plot_curve(record, tmp_path / "c.png").stat().st_size > 1000
    table = summary_markdown(record)
    assert "| 1 | x_{t+2} (MASK_1) | 5 | 9.000 | 3.000 | 1.0% | 30.0% |" in table
