"""Random-weight GGUF files with a real model's architecture — for timing only (the text is noise).

Cost curves depend on the shapes and the quantisation, not on the weights: a Qwen2.5-7B-shaped file of
random Q4_K blocks times like the real 7B without downloading it. The tokenizer (and chat template)
is copied from a real GGUF of the same family, so llama.cpp loads the file and edgespec pairs it with
that family's draft.

Weights are synthesised block by block, straight in the quantised layout (no quantiser needed):
random bytes for the quants, and fixed small f16 scales so every value is finite. Norms are 1 and
biases 0 (F32). A K-quant needs rows that are a multiple of 256 values; other rows fall back to Q8_0,
as llama.cpp's own quantiser does. The file is written tensor by tensor (memory stays at one tensor)
under a ``.partial`` name, renamed when whole: a file with the final name is always complete.

``shapes.py`` names the shapes (``shape_of``) and makes files of them (``make_like``);
scripts/randomgguf.py is the command line, and its tiny test models use ``write_gguf`` too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ..engine.gguf_header import read_header
from ..errors import EdgespecError
from ..progress import Progress

ARCH = "qwen2"
TYPES = ("F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K")
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q4_K": 15, "Q6_K": 18}  # general.file_type
# (values per block, bytes per block, byte offsets of the f16 scales in a block, the largest |w| / d
# that random quants can reach — so that d = wanted max |w| / it)
_LAYOUT = {
    "Q8_0": (32, 34, (0,), 128),  # d, qs[32]: w = d·q, q ∈ [-128, 127]
    "Q4_0": (32, 18, (0,), 8),  # d, qs[16]: w = d·(q − 8)
    "Q4_K": (256, 144, (0, 2), 63 * 15),  # d, dmin, scales[12], qs[128]: w = d·sc·q − dmin·m, sc, m < 64
    "Q6_K": (256, 210, (208,), 128 * 32),  # ql[128], qh[64], scales[16], d: w = d·sc·(q − 32)
}
MAX_WEIGHT = 0.05  # random weights stay within ±this (activations stay finite through the layers)
RANDOM_NAME = "random weights (timing only)"  # general.name of the files ``write_random_gguf`` writes
_TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
)


class Cancel(Protocol):
    """What stops a write between two tensors (a ``threading.Event``)."""

    def is_set(self) -> bool: ...


class WriteCancelled(EdgespecError):
    """A random-weight GGUF's writing was cancelled (its partial file is gone)."""


@dataclass(frozen=True)
class Dims:
    """The hyperparameters that decide the shapes (qwen2 architecture), and the weights' type."""

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int | None = None  # None: the tokenizer's size
    tied_output: bool = True  # no separate output.weight (the embedding is reused)
    context_length: int = 32768
    rope_freq_base: float = 1_000_000.0
    rms_eps: float = 1e-6
    qtype: str = "Q4_K"  # the weight matrices' type (one of TYPES; F32 for the tiny test models)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def dims_from_gguf(path: str | Path) -> Dims:
    """The qwen2 hyperparameters of a GGUF (read from its metadata); ``qtype`` from its file type."""
    kv, tensors = read_header(path)
    arch = kv.get("general.architecture")
    if arch != ARCH:
        raise ValueError(f"{path} is a {arch!r} model; only {ARCH} is supported")

    def get(key: str, default=None):
        return kv.get(f"{ARCH}.{key}", default)

    qtypes = {code: name for name, code in FILE_TYPES.items()}
    return Dims(
        n_layer=int(get("block_count")),
        n_embd=int(get("embedding_length")),
        n_ff=int(get("feed_forward_length")),
        n_head=int(get("attention.head_count")),
        n_head_kv=int(get("attention.head_count_kv")),
        n_vocab=int(tensors["token_embd.weight"][1]),
        tied_output="output.weight" not in tensors,
        context_length=int(get("context_length", 32768)),
        rope_freq_base=float(get("rope.freq_base", 1_000_000.0)),
        rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        qtype=qtypes.get(int(kv.get("general.file_type", FILE_TYPES["Q4_K"])), "Q4_K"),
    )


def read_tokenizer(path: str | Path) -> dict:
    """The tokenizer fields of a real GGUF, as Python values."""
    kv, _ = read_header(path)
    if "tokenizer.ggml.tokens" not in kv:
        raise ValueError(f"{path} has no tokenizer (tokenizer.ggml.tokens)")
    return {key: kv[key] for key in _TOKENIZER_KEYS if key in kv}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    qtype: str  # F32 | F16 | Q8_0 | …
    fill: str = "random"  # random | ones | zeros


