"""The draft as a trainable parallel drafter: LoRA on its linear layers plus K trainable mask rows.

The draft GGUF is loaded into PyTorch by transformers (dequantised to float32). PEFT adds LoRA to
q, k, v, o, gate, up and down of every layer. The K mask rows are one extra parameter ``mask_delta``
(K, d): the input embedding of MASK_k is ``E[mask_k] + mask_delta[k]`` and every other row is
unchanged, so ordinary text sees only the linear-layer LoRA. (The bundled draft GGUF has its own
``output.weight``; transformers loads it as an untied ``lm_head``, so the output side is untouched.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .deps import require
from .groups import Layout

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 8
    alpha: float = 16.0  # scale of the LoRA update: alpha / rank
    dropout: float = 0.0


class ParallelDrafter:
    """The PEFT-wrapped draft and its mask rows; ``loss(layout)`` is the group-wise objective."""

    def __init__(self, model, mask_ids: Sequence[int], settings: LoraSettings):
        import torch
        from peft import LoraConfig, get_peft_model

        self.mask_ids = tuple(int(i) for i in mask_ids)
        self.settings = settings
        config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                            target_modules=list(LORA_TARGETS), bias="none")
        self.model = get_peft_model(model, config)
        embed = self.model.get_input_embeddings()
        # MASK_k starts at the mean embedding of the real vocabulary (the padding rows it replaces are
        # one shared untrained vector whose logits start far off): delta_k = mean(E) - E[mask_k]
        with torch.no_grad():
            weight = embed.weight
            real = weight[: min(self.mask_ids)].mean(dim=0)
            start = real[None, :] - weight[list(self.mask_ids)]
        self.mask_delta = torch.nn.Parameter(start.clone())  # (K, d)
        self._mask_index = torch.full((embed.weight.shape[0],), -1, dtype=torch.long)
        self._mask_index[list(self.mask_ids)] = torch.arange(len(self.mask_ids))

    def parameters(self):
        """The trainable parameters: the LoRA factors and the mask rows."""
        return [p for p in self.model.parameters() if p.requires_grad] + [self.mask_delta]

    def embed(self, input_ids):
        """(1, N) ids → (1, N, d): the base embedding, plus ``mask_delta[k]`` on MASK_k rows only."""
        import torch

        base = self.model.get_input_embeddings()(input_ids)
        slot = self._mask_index[input_ids]  # (1, N): k for MASK_k, -1 elsewhere
        delta = torch.where((slot >= 0)[..., None], self.mask_delta[slot.clamp(min=0)], 0.0)
        return base + delta

    def logits(self, layout: Layout):
        """(N, V) float32 logits of every row of ``layout`` (one sequence, its groups appended)."""
        import torch

        ids = torch.from_numpy(layout.input_ids)[None]
        mask = torch.from_numpy(layout.additive_mask(torch.finfo(torch.float32).min))
        out = self.model(
            inputs_embeds=self.embed(ids),
            attention_mask=mask,
            position_ids=torch.from_numpy(layout.position_ids)[None],
            use_cache=False,
        )
        return out.logits[0].float()

    def accuracy(self, layout: Layout, k: int):
        """(CE, top-1 hits, rows) per depth 0..k, no gradients: how often the argmax is the label."""
        import torch
        import torch.nn.functional as F

        with torch.no_grad():
            labels = torch.from_numpy(layout.labels)
            depth = torch.from_numpy(layout.depth)
            rows = (labels >= 0).nonzero().squeeze(1)
            logits = self.logits(layout)[rows]
            ce = F.cross_entropy(logits, labels[rows], reduction="none")
            hit = logits.argmax(dim=1) == labels[rows]
            out = []
            for d in range(k + 1):
                at = depth[rows] == d
                out.append((float(ce[at].sum()), int(hit[at].sum()), int(at.sum())))
            return out

    def loss(self, layout: Layout, weights) -> tuple:
        """(total, per-depth CE list): total = sum_k lambda_k * mean CE over rows at depth k."""
        import torch
        import torch.nn.functional as F

        labels = torch.from_numpy(layout.labels)
        depth = torch.from_numpy(layout.depth)
        rows = (labels >= 0).nonzero().squeeze(1)
        logits = self.logits(layout)[rows]  # only the rows with a label
        ce = F.cross_entropy(logits, labels[rows], reduction="none")
        total, per_depth = logits.new_zeros(()), []
        for k, weight in enumerate(weights):
            at = depth[rows] == k
            if bool(at.any()):
                term = ce[at].mean()
                total = total + float(weight) * term
                per_depth.append(float(term.detach()))
            else:
                per_depth.append(float("nan"))
        return total, per_depth

    def state(self) -> dict:
        """Only what training changes: the LoRA tensors and the mask rows (a few MB)."""
        lora = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        return {"lora": lora, "mask_delta": self.mask_delta.detach().clone()}

    def load_state(self, state: dict) -> None:
        import torch

        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state["lora"].items():
                params[name].copy_(value)
            self.mask_delta.copy_(state["mask_delta"])


def load_draft(gguf_path: str | Path, threads: int = 1):
    """The draft GGUF as a float32 transformers model (dequantised; ~30 s for the 0.5B draft)."""
    require()
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(max(1, threads))
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = Path(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.config.use_cache = False
    return model
