"""Named model shapes, and random-weight GGUFs of them for timing (``random_gguf.py`` writes the bytes).

``shape_of("qwen2.5-7b")`` is the Qwen2.5-7B's hyperparameters and a quantisation; a registry model
(``qwen2.5-coder-7b-instruct-q4_k_m``) or a family alias (``qwen2.5-coder-7b``) gives the same shape
with its own quantisation. ``NAME:layers=2,embd=128`` overrides fields (small shapes for tests and
quick looks). ``make_like`` writes such a file once and reuses it while it matches.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from ..errors import EdgespecError
from ..progress import Progress
from .random_gguf import (
    TYPES,
    Cancel,
    Dims,
    dims_from_gguf,
    file_size,
    read_tokenizer,
    write_random_gguf,
)

# Qwen2.5 (and -Coder: the same shapes) from the models' config.json.
SHAPES: dict[str, Dims] = {
    "qwen2.5-0.5b": Dims(24, 896, 4864, 14, 2, tied_output=True),
    "qwen2.5-1.5b": Dims(28, 1536, 8960, 12, 2, tied_output=True),
    "qwen2.5-3b": Dims(36, 2048, 11008, 16, 2, tied_output=True),
    "qwen2.5-7b": Dims(28, 3584, 18944, 28, 4, n_vocab=152064, tied_output=False),
    "qwen2.5-14b": Dims(48, 5120, 13824, 40, 8, n_vocab=152064, tied_output=False),
    "qwen2.5-32b": Dims(64, 5120, 27648, 40, 8, n_vocab=152064, tied_output=False),
}
# A registry quantisation → the type of the random file's matrices. K-quant mixes (Q4_K_M keeps some
# matrices in Q6_K) are written as their main type: within a few % of the real file's bytes.
QUANTS = {"Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K", "Q4_K": "Q4_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0",
          "Q4_0": "Q4_0", "F16": "F16"}  # fmt: skip
# NAME:key=value overrides → Dims fields
OVERRIDES = {"layers": "n_layer", "embd": "n_embd", "ff": "n_ff", "heads": "n_head", "kv_heads": "n_head_kv",
             "vocab": "n_vocab", "quant": "qtype"}  # fmt: skip
_FAMILY = re.compile(r"^qwen2\.5(?:-coder)?-(\d+(?:\.\d+)?b)\b")


def shape_of(name: str) -> Dims:
    """The shape and quantisation of ``name``: a known shape (``qwen2.5-7b``: Q4_K), a family alias
    (``qwen2.5-coder-7b``) or a registry model (its quant), each with optional ``:key=value,…``
    overrides (``layers``, ``embd``, ``ff``, ``heads``, ``kv_heads``, ``vocab``, ``quant``)."""
    return _resolve(name)[1]


def like_key(name: str) -> str:
    """The canonical name of ``name``'s shape, overrides and quant included (``qwen2.5-7b-Q4_K``,
    ``qwen2.5-7b-Q4_K:layers=2``): two names of the same shape share it (files, cached profiles)."""
    return _resolve(name)[0]


def _resolve(name: str) -> tuple[str, Dims]:
    base, _, extra = name.strip().partition(":")
    family = _FAMILY.match(base.lower())
    if family is None or f"qwen2.5-{family.group(1)}" not in SHAPES:
        raise EdgespecError(
            f"unknown model shape {name!r}: use one of {', '.join(SHAPES)} (or a -coder or registry "
            "name of those sizes), optionally with :layers=N,embd=N,ff=N,heads=N,kv_heads=N,quant=Q"
        )
    shape = f"qwen2.5-{family.group(1)}"
    dims = replace(SHAPES[shape], qtype=_registry_quant(base) or "Q4_K")
    changes = _overrides(name, extra)
    dims = replace(dims, **changes)
    if dims.qtype not in TYPES:
        raise EdgespecError(f"{name}: quant {dims.qtype!r} cannot be written; use one of {', '.join(TYPES)}")
    if dims.n_embd % dims.n_head or dims.n_head % dims.n_head_kv:
        raise EdgespecError(f"{name}: embd must divide by heads, and heads by kv_heads")
    given = ",".join(f"{k}={v}" for k, v in sorted(_overrides(name, extra, raw=True).items()) if k != "quant")
    return f"{shape}-{dims.qtype}{':' + given if given else ''}", dims


def _overrides(name: str, text: str, raw: bool = False) -> dict:
    out: dict = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        key, _, value = item.partition("=")
        if key not in OVERRIDES or not value:
            raise EdgespecError(f"{name}: {item!r} is not one of {', '.join(f'{k}=…' for k in OVERRIDES)}")
        if key == "quant":
            out["quant" if raw else "qtype"] = QUANTS.get(value.upper(), value.upper())
            continue
        if not value.isdigit() or int(value) < 1:
            raise EdgespecError(f"{name}: {key} must be a positive whole number, not {value!r}")
        out[key if raw else OVERRIDES[key]] = int(value)
    return out


def _registry_quant(name: str) -> str | None:
    """The random file's type for a registry model's quant (None: not a registry model)."""
    from .registry import load_registry

    models = load_registry().models
    if name not in models:
        return None
    quant = models[name].quant.upper()
    if quant not in QUANTS:
        raise EdgespecError(f"{name} is {quant}: random weights can be written as {', '.join(QUANTS)} only")
    return QUANTS[quant]


def make_like(
    name: str,
    directory: str | Path,
    *,
    tokenizer_from: Path,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
) -> Path:
    """A random-weight GGUF of ``name``'s shape in ``directory``, with the tokenizer of
    ``tokenizer_from`` (a real GGUF of the family): the file already there when it has this shape,
    else written now (``progress``: bytes; ``cancel`` set or Ctrl-C: no partial file is left)."""
    key, dims = _resolve(name)
    path = Path(directory) / f"{key.replace(':', '-').replace('=', '').replace(',', '-')}-random.gguf"
    if path.is_file() and _matches(path, dims):
        return path
    Path(directory).mkdir(parents=True, exist_ok=True)
    return write_random_gguf(path, dims, read_tokenizer(tokenizer_from), progress=progress, cancel=cancel)


def _matches(path: Path, dims: Dims) -> bool:
    """Whether the file at ``path`` holds ``dims``, whole (at least its tensors' bytes: a file written
    here is renamed to its final name only when written to the end, but one may be copied in)."""
    try:
        found = dims_from_gguf(path)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    # the fields that make the shape (the file's float32 metadata rounds rms_eps: not compared)
    fields = ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "tied_output", "qtype")
    same = all(getattr(found, f) == getattr(dims, f) for f in fields)
    same = same and dims.n_vocab in (None, found.n_vocab)
    return same and path.stat().st_size >= file_size(found, found.n_vocab or 0)