def tensor_specs(dims: Dims, n_vocab: int, qtype: str) -> list[TensorSpec]:
    """Every tensor llama.cpp's qwen2 loader expects, in file order."""

    def weight(name: str, n_in: int, n_out: int) -> TensorSpec:
        block = _LAYOUT.get(qtype, (1,))[0]
        return TensorSpec(name, (n_in, n_out), qtype if n_in % block == 0 else "Q8_0")

    kv = dims.head_dim * dims.n_head_kv
    specs = [weight("token_embd.weight", dims.n_embd, n_vocab)]
    for i in range(dims.n_layer):
        b = f"blk.{i}"
        specs += [
            TensorSpec(f"{b}.attn_norm.weight", (dims.n_embd,), "F32", "ones"),
            weight(f"{b}.attn_q.weight", dims.n_embd, dims.n_embd),
            TensorSpec(f"{b}.attn_q.bias", (dims.n_embd,), "F32", "zeros"),
            weight(f"{b}.attn_k.weight", dims.n_embd, kv),
            TensorSpec(f"{b}.attn_k.bias", (kv,), "F32", "zeros"),
            weight(f"{b}.attn_v.weight", dims.n_embd, kv),
            TensorSpec(f"{b}.attn_v.bias", (kv,), "F32", "zeros"),
            weight(f"{b}.attn_output.weight", dims.n_embd, dims.n_embd),
            TensorSpec(f"{b}.ffn_norm.weight", (dims.n_embd,), "F32", "ones"),
            weight(f"{b}.ffn_gate.weight", dims.n_embd, dims.n_ff),
            weight(f"{b}.ffn_up.weight", dims.n_embd, dims.n_ff),
            weight(f"{b}.ffn_down.weight", dims.n_ff, dims.n_embd),
        ]
    specs.append(TensorSpec("output_norm.weight", (dims.n_embd,), "F32", "ones"))
    if not dims.tied_output:
        specs.append(weight("output.weight", dims.n_embd, n_vocab))
    return specs


