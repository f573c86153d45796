"""Random-weight GGUF files with a real model's architecture — for timing only (the text is noise).

Cost curves depend on the shapes and the quantisation, not on the weights: a Qwen2.5-7B-shaped file of
random Q4_K blocks times like the real 7B without downloading it. The tokenizer (and chat template)
is copied from a real GGUF of the same family, so llama.cpp loads the file and edgespec pairs it with
that family's draft.

Weights are synthesised block by block, straight in the quantised layout (no quantiser needed):
random bytes for the quants, and fixed small f16 scales so every value is finite. Norms are 1 and
biases 0 (F32). A K-quant needs rows that are a multiple of 256 values; other rows fall back to Q8_0,
as llama.cpp's own quantiser does.

    python scripts/randomgguf.py --like qwen2.5-7b --tokenizer-from target.gguf --out 7b-rand.gguf
    python scripts/randomgguf.py --like real-model.gguf --type Q8_0 --layers 4 --out small.gguf

Tests also get a tiny model that needs no real GGUF at all (``write_tiny_gguf``, ``--tiny``): a
synthetic byte-level BPE tokenizer with Qwen2's control tokens and a ChatML template, and F32 weights
scaled so that its greedy choices are decisive (top-1 − top-2 logit gaps far above float noise).

    python scripts/randomgguf.py --tiny --out tiny.gguf
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgespec.engine.gguf_header import read_header

ARCH = "qwen2"


@dataclass(frozen=True)
class Dims:
    """The hyperparameters that decide the shapes (qwen2 architecture)."""

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

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# Qwen2.5 (and -Coder) shapes, from the models' config.json.
BUILTIN: dict[str, Dims] = {
    "qwen2.5-0.5b": Dims(24, 896, 4864, 14, 2, tied_output=True),
    "qwen2.5-1.5b": Dims(28, 1536, 8960, 12, 2, tied_output=True),
    "qwen2.5-3b": Dims(36, 2048, 11008, 16, 2, tied_output=True),
    "qwen2.5-7b": Dims(28, 3584, 18944, 28, 4, n_vocab=152064, tied_output=False),
    "qwen2.5-14b": Dims(48, 5120, 13824, 40, 8, n_vocab=152064, tied_output=False),
    "qwen2.5-32b": Dims(64, 5120, 27648, 40, 8, n_vocab=152064, tied_output=False),
}
TYPES = ("F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K")
# (values per block, bytes per block, byte offsets of the f16 scales in a block, the largest |w| / d
# that random quants can reach — so that d = wanted max |w| / it)
_LAYOUT = {
    "Q8_0": (32, 34, (0,), 128),  # d, qs[32]: w = d·q, q ∈ [-128, 127]
    "Q4_0": (32, 18, (0,), 8),  # d, qs[16]: w = d·(q − 8)
    "Q4_K": (256, 144, (0, 2), 63 * 15),  # d, dmin, scales[12], qs[128]: w = d·sc·q − dmin·m, sc, m < 64
    "Q6_K": (256, 210, (208,), 128 * 32),  # ql[128], qh[64], scales[16], d: w = d·sc·(q − 32)
}
MAX_WEIGHT = 0.05  # random weights stay within ±this (activations stay finite through the layers)
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


def dims_from_gguf(path: str | Path) -> Dims:
    """The qwen2 hyperparameters of a real GGUF (read from its metadata)."""
    kv, tensors = read_header(path)
    arch = kv.get("general.architecture")
    if arch != ARCH:
        raise ValueError(f"{path} is a {arch!r} model; only {ARCH} is supported")

    def get(key: str, default=None):
        return kv.get(f"{ARCH}.{key}", default)

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
            data = np.ones(spec.ne[::-1], dtype=dtype)
        elif spec.fill == "zeros":
            data = np.zeros(spec.ne[::-1], dtype=dtype)
        else:
            data = rng.uniform(-MAX_WEIGHT, MAX_WEIGHT, size=spec.ne[::-1]).astype(dtype)
        return data
    block, size, scale_offsets, reach = _LAYOUT[spec.qtype]
    blocks = rows * (n_in // block)
    raw = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
    # Fixed small scales: every value stays within ±MAX_WEIGHT, whatever the random quants.
    d = np.frombuffer(np.float16(MAX_WEIGHT / reach).tobytes(), dtype=np.uint8)
    for offset in scale_offsets:
        raw[:, offset : offset + 2] = d
    return raw.reshape(rows, (n_in // block) * size)


def write_random_gguf(
    out: str | Path,
    dims: Dims,
    tokenizer: dict,
    qtype: str = "Q4_K",
    seed: int = 0,
    name: str = "random weights (timing only)",
    progress=None,
) -> Path:
    """Write the file tensor by tensor (memory stays at one tensor). Returns its path."""
    if qtype not in TYPES:
        raise ValueError(f"type {qtype!r}: choose one of {', '.join(TYPES)}")
    rng = np.random.default_rng(seed)
    return _write_gguf(out, dims, tokenizer, qtype, lambda spec: tensor_data(spec, rng), name, progress)


def _write_gguf(out, dims: Dims, tokenizer: dict, qtype: str, data, name: str, progress=None) -> Path:
    """The qwen2 metadata, ``tokenizer`` and ``tensor_specs``' tensors, each from ``data(spec)``."""
    import gguf

    tokens = list(tokenizer["tokenizer.ggml.tokens"])
    n_vocab = dims.n_vocab or len(tokens)
    token_types = list(tokenizer.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    if n_vocab > len(tokens):  # padded vocabularies (Qwen2.5-7B+): extra ids the tokenizer never emits
        extra = n_vocab - len(tokens)
        tokens += [f"[PAD{i}]" for i in range(len(tokens), n_vocab)]
        token_types += [int(gguf.TokenType.UNUSED)] * extra
    elif n_vocab < len(tokens):
        raise ValueError(f"vocabulary of {n_vocab} is smaller than the tokenizer's {len(tokens)} tokens")

    out = Path(out)
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
    file_type = {"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2, "Q4_K": 15, "Q6_K": 18}[qtype]
    writer.add_file_type(file_type)
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
        qt = getattr(gguf.GGMLQuantizationType, spec.qtype)
        n_bytes = _nbytes(spec)
        if spec.qtype in ("F32", "F16"):
            dtype = np.float32 if spec.qtype == "F32" else np.float16
            writer.add_tensor_info(spec.name, spec.ne[::-1], np.dtype(dtype), n_bytes)
        else:
            rows = int(np.prod(spec.ne[1:], dtype=np.int64))
            writer.add_tensor_info(
                spec.name, (rows, n_bytes // rows), np.dtype(np.uint8), n_bytes, raw_dtype=qt
            )
    writer.write_header_to_file(out)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, spec in enumerate(specs):
        writer.write_tensor_data(data(spec))
        if progress is not None:
            progress(spec.name, i + 1, len(specs))
    writer.close()
    return out


def _nbytes(spec: TensorSpec) -> int:
    count = int(np.prod(spec.ne, dtype=np.int64))
    if spec.qtype == "F32":
        return 4 * count
    if spec.qtype == "F16":
        return 2 * count
    block, size, _, _ = _LAYOUT[spec.qtype]
    return count // block * size


def file_size(dims: Dims, n_vocab: int, qtype: str) -> int:
    """Bytes of tensor data the file will hold (roughly its size)."""
    return sum(_nbytes(s) for s in tensor_specs(dims, n_vocab, qtype))


# -- a tiny model with a synthetic tokenizer: no real GGUF needed (tests) -----------------------------
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen2's, as control tokens
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Words the merges build (Ġ is a space, Ċ a newline in GPT-2's byte alphabet), each left to right.
PIECES = (
    "Ġthe", "Ġa", "Ġto", "Ġof", "Ġand", "Ġin", "Ġis", "Ġit", "Ġfor", "Ġthat", "Ġwith", "Ġnumber",
    "Ġfunction", "er", "on", "re", "at", "en", "or", "ing", "ion", "ĠĠ", "ĠĠĠĠ", "ĊĠĠĠ", "ĊĊ",
    "def", "Ġdef", "Ġreturn", "Ġif", "Ġelse", "Ġprint", "Ġself", "():", "Ġ=", "Ġ==", "Ġ+", "Ġ1",
    "Ġ0", "Ġ(", "):", "Ġprime", "Ġsort", "Ġlist", "Ġwhile", "Ġnot", "ĠTrue", "ĠFalse", "ĠNone",
)  # fmt: skip
TINY = Dims(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, tied_output=False, context_length=4096)
TINY_LOGIT_STD = 4.0  # std of the tiny model's logits: top-1 − top-2 gaps of ~1
# Seed 1: on the engine's prompts greedy choices win by ≥ 0.013 logits, ≥ 28 × the largest difference
# measured between a token's row in a batch and decoded alone (5e-4), so speculation's greedy output
# equals plain decoding exactly (tests/engine/test_tiny_gguf.py). Seeds 0, 2 and 3 have near-ties there.
TINY_SEED = 1


def byte_chars() -> list[str]:
    """GPT-2's byte → printable character map, by byte: what byte-level BPE vocabularies store
    (bytes that print as themselves keep their character, the others get 256, 257, …)."""
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    chars, extra = [], 0
    for b in range(256):
        chars.append(chr(b) if b in keep else chr(256 + extra))
        extra += b not in keep
    return chars


def synthetic_tokenizer(pieces: tuple[str, ...] = PIECES) -> dict:
    """A GPT-2-style byte-level BPE tokenizer in ``read_tokenizer``'s form: the 256 byte tokens (id =
    byte), a merge per step of each piece (left to right) with the piece's prefixes as tokens, then
    Qwen2's control tokens (``<|im_end|>`` is EOS, ``<|endoftext|>`` BOS and padding, no BOS added) and a
    ChatML template. llama.cpp tokenizes any text with it (bytes fall back to byte tokens)."""
    tokens = byte_chars()
    merges: list[str] = []
    for piece in pieces:
        for end in range(2, len(piece) + 1):
            if piece[:end] not in tokens:
                merges.append(f"{piece[: end - 1]} {piece[end - 1]}")
                tokens.append(piece[:end])
    types = [1] * len(tokens) + [3] * len(SPECIALS)  # normal, then control
    tokens += SPECIALS
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.padding_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }


def printable_ids(tokenizer: dict) -> np.ndarray:
    """Ids of the normal tokens whose bytes are printable ASCII or newlines (what the tiny model emits)."""
    byte_of = {c: b for b, c in enumerate(byte_chars())}
    tokens, types = tokenizer["tokenizer.ggml.tokens"], tokenizer["tokenizer.ggml.token_type"]
    ok = [
        i
        for i, (text, kind) in enumerate(zip(tokens, types))
        if kind == 1 and all(32 <= byte_of.get(c, 0) < 127 or byte_of.get(c) == 10 for c in text)
    ]
    return np.array(ok, dtype=np.int64)


def write_tiny_gguf(
    out: str | Path,
    dims: Dims = TINY,
    tokenizer: dict | None = None,
    seed: int = TINY_SEED,
    logit_std: float = TINY_LOGIT_STD,
) -> Path:
    """A tiny qwen2 GGUF (F32, 0.5 MB at ``TINY``) that llama.cpp loads, tokenizes, chats and decodes
    with, needing no real model: ``synthetic_tokenizer()`` unless ``tokenizer`` is given (a
    ``dims.n_vocab`` beyond it pads the vocabulary with unused tokens).

    Its weights are normal with std 1/√n_in (the embedding 1), so every layer moves the residual stream
    and the context matters; the output rows have std ``logit_std``/√n_embd, so logits have std
    ≈ ``logit_std`` and greedy choices are decisive. Rows of tokens other than printable ASCII and
    newlines (control tokens, other bytes, padding) are zero: the model writes valid text and never
    ends its turn on its own."""
    tokenizer = tokenizer or synthetic_tokenizer()
    dims = replace(dims, tied_output=False)
    n_vocab = dims.n_vocab or len(tokenizer["tokenizer.ggml.tokens"])
    silent = np.setdiff1d(np.arange(n_vocab), printable_ids(tokenizer))
    rng = np.random.default_rng(seed)

    def data(spec: TensorSpec) -> np.ndarray:
        if spec.fill != "random":
            return tensor_data(spec, rng)  # norms 1, biases 0
        std = 1.0 if spec.name == "token_embd.weight" else spec.ne[0] ** -0.5
        if spec.name == "output.weight":
            std *= logit_std
        weights = rng.normal(0.0, std, size=spec.ne[::-1]).astype(np.float32)  # (n_out, n_in)
        if spec.name == "output.weight":
            weights[silent] = 0.0
        return weights

    return _write_gguf(out, dims, tokenizer, "F32", data, "tiny random model (tests)")


# -- command line ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="randomgguf.py",
        description="Write a random-weight GGUF with a real model's shapes, for timing (cost curves) only; "
        "or, with --tiny, a tiny test model that needs no real GGUF.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--like", help=f"a real qwen2 .gguf to copy the shapes from, or one of: {', '.join(BUILTIN)}"
    )
    source.add_argument(
        "--tiny",
        action="store_true",
        help="a tiny test model (2 layers, 64 wide, F32) with a synthetic tokenizer: needs no real GGUF",
    )
    p.add_argument(
        "--tokenizer-from",
        help="a real GGUF of the same family to copy the tokenizer from (default: --like when it is a file)",
    )
    p.add_argument("--out", required=True, help="the .gguf to write")
    p.add_argument("--type", default="Q4_K", choices=TYPES, help="weight type (default Q4_K; --tiny: F32)")
    p.add_argument("--layers", type=int, help="override the layer count")
    p.add_argument("--embd", type=int, help="override the embedding width")
    p.add_argument("--ff", type=int, help="override the feed-forward width")
    p.add_argument("--heads", type=int, help="override the attention heads")
    p.add_argument("--kv-heads", type=int, help="override the key/value heads")
    p.add_argument("--seed", type=int, help=f"default 0 (--tiny: {TINY_SEED}, a decisive one)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {
        "n_layer": args.layers,
        "n_embd": args.embd,
        "n_ff": args.ff,
        "n_head": args.heads,
        "n_head_kv": args.kv_heads,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if args.tiny:
        seed = TINY_SEED if args.seed is None else args.seed
        write_tiny_gguf(args.out, replace(TINY, **overrides), seed=seed)
        print(f"wrote {args.out}", file=sys.stderr)
        return 0
    like_file = Path(args.like).is_file()
    if like_file:
        dims = dims_from_gguf(args.like)
    elif args.like in BUILTIN:
        dims = BUILTIN[args.like]
    else:
        print(f"--like: {args.like} is neither a file nor one of {', '.join(BUILTIN)}", file=sys.stderr)
        return 2
    dims = replace(dims, **overrides)
    tokenizer_path = args.tokenizer_from or (args.like if like_file else None)
    if tokenizer_path is None:
        print(
            "--tokenizer-from: give a real GGUF of the same family to copy the tokenizer from",
            file=sys.stderr,
        )
        return 2
    tokenizer = read_tokenizer(tokenizer_path)
    n_vocab = dims.n_vocab or len(tokenizer["tokenizer.ggml.tokens"])
    size = file_size(dims, n_vocab, args.type)
    print(f"writing {args.out}: {dims}, {args.type}, ~{size / 2**30:.2f} GiB", file=sys.stderr)
    write_random_gguf(args.out, dims, tokenizer, args.type, args.seed or 0, progress=_printer())
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _printer():
    def show(name: str, done: int, total: int) -> None:
        if done == total or done % 20 == 0:
            print(f"  {done}/{total} tensors ({name})", file=sys.stderr)

    return show


if __name__ == "__main__":
    sys.exit(main())
