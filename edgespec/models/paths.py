"""Where edgespec keeps its files, and the small file helpers the model store needs.

- data home: ``$EDGESPEC_HOME`` or the platform's user data dir; model files live in ``<home>/models``.
- config dir: ``$EDGESPEC_CONFIG`` or the platform's user config dir; the user's ``models.toml`` lives there.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import platformdirs

from ..errors import ModelStoreError

APP_NAME = "edgespec"
HASH_CHUNK = 4 * 1024 * 1024  # bytes read per step when hashing

ProgressCallback = Callable[[int, int], None]  # (done_bytes, total_bytes)


def home_dir() -> Path:
    """The data home (models, partial downloads)."""
    return Path(os.environ.get("EDGESPEC_HOME") or platformdirs.user_data_dir(APP_NAME))


def config_dir() -> Path:
    """The directory holding the user's configuration (``models.toml``)."""
    return Path(os.environ.get("EDGESPEC_CONFIG") or platformdirs.user_config_dir(APP_NAME))


def decision_model_path(pair_name: str) -> Path:
    """Where `edgespec tune` stores the pair's decision model (and where ``--early-stop model`` looks)."""
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", pair_name)
    return home_dir() / "decision-models" / f"{safe}.npz"


def advice_path(home: Path | None = None) -> Path:
    """Where `edgespec models advise` caches its last advice (the chat's first-run hint reads it)."""
    return (home or home_dir()) / "advice.json"


def user_registry_path() -> Path:
    return config_dir() / "models.toml"


def sha256_file(path: Path, on_progress: ProgressCallback | None = None) -> str:
    """Hex sha256 of a file, streamed in chunks; reports bytes hashed so far."""
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if on_progress:
                on_progress(done, total)
    return digest.hexdigest()


def require_free_space(directory: Path, needed: int, what: str) -> None:
    """Raise if ``directory``'s file system has fewer than ``needed`` free bytes."""
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise ModelStoreError(
            f"not enough disk space for {what}: it needs {format_bytes(needed)} in {directory} but only "
            f"{format_bytes(free)} is free. Free some space, or point EDGESPEC_HOME at a disk with more room."
        )


def format_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} TiB"