def tensor_data(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """The tensor as numpy: float for F32/F16, raw uint8 blocks (rows × bytes) for quantised types."""
    n_in, rows = spec.ne[0], int(np.prod(spec.ne[1:], dtype=np.int64)) if len(spec.ne) > 1 else 1
    if spec.qtype in ("F32", "F16"):
        dtype = np.float32 if spec.qtype == "F32" else np.float16
        if spec.fill == "ones":
            return np.ones(spec.ne[::-1], dtype=dtype)
        if spec.fill == "zeros":
            return np.zeros(spec.ne[::-1], dtype=dtype)
        return rng.uniform(-MAX_WEIGHT, MAX_WEIGHT, size=spec.ne[::-1]).astype(dtype)
    block, size, scale_offsets, reach = _LAYOUT[spec.qtype]
    blocks = rows * (n_in // block)
    raw = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
    # Fixed small scales: every value stays within ±MAX_WEIGHT, whatever the random quants.
    d = np.frombuffer(np.float16(MAX_WEIGHT / reach).tobytes(), dtype=np.uint8)
    for offset in scale_offsets:
        raw[:, offset : offset + 2] = d
    return raw.reshape(rows, (n_in // block) * size)


def nbytes(spec: TensorSpec) -> int:
    """Bytes of one tensor's data in the file."""
    count = int(np.prod(spec.ne, dtype=np.int64))
    if spec.qtype == "F32":
        return 4 * count
    if spec.qtype == "F16":
        return 2 * count
    block, size, _, _ = _LAYOUT[spec.qtype]
    return count // block * size


def file_size(dims: Dims, n_vocab: int, qtype: str | None = None) -> int:
    """Bytes of tensor data the file will hold (roughly its size)."""
    return sum(nbytes(s) for s in tensor_specs(dims, n_vocab, qtype or dims.qtype))


def write_random_gguf(
    out: str | Path,
    dims: Dims,
    tokenizer: dict,
    qtype: str | None = None,
    seed: int = 0,
    name: str = RANDOM_NAME,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
) -> Path:
    """Write random weights of ``qtype`` (default ``dims.qtype``) to ``out`` (``write_gguf``)."""
    qtype = qtype or dims.qtype
    if qtype not in TYPES:
        raise ValueError(f"type {qtype!r}: choose one of {', '.join(TYPES)}")
    rng = np.random.default_rng(seed)
    return write_gguf(
        out, dims, tokenizer, qtype, lambda spec: tensor_data(spec, rng), name, progress, cancel
    )


def write_gguf(
    out: str | Path,
    dims: Dims,
    tokenizer: dict,
    qtype: str,
    data: Callable[[TensorSpec], np.ndarray],
    name: str,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
) -> Path:
    """The qwen2 metadata, ``tokenizer`` and ``tensor_specs``' tensors, each from ``data(spec)``, written
    to ``out`` one tensor at a time. ``progress(tensor, bytes written, bytes in all)`` after each;
    ``cancel`` set: ``WriteCancelled``. Ctrl-C or any error leaves no file behind."""
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    try:
        _write(partial, dims, tokenizer, qtype, data, name, progress, cancel)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return partial.replace(out)


def _write(out: Path, dims: Dims, tokenizer: dict, qtype: str, data, name: str, progress, cancel) -> None:
    try:
        import gguf
    except ImportError:
        raise EdgespecError(
            "writing a random-weight GGUF needs the gguf package: pip install 'gguf>=0.10'"
        ) from None

    tokens = list(tokenizer["tokenizer.ggml.tokens"])
    n_vocab = dims.n_vocab or len(tokens)
    token_types = list(tokenizer.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    if n_vocab > len(tokens):  # padded vocabularies (Qwen2.5-7B+): extra ids the tokenizer never emits
        extra = n_vocab - len(tokens)
        tokens += [f"[PAD{i}]" for i in range(len(tokens), n_vocab)]
        token_types += [int(gguf.TokenType.UNUSED)] * extra
    elif n_vocab < len(tokens):
        raise ValueError(f"vocabulary of {n_vocab} is smaller than the tokenizer's {len(tokens)} tokens")

    writer = gguf.GGUFWriter(str(out), ARCH)
    writer.add_name(name)
    writer.add_type("model")
    writer.add_block_count(dims.n_layer)
    writer.add_context_length(dims.context_length)
    writer.add_embedding_length(dims.n_embd)
    writer.add_feed_forward_length(dims.n_ff)
    writer.add_head_count(dims.n_head)
    writer.add_head_count_kv(dims.n_head_kv)
    writer.add_rope_freq_base(dims.rope_freq_base)
    writer.add_layer_norm_rms_eps(dims.rms_eps)
    writer.add_file_type(FILE_TYPES[qtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tokenizer_model(tokenizer["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in tokenizer:
        writer.add_tokenizer_pre(tokenizer["tokenizer.ggml.pre"])
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    if "tokenizer.ggml.merges" in tokenizer:
        writer.add_token_merges(list(tokenizer["tokenizer.ggml.merges"]))
    for key, add in (
        ("tokenizer.ggml.eos_token_id", writer.add_eos_token_id),
        ("tokenizer.ggml.bos_token_id", writer.add_bos_token_id),
        ("tokenizer.ggml.padding_token_id", writer.add_pad_token_id),
        ("tokenizer.ggml.add_bos_token", writer.add_add_bos_token),
        ("tokenizer.chat_template", writer.add_chat_template),
    ):
        if key in tokenizer:
            add(tokenizer[key])

    specs = tensor_specs(dims, n_vocab, qtype)
    for spec in specs:
        size = nbytes(spec)
        if spec.qtype in ("F32", "F16"):
            dtype = np.float32 if spec.qtype == "F32" else np.float16
            writer.add_tensor_info(spec.name, spec.ne[::-1], np.dtype(dtype), size)
        else:
            rows = int(np.prod(spec.ne[1:], dtype=np.int64))
            qt = getattr(gguf.GGMLQuantizationType, spec.qtype)
            writer.add_tensor_info(spec.name, (rows, size // rows), np.dtype(np.uint8), size, raw_dtype=qt)
    try:
        writer.write_header_to_file(out)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        total, done = sum(nbytes(s) for s in specs), 0
        for spec in specs:
            if cancel is not None and cancel.is_set():
                raise WriteCancelled(f"writing {out.name} was cancelled")
            writer.write_tensor_data(data(spec))
            done += nbytes(spec)
            if progress is not None:
                progress(spec.name, done, total)
    finally:
        writer.close()
