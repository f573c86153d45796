"""Training a ParallelSpec parallel drafter (issue 13): self-distillation data, group-wise parallel
training of the draft with LoRA, and export as a GGUF LoRA adapter.

``prompts``, ``groups``, ``distill``, and ``export`` work without the ``train`` extra
(torch, transformers, peft); the stages that need it call :func:`edgespec.train.deps.require` first,
which names the extra to install when something is missing.
"""
