"""Training a ParallelSpec parallel drafter (issue 13): self-distillation data, group-wise parallel
training of the draft with LoRA, and export as a GGUF LoRA adapter.

Only ``prompts``, ``groups`` and ``distill`` work without the ``train`` extra; the modules that need
torch import it through :func:`edgespec.train.deps.torch` (a clear error when it is missing).
"""
