"""Random-weight GGUF files with a real model's architecture, for timing only (the text is noise): the
command line over ``edgespec.models.random_gguf`` (the writer) and ``edgespec.models.shapes`` (the named
shapes, ``NAME:layers=N,…`` overrides).

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
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgespec.models.random_gguf import (  # noqa: F401 - the tests' and the GPU kit's names, re-exported
    ARCH,
    MAX_WEIGHT,
    TYPES,
    Dims,
    TensorSpec,
    dims_from_gguf,
    file_size,
    nbytes,
    read_tokenizer,
    tensor_data,
    tensor_specs,
    write_gguf,
    write_random_gguf,
)
from edgespec.models.shapes import SHAPES as BUILTIN

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
TINY = Dims(2, 64, 128, n_head=4, n_head_kv=2, tied_output=False, context_length=4096, qtype="F32")
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

    return write_gguf(out, dims, tokenizer, "F32", data, "tiny random model (tests)")


# -- command line ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="randomgguf.py",
        description="Write a random-weight GGUF with a real model's shapes, for timing (cost curves) only; "
        "or, with --tiny, a tiny test model that needs no real GGUF.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--like",
        help=f"a real qwen2 .gguf to copy the shapes from, or a shape: {', '.join(BUILTIN)} "
        "(a -coder or registry name of those sizes too, NAME:layers=N,… overrides)",
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
    p.add_argument(
        "--type", choices=TYPES, help="weight type (default: the shape's, Q4_K for a named one; --tiny: F32)"
    )
    p.add_argument("--layers", type=int, help="override the layer count")
    p.add_argument("--embd", type=int, help="override the embedding width")
    p.add_argument("--ff", type=int, help="override the feed-forward width")
    p.add_argument("--heads", type=int, help="override the attention heads")
    p.add_argument("--kv-heads", type=int, help="override the key/value heads")
    p.add_argument("--seed", type=int, help=f"default 0 (--tiny: {TINY_SEED}, a decisive one)")
    return p


def main(argv: list[str] | None = None) -> int:
    from edgespec.errors import EdgespecError
    from edgespec.models.shapes import shape_of
    from edgespec.progress import progress_bar

    args = build_parser().parse_args(argv)
    overrides = {
        "n_layer": args.layers,
        "n_embd": args.embd,
        "n_ff": args.ff,
        "n_head": args.heads,
        "n_head_kv": args.kv_heads,
        "qtype": args.type,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if args.tiny:
        seed = TINY_SEED if args.seed is None else args.seed
        write_tiny_gguf(args.out, replace(TINY, **{**overrides, "qtype": "F32"}), seed=seed)
        print(f"wrote {args.out}", file=sys.stderr)
        return 0
    like_file = Path(args.like).is_file()
    try:
        dims = replace(dims_from_gguf(args.like) if like_file else shape_of(args.like), **overrides)
    except EdgespecError as exc:
        print(f"--like: {exc}", file=sys.stderr)
        return 2
    tokenizer_path = args.tokenizer_from or (args.like if like_file else None)
    if tokenizer_path is None:
        print(
            "--tokenizer-from: give a real GGUF of the same family to copy the tokenizer from",
            file=sys.stderr,
        )
        return 2
    tokenizer = read_tokenizer(tokenizer_path)
    n_vocab = dims.n_vocab or len(tokenizer["tokenizer.ggml.tokens"])
    size = file_size(dims, n_vocab)
    print(f"writing {args.out}: {dims}, ~{size / 2**30:.2f} GiB", file=sys.stderr)
    with progress_bar(f"writing {Path(args.out).name}") as bar:
        write_random_gguf(args.out, dims, tokenizer, seed=args.seed or 0, progress=bar)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
