"""The model registry: ``models.toml`` parsed into frozen dataclasses and validated at load.

The built-in file ships inside the package (``edgespec/data/models.toml``); the user's file
(``<config dir>/models.toml``) may add entries or override keys of built-in ones. Every problem is
reported as a ``RegistryError`` naming the file, the entry and the fix.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..errors import RegistryError
from .paths import user_registry_path
from .registry_file import RawRegistry, read_toml
from .specs import ModelSpec, Registry


def resolve_model(name_or_path: str | Path, registry: Registry | None = None) -> ModelSpec | Path:
    """``load_registry().resolve_model(name_or_path)``, reusing ``registry`` when given."""
    return (registry or load_registry()).resolve_model(name_or_path)


# --- loading -------------------------------------------------------------------------------------


def builtin_registry_file() -> str:
    """Path of the registry shipped with the package (the repo's models.toml in a checkout)."""
    resource = resources.files("edgespec").joinpath("data/models.toml")
    return str(Path(str(resource)).resolve())


def load_registry(user_file: Path | None = None) -> Registry:
    """Built-in registry merged with the user's file (default: ``<config dir>/models.toml``)."""
    builtin = builtin_registry_file()
    raw = RawRegistry()
    raw.add(builtin, read_toml(builtin))
    user = user_file or user_registry_path()
    if user.is_file():
        raw.add(str(user), read_toml(str(user)))
    elif user.exists():  # a folder, a FIFO …: not silently ignored (nor read: a FIFO would hang)
        raise RegistryError(f"{user}: not a regular file. Move it away, or make it the models.toml file.")
    return raw.build()
