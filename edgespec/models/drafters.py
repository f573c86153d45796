"""Trained parallel drafters shipped in the package (``edgespec/data/parallelspec/``), torch-free.

Each adapter GGUF has a JSON record next to it: the adapter's sha256, the sha256 of the draft GGUF it
was trained on, K and the mask ids, and how it was trained (data size, steps, wall time, loss curve).
``shipped_adapter(base_sha256)`` finds the one for a draft and checks the file against its record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import EdgespecError
from .paths import sha256_file


@dataclass(frozen=True)
class ShippedAdapter:
    path: Path
    sha256: str
    base_sha256: str
    k: int
    mask_ids: tuple[int, ...]
    record: dict


def shipped_dir() -> Path:
    return Path(str(resources.files("edgespec") / "data" / "parallelspec"))


def shipped_adapters(directory: Path | None = None) -> list[ShippedAdapter]:
    """Every adapter with a record in ``directory`` (default: the package's)."""
    directory = directory or shipped_dir()
    found = []
    for record_path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        record = json.loads(record_path.read_text())
        found.append(ShippedAdapter(
            path=directory / record["adapter"], sha256=record["sha256"], base_sha256=record["base_sha256"],
            k=int(record["k"]), mask_ids=tuple(int(i) for i in record["mask_ids"]), record=record,
        ))
    return found


def shipped_adapter(
    base_sha256: str, directory: Path | None = None, check: bool = True
) -> ShippedAdapter | None:
    """The shipped adapter trained on the draft whose GGUF has ``base_sha256``; None when there is none.

    With ``check`` the adapter file is hashed (a few MB) and must match its record."""
    for adapter in shipped_adapters(directory):
        if adapter.base_sha256 != base_sha256:
            continue
        if check and (not adapter.path.is_file() or sha256_file(adapter.path) != adapter.sha256):
            raise EdgespecError(
                f"the shipped parallel drafter {adapter.path} is missing or does not match its sha256 "
                f"{adapter.sha256}: reinstall edgespec, or train one with `edgespec train parallel`."
            )
        return adapter
    return None
