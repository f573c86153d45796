"""Errors users see. Every message says what happened and what to do about it."""


class EdgespecError(Exception):
    """Base class: the CLI and the TUI print these without a traceback."""


class RegistryError(EdgespecError):
    """models.toml (or the user's override file) is malformed."""


class ModelNotFoundError(EdgespecError):
    """A model or pair name that is neither in the registry nor a local .gguf file."""


class ModelStoreError(EdgespecError):
    """Download, assembly, verification or removal of a model file failed."""


class EngineError(EdgespecError):
    """llama.cpp refused an operation (load, decode, KV bookkeeping)."""


class PairingError(EdgespecError):
    """Target and draft do not share a tokenizer."""


class ContextFullError(EdgespecError):
    """The conversation no longer fits the context window."""


class PromptError(EdgespecError):
    """A prompt this model cannot take: fill in the middle without FIM tokens, token ids out of range."""
