"""The ``train`` extra (torch, transformers, peft), imported late with a clear error when missing."""

from __future__ import annotations

from ..errors import EdgespecError

INSTALL_HINT = "pip install 'edgespec[train]'"


def require() -> None:
    """Raise an ``EdgespecError`` naming the install command when the training stack is missing."""
    missing = []
    for module in ("torch", "transformers", "peft"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise EdgespecError(
            f"training needs {', '.join(missing)} (not installed). Install the training extra: {INSTALL_HINT}"
        )
