"""ParallelSpec training end to end on a tiny random model (2 layers, 64 wide, a 128-token byte-level
vocabulary): target-written data, two training steps, resume to a third, export, and llama.cpp loading
the adapter and computing what PyTorch computed. Needs the train extra; skipped without it."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch", reason="the train extra is not installed: pip install 'edgespec[train]'")
pytest.importorskip("transformers", reason="the train extra is not installed: pip install 'edgespec[train]'")
pytest.importorskip("peft", reason="the train extra is not installed: pip install 'edgespec[train]'")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from edgespec.train.distill import DistillSettings  # noqa: E402
from edgespec.train.loop import TrainSettings, read_curve  # noqa: E402
from edgespec.train.pipeline import ParallelJob, run_job  # noqa: E402
from tests.support.scripts import load  # noqa: E402

randomgguf = load("randomgguf")
Dims, write_random_gguf = randomgguf.Dims, randomgguf.write_random_gguf

K = 4
N_VOCAB = 128
MASKS = tuple(range(N_VOCAB - K, N_VOCAB))  # the last K padding ids, as the Qwen masks are
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_chars() -> list[str]:
    """GPT-2's byte → printable character map (what byte-level BPE vocabularies store), by byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tiny_tokenizer() -> dict:
    """Printable ASCII and newline only (a random model then emits valid UTF-8), ChatML specials, pads."""
    chars = _byte_chars()
    tokens = [chars[b] for b in range(256) if 0x20 <= b < 0x7F or b == 0x0A] + ["ab"]
    types = [1] * len(tokens)
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types += [3, 3, 3]
    eos = len(tokens) - 1
    while len(tokens) < N_VOCAB:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(5)  # unused
    return {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.eos_token_id": eos, "tokenizer.ggml.padding_token_id": eos - 2,
        "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": CHATML,
    }


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> str:
    dims = Dims(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, tied_output=False)
    path = tmp_path_factory.mktemp("tiny") / "tiny-qwen2.gguf"
    return str(write_random_gguf(path, dims, tiny_tokenizer(), qtype="F16", seed=3))


def test_train_parallel_end_to_end_and_llama_cpp_agrees(tiny_gguf, tmp_path):
    import torch

    torch.manual_seed(0)
    train = TrainSettings(k=K, mask_ids=MASKS, groups=4, accum=1, steps=2, checkpoint_every=1, lr=1e-2)
    job = ParallelJob(
        target=tiny_gguf, draft=tiny_gguf, work=tmp_path, out=tmp_path / "ps.gguf", prompts=3,
        distill=DistillSettings(max_tokens=12), train=train, rank=4, alpha=8.0,
    )
    record = run_job(job, say=lambda line: None)

    data = [json.loads(line) for line in (tmp_path / "data.jsonl").read_text().splitlines()]
    assert [r["index"] for r in data] == [0, 1, 2] and all(r["answer_ids"] for r in data)
    assert record["train"]["steps"] == 2
    assert [row["step"] for row in read_curve(tmp_path / "loss.csv")] == [1, 2]
    adapter = record["adapter"]
    assert adapter["bytes"] > 0 and len(adapter["sha256"]) == 64
    # llama.cpp loaded the adapter and decoded text + masks; its logits are PyTorch's (F16 weights:
    # llama.cpp rounds activations to F16 for the matmuls, so agreement is to ~1e-2, not bits)
    for rows in ("text_rows", "mask_rows"):
        assert record["check"][rows]["max_abs"] < 0.01, record["check"]
        assert record["check"][rows]["argmax_agree"] == 1.0, record["check"]

    # resume: a third step continues the same curve; the data stage finds nothing left to answer
    again = run_job(replace(job, resume=True, train=replace(train, steps=3)), say=lambda line: None)
    assert again["data_run"]["new"] == 0
    assert [row["step"] for row in read_curve(tmp_path / "loss.csv")] == [1, 2, 3]
    assert again["train"]["steps"] == 3


def test_mask_rows_alone_leave_ordinary_tokens_bit_identical(tiny_gguf, tmp_path):
    """An adapter of only the mask rows (LoRA B = 0): llama.cpp's logits of ordinary text are the base's,
    exactly; the mask rows' logits move."""
    from edgespec.train.check import llama_rows
    from edgespec.train.export import export_adapter

    rng = np.random.default_rng(0)
    lora = {}
    for layer in range(2):
        prefix = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
        lora[f"{prefix}.lora_A.default.weight"] = rng.normal(size=(4, 64))
        lora[f"{prefix}.lora_B.default.weight"] = np.zeros((64, 4))
    state = {"lora": lora, "mask_delta": rng.normal(size=(K, 64))}
    export_adapter(state, tiny_gguf, tmp_path / "masks.gguf", MASKS, 8.0)
    text = [5, 6, 7, 8, 9, 10, 11, 12]
    base = llama_rows(tiny_gguf, text + list(MASKS))
    adapted = llama_rows(tiny_gguf, text + list(MASKS), str(tmp_path / "masks.gguf"))
    n = len(text)
    assert np.array_equal(base[:n], adapted[:n])
    assert np.abs(base[n:] - adapted[n:]).max() > 1e-3


def test_cli_parses_train_parallel():
    from edgespec.cli import build_parser

    args = build_parser().parse_args(["train", "parallel", "--k", "4", "--steps", "2", "--resume"])
    assert (args.kind, args.k, args.steps, args.resume) == ("parallel", 4, 2, True)


def test_groups_see_only_their_prefix_through_transformers_attention(tiny_gguf):
    """Every group's mask rows in one packed forward equal a separate causal run of prefix + masks: the
    custom 4-D mask reaches the attention (were it ignored, masks would see later tokens and groups)."""
    import torch

    from edgespec.train.groups import build_layout
    from edgespec.train.model import LoraSettings, ParallelDrafter, load_draft

    torch.manual_seed(0)
    drafter = ParallelDrafter(load_draft(tiny_gguf), MASKS, LoraSettings(rank=4, alpha=8.0))
    with torch.no_grad():  # a non-zero LoRA and mask rows, so every trained part takes part
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tokens = list(np.random.default_rng(2).integers(0, 90, size=24))
    anchors = [5, 11, 20]
    packed = build_layout(tokens, 3, anchors, MASKS)
    with torch.no_grad():
        rows = drafter.logits(packed).numpy()
        for g, t in enumerate(anchors):
            alone = build_layout(tokens[: t + 1], t + 1, [t], MASKS)
            ref = drafter.logits(alone).numpy()
            start = len(tokens) + g * K
            assert np.allclose(rows[start : start + K], ref[t + 1 :], atol=1e-4)
        plain = drafter.logits(build_layout(tokens, 3, [], MASKS)).numpy()  # no groups: plain causal
        assert np.allclose(rows[: len(tokens)], plain, atol=1e-4)
