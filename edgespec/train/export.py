"""Export a trained parallel drafter as a GGUF LoRA adapter that llama.cpp loads on the draft.

Tensor layout (llama.cpp ``llama_adapter_lora_init``, as ``convert_lora_to_gguf.py`` writes it):

* a linear weight W (ggml ne = [in, out], numpy (out, in)) gets ``<name>.lora_a`` numpy (r, in) and
  ``<name>.lora_b`` numpy (out, r) — PEFT's ``lora_A.weight`` and ``lora_B.weight`` as they are —
  and llama.cpp adds ``scale * B @ (A @ x)``, scale = alpha / r;
* ``token_embd.weight`` is flipped (see ``build_inp_embd``): ``lora_a`` numpy (n_vocab, r'),
  ``lora_b`` numpy (n_embd, r'), and the embedding of token i gains ``scale' * B @ A[i]``,
  scale' = alpha / r'. The mask rows are exported exactly, at rank r' = K: A[MASK_k] = e_k (one-hot)
  and column k of B = mask_delta[k] / scale'. Every other row of A is zero, so the embedding of
  every ordinary token is unchanged.

A model whose output matrix *is* the embedding (no ``output.weight``) would also route the output
matmul through that embedding LoRA, where the flipped shapes do not fit: such drafts are refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..errors import EdgespecError
from ..models.paths import sha256_file

# PEFT module name → GGUF tensor name of the weight it adapts
_GGUF_NAMES = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
}
_PEFT_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.(?:default\.)?weight$")


def _numpy(value) -> np.ndarray:
    """A torch tensor (or array) as a contiguous float32 numpy array."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().float().numpy()
    return np.ascontiguousarray(value, dtype=np.float32)


def lora_tensors(lora: dict) -> dict[str, np.ndarray]:
    """PEFT state (name → tensor) as GGUF tensors ``blk.N.<weight>.weight.lora_a/b`` (float32)."""
    out = {}
    for name, value in lora.items():
        match = _PEFT_KEY.search(name)
        if not match:
            raise ValueError(f"unexpected LoRA parameter {name!r}")
        layer, module, which = match.groups()
        gguf = f"blk.{layer}.{_GGUF_NAMES[module]}.weight.lora_{which.lower()}"
        out[gguf] = _numpy(value)
    return out


def embedding_tensors(mask_delta: np.ndarray, mask_ids, n_vocab: int, alpha: float) -> dict[str, np.ndarray]:
    """The K mask rows as an exact rank-K LoRA on ``token_embd.weight`` (zero on every other row)."""
    k, n_embd = mask_delta.shape
    scale = alpha / k  # llama.cpp's scale for this tensor: alpha / rank, rank = K
    a = np.zeros((n_vocab, k), dtype=np.float32)
    a[list(mask_ids), np.arange(k)] = 1.0
    b = np.ascontiguousarray((mask_delta / scale).T.astype(np.float32))  # (n_embd, K)
    return {"token_embd.weight.lora_a": a, "token_embd.weight.lora_b": b}


def base_info(base_gguf: str | Path) -> dict:
    """Architecture, vocabulary size and whether the output matrix is separate, from the draft GGUF."""
    from ..engine.gguf_header import read_header

    kv, shapes = read_header(base_gguf)
    n_embd, n_vocab = shapes["token_embd.weight"][:2]  # ggml order
    return {"arch": kv["general.architecture"], "n_vocab": n_vocab, "n_embd": n_embd,
            "separate_output": "output.weight" in shapes}


def export_adapter(state: dict, base_gguf: str | Path, out: str | Path, mask_ids, alpha: float,
                   dtype: str = "f16", extra: dict | None = None) -> dict:
    """Write the adapter GGUF; returns its path, size and sha256 (and the base's sha256)."""
    import gguf

    info = base_info(base_gguf)
    mask_delta = _numpy(state["mask_delta"])
    tensors = lora_tensors(state["lora"])
    if np.any(mask_delta):
        if not info["separate_output"]:
            raise ValueError(
                f"{base_gguf} has no output.weight (the output reuses the embedding): llama.cpp would apply "
                "the embedding LoRA to the output matmul too. Train without mask rows for such a draft."
            )
        tensors.update(embedding_tensors(mask_delta, mask_ids, info["n_vocab"], alpha))
    base_sha = sha256_file(Path(base_gguf))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), info["arch"])
    writer.add_type("adapter")  # general.type
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    writer.add_uint32("parallelspec.k", len(mask_ids))
    writer.add_array("parallelspec.mask_ids", [int(i) for i in mask_ids])
    writer.add_string("parallelspec.base_sha256", base_sha)
    for key, value in (extra or {}).items():
        writer.add_string(f"parallelspec.{key}", str(value))
    np_dtype = np.float16 if dtype == "f16" else np.float32
    for name in sorted(tensors):
        writer.add_tensor(name, tensors[name].astype(np_dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"path": str(out), "bytes": out.stat().st_size, "sha256": sha256_file(out),
            "base_sha256": base_sha, "tensors": len(tensors)}


def ship(work: Path, dest: Path, name: str, command: str) -> dict:
    """Copy ``work``'s adapter to ``dest/<name>.gguf`` with a record ``dest/<name>.json``: the run's
    ``record.json`` plus the whole loss curve (``loss.csv``) and the command that made it."""
    import shutil

    from .loop import read_curve

    run = json.loads((Path(work) / "record.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"{name}.gguf"
    shutil.copyfile(run["adapter"]["path"], target)
    sha = sha256_file(target)
    if sha != run["adapter"]["sha256"]:
        raise EdgespecError(f"copying {run['adapter']['path']} to {target} changed its sha256")
    curve = read_curve(Path(work) / "loss.csv")
    settings = run["train"]["settings"]
    record = {
        "adapter": target.name, "sha256": sha, "bytes": target.stat().st_size,
        "base_sha256": run["adapter"]["base_sha256"], "base_model": Path(run["draft"]).name,
        "target_model": Path(run["target"]).name, "k": settings["k"], "mask_ids": settings["mask_ids"],
        "command": command, **{key: run[key] for key in (
            "prompts", "data", "train", "load_seconds", "loss_first", "loss_last", "eval_before",
            "eval_after", "check",
        ) if key in run},
        "loss_curve": {"columns": list(curve[0]) if curve else [],
                       "rows": [list(row.values()) for row in curve]},
    }
    (dest / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    return record
