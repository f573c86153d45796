"""The registry's entries as frozen dataclasses: models (a Hugging Face file or a bundled one), pairs,
and the ``Registry`` holding them (``registry_file.py`` parses models.toml into them, ``registry.py``
loads the built-in file and the user's)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import ModelNotFoundError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
SHA256_RE = re.compile(r"[0-9a-fA-F]{64}")
BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")

ParamValue = str | int | float | bool


@dataclass(frozen=True)
class HfSource:
    """A file in a Hugging Face repository."""

    repo: str  # "owner/name"
    file: str  # path of the .gguf inside the repo
    revision: str = "main"  # branch, tag or commit


@dataclass(frozen=True)
class BundledSource:
    """A GGUF split into chunks shipped as pip packages ``<package_prefix>1`` … ``<package_prefix>N``."""

    package_prefix: str  # pip distribution name without the part number
    module_prefix: str  # importable module name without the part number
    count: int  # number of parts
    version: str  # exact version of every part package

    def packages(self) -> list[str]:
        return [f"{self.package_prefix}{i}" for i in range(1, self.count + 1)]

    def module(self, index: int) -> str:
        return f"{self.module_prefix}{index}"

    @staticmethod
    def part_file(index: int) -> str:
        """Path of chunk ``index`` (1-based) inside its module."""
        return f"data/part{index:02d}.bin"


@dataclass(frozen=True)
class ModelSpec:
    name: str  # also the installed file name: <name>.gguf
    tokenizer: str  # tokenizer family; a pair's target and draft share it
    quant: str  # quantisation, e.g. "Q4_K_M"
    source: HfSource | BundledSource
    size: int | None = None  # bytes; always known for bundled models
    sha256: str | None = None  # lower-case hex; always known for bundled models
    origin: str = ""  # the models.toml that defined (or last overrode) this entry

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"

    @property
    def bundled(self) -> bool:
        return isinstance(self.source, BundledSource)

    def describe_source(self) -> str:
        if isinstance(self.source, HfSource):
            rev = "" if self.source.revision == "main" else f"@{self.source.revision}"
            return f"hf:{self.source.repo}/{self.source.file}{rev}"
        return f"bundled:{self.source.package_prefix}1..{self.source.count}=={self.source.version}"


@dataclass(frozen=True)
class PairSpec:
    name: str
    target: ModelSpec
    draft: ModelSpec
    strategy: str  # recommended drafting strategy, e.g. "chain"
    budget: int  # recommended draft tokens per step
    params: Mapping[str, ParamValue] = field(default_factory=lambda: MappingProxyType({}))
    origin: str = ""
    rpc: tuple[str, ...] = ()  # llama.cpp RPC servers (HOST:PORT) for the target's layers (--rpc)
    tensor_split: tuple[float, ...] = ()  # the target's share per device (--tensor-split)


@dataclass(frozen=True)
class Registry:
    models: Mapping[str, ModelSpec]
    pairs: Mapping[str, PairSpec]
    default_pair_name: str
    files: tuple[str, ...]  # the files this registry was read from, built-in first

    @property
    def default_pair(self) -> PairSpec:
        return self.pairs[self.default_pair_name]

    def model(self, name: str) -> ModelSpec:
        if name in self.models:
            return self.models[name]
        raise ModelNotFoundError(self._unknown_model(name))

    def pair(self, name: str) -> PairSpec:
        if name in self.pairs:
            return self.pairs[name]
        raise ModelNotFoundError(f"unknown pair '{name}'.{suggest(name, self.pairs)}{LIST_HINT}")

    def role(self, name: str) -> str:
        """'target', 'draft' or 'both' according to the pairs naming this model; '' if none does."""
        as_target = any(p.target.name == name for p in self.pairs.values())
        as_draft = any(p.draft.name == name for p in self.pairs.values())
        return {(True, True): "both", (True, False): "target", (False, True): "draft"}.get(
            (as_target, as_draft), ""
        )

    def resolve_model(self, name_or_path: str | Path) -> ModelSpec | Path:
        """A registry model by name, or a local .gguf file (returned as a Path, unchanged)."""
        text = str(name_or_path)
        if isinstance(name_or_path, str) and text in self.models:
            return self.models[text]
        if isinstance(name_or_path, Path) or looks_like_path(text):
            path = Path(text).expanduser()
            if not path.is_file():
                raise ModelNotFoundError(f"no such model file: {path}. Check the path, or give a model name.")
            return path
        raise ModelNotFoundError(f"{self._unknown_model(text)} A path to a local .gguf file also works.")

    def _unknown_model(self, name: str) -> str:
        if name in self.pairs:
            pair = self.pairs[name]
            return (
                f"'{name}' is a pair, not a model: its models are {pair.target.name} and {pair.draft.name}."
            )
        return f"unknown model '{name}'.{suggest(name, self.models)}{LIST_HINT}"


LIST_HINT = " See `edgespec models list` for known names."


def looks_like_path(text: str) -> bool:
    return text.endswith(".gguf") or "/" in text or "\\" in text or text.startswith(("~", "."))


def suggest(name: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    return f" Did you mean: {', '.join(close)}?" if close else ""
