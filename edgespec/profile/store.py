"""Where the profiles of a pair live: what identifies the machine, the build and the model files, and
the JSON files keyed by them in ``<data home>/profiles/`` (written whole or not at all)."""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

from ..models.paths import home_dir
from ..models.store import model_identity


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def llama_version() -> str:
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - not installed, or an odd install: the key just says so
        return "unknown"


def file_key(runner) -> dict:
    """A loaded model's file: its sha256 from the store's record, else path, size and mtime."""
    ident = model_identity(str(runner.model.path))
    if ident["sha256"]:
        return {"sha256": ident["sha256"]}
    return {k: ident[k] for k in ("path", "size", "mtime_ns")}


def profile_path(key: dict, home: Path | None = None, kind: str = "costs") -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return (home or home_dir()) / "profiles" / f"{kind}-{digest}.json"


def write_json(path: Path, data: dict) -> Path:
    """Write ``data`` to ``path`` whole or not at all (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (tmp := path.with_suffix(".tmp")).write_text(json.dumps(data, indent=1))
    return tmp.replace(path)
