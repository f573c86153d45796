"""The model store: installed GGUF files under ``<home>/models``.

- ``<home>/models/<name>.gguf`` is an installed model. Files only appear there by an atomic rename
  after their sha256 was checked, so a half-written file never looks installed.
- ``<home>/models/.partial/`` holds assemblies and downloads in progress (downloads resume from there).
- ``<home>/models/<name>.gguf.verified.json`` records the file's sha256 and the size and mtime it had
  when last hashed: ``models list`` trusts it while the file is unchanged; ``verify`` always rehashes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG

from ..errors import ModelStoreError
from . import bundled, download
from .paths import ProgressCallback, format_bytes, home_dir, require_free_space, sha256_file
from .registry import load_registry
from .reporting import Reporter, reporter, tee
from .specs import SHA256_RE, ModelSpec, PairSpec, Registry, looks_like_path

OK, CORRUPTED, MISSING, UNKNOWN = "OK", "CORRUPTED", "MISSING", "UNKNOWN"
_Fetched = tuple[Path, str, str | None]  # (partial file, its sha256, the sha256 it must have)


@dataclass(frozen=True)
class VerifyResult:
    name: str
    path: Path
    status: str  # OK | CORRUPTED | MISSING | UNKNOWN (no reference hash; the current one is now recorded)
    expected_sha256: str | None = None
    actual_sha256: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in (OK, UNKNOWN)

    def describe(self) -> str:
        if self.status == CORRUPTED:
            return (
                f"{self.path}: sha256 {self.actual_sha256}, expected {self.expected_sha256}. "
                f"Remove it (`edgespec models rm {self.name}`) and pull it again."
            )
        if self.status == MISSING:
            return f"{self.path}: not installed (`edgespec models pull {self.name}`)"
        if self.status == UNKNOWN:
            return f"{self.path}: no reference sha256 to compare with; recorded {self.actual_sha256}"
        return str(self.path)


@dataclass(frozen=True)
class ModelStatus:
    """One row of ``edgespec models list``."""

    spec: ModelSpec
    role: str  # target | draft | both | ''
    path: Path
    installed: bool
    verified: bool  # hashed and matching since the file last changed

    @property
    def size(self) -> int | None:
        return self.path.stat().st_size if self.installed else self.spec.size


class ModelStore:
    """Installed models, and the means to install (assemble or download), verify and remove them."""

    def __init__(self, home: Path | str | None = None, registry: Registry | None = None):
        self.home = Path(home) if home is not None else home_dir()
        self.registry = registry or load_registry()
        self.models_dir = self.home / "models"
        self.partial_dir = self.models_dir / ".partial"

    # --- lookups ---------------------------------------------------------------------------------

    def path_for(self, name: str | Path) -> Path:
        """Where model ``name`` is (or would be) installed; a local .gguf path is returned as is."""
        resolved = self.registry.resolve_model(name)
        return resolved if isinstance(resolved, Path) else self.models_dir / resolved.filename

    def is_installed(self, name: str) -> bool:
        return self.path_for(name).is_file()

    def is_verified(self, name: str) -> bool:
        """True when the file was hashed, matched, and has not changed since (no rehash here)."""
        spec = self.registry.model(name)
        path = self.path_for(name)
        record = self._record(name)
        if record is None or not path.is_file() or record.get("mtime_ns") is None:
            return False
        stat = path.stat()
        unchanged = record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns
        return unchanged and (spec.sha256 is None or record.get("sha256") == spec.sha256)

    def status(self, name: str) -> ModelStatus:
        path = self.path_for(name)
        return ModelStatus(
            spec=self.registry.model(name),
            role=self.registry.role(name),
            path=path,
            installed=path.is_file(),
            verified=self.is_verified(name),
        )

    def statuses(self) -> list[ModelStatus]:
        return [self.status(name) for name in self.registry.models]

    # --- installing ------------------------------------------------------------------------------

    def ensure(
        self, name_or_path: str | Path, progress: bool = True, on_progress: ProgressCallback | None = None
    ) -> Path:
        """Path of an installed model: local files as is, bundled models assembled on first use.

        Hugging Face models are never downloaded implicitly: pulling gigabytes is the user's call.
        """
        resolved = self.registry.resolve_model(name_or_path)
        if isinstance(resolved, Path):
            return self.check_unchanged(resolved, str(resolved), None, progress, on_progress)
        path = self.models_dir / resolved.filename
        if path.is_file():
            return self.check_unchanged(path, resolved.name, resolved.sha256, progress, on_progress)
        if resolved.bundled:
            return self._install(resolved, progress, on_progress)
        size = f" ({format_bytes(resolved.size)})" if resolved.size else ""
        raise ModelStoreError(
            f"model '{resolved.name}' is not installed. Download it{size} with: "
            f"edgespec models pull {resolved.name}"
        )

    def ensure_pair(
        self, pair_name: str | None = None, progress: bool = True, on_progress: ProgressCallback | None = None
    ) -> tuple[Path, Path, PairSpec]:
        """(target path, draft path, pair) for ``pair_name`` or the default pair; installs bundled models."""
        pair = self.registry.pair(pair_name) if pair_name else self.registry.default_pair
        target = self.ensure(pair.target.name, progress, on_progress)
        draft = self.ensure(pair.draft.name, progress, on_progress)
        return target, draft, pair

    def pull(
        self, name_or_pair: str, progress: bool = True, on_progress: ProgressCallback | None = None
    ) -> list[Path]:
        """Install a model, or both models of a pair, from its source; installed ones are kept as they are."""
        specs = self._specs(name_or_pair)
        return [
            self.models_dir / spec.filename
            if self.is_installed(spec.name)
            else self._install(spec, progress, on_progress)
            for spec in specs
        ]

    def _specs(self, name_or_pair: str) -> list[ModelSpec]:
        if name_or_pair in self.registry.pairs:
            pair = self.registry.pairs[name_or_pair]
            return [pair.target, pair.draft]
        return [self.registry.model(name_or_pair)]

    def _install(self, spec: ModelSpec, progress: bool, on_progress: ProgressCallback | None) -> Path:
        """Assemble or download into .partial/, check the sha256, then rename into place."""
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        with reporter(progress) as report:
            fetch = self._assemble if spec.bundled else self._download
            partial, sha, expected = fetch(spec, report, on_progress)
        return self._move_into_place(spec, partial, sha, expected)

    def _assemble(self, spec: ModelSpec, report: Reporter, on_progress: ProgressCallback | None) -> _Fetched:
        partial = self.partial_dir / f"{spec.filename}.part"
        require_free_space(self.models_dir, spec.size or 0, f"'{spec.name}'")
        try:
            sha = bundled.assemble(spec, partial, tee(report(f"assemble {spec.name}"), on_progress))
        except BaseException:
            partial.unlink(missing_ok=True)  # a fresh assembly is cheap: never keep a torn one
            raise
        return partial, sha, spec.sha256

    def _download(self, spec: ModelSpec, report: Reporter, on_progress: ProgressCallback | None) -> _Fetched:
        fetched = download.fetch(spec, self.partial_dir, tee(report(f"download {spec.name}"), on_progress))
        sha = sha256_file(fetched.path, report(f"check sha256 of {spec.name}"))
        return fetched.path, sha, fetched.expected_sha256

    def _move_into_place(self, spec: ModelSpec, partial: Path, sha: str, expected: str | None) -> Path:
        if expected is not None and sha != expected:
            partial.unlink(missing_ok=True)
            raise ModelStoreError(
                f"sha256 mismatch for '{spec.name}' ({spec.describe_source()}): expected {expected}, "
                f"got {sha}. The partial file {partial} was removed and nothing was installed. "
                f"Run `edgespec models pull {spec.name}` again; if it fails the same way, check `sha256` "
                f"in {spec.origin}."
            )
        path = self.models_dir / spec.filename
        os.replace(partial, path)
        self._write_record(spec.name, sha, verified=True)
        return path

    # --- verifying and removing ------------------------------------------------------------------

    def check_unchanged(
        self,
        path: Path,
        name: str,
        expected: str | None,
        progress: bool = True,
        on_progress: ProgressCallback | None = None,
    ) -> Path:
        """``path`` if it is still the file the store hashed: a model with a record (pulled or verified)
        whose size or mtime changed since, or whose last verify failed, is hashed again (with
        progress) and refused unless it matches. A model whose record is missing or unreadable is
        hashed again too when models.toml gives its sha256 (``expected``), and a fresh record written
        when it matches. A file with neither a record nor a reference hash is taken as it is."""
        record_path = path.with_name(path.name + ".verified.json")
        record = _read_record(record_path)
        if record is None and expected is None:
            return path
        record = record or {}
        reference = expected or record.get("sha256")
        stat = path.stat()
        same = record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns
        if same and record.get("sha256") == reference:
            return path
        why = "changed since it was verified" if record else "has no verified record"
        with reporter(progress) as report:
            actual = sha256_file(path, tee(report(f"check sha256 of {path.name} ({why})"), on_progress))
        try:
            _write_record_at(record_path, path, reference or actual, verified=actual == reference)
        except OSError:  # a read-only store: the answer stands, it is only not remembered
            pass
        if reference is not None and actual != reference:
            fix = (
                f"Remove it (`edgespec models rm {name}`) and pull it again (`edgespec models pull {name}`)."
                if name in self.registry.models
                else f"Restore the file, or delete {record_path} to use it as it is now."
            )
            raise ModelStoreError(f"{path} {why}: sha256 {actual}, expected {reference}. {fix}")
        return path

    def verify(self, name: str, progress: bool = True) -> VerifyResult:
        """Rehash an installed model and compare with models.toml (or the hash recorded at install)."""
        spec = self.registry.model(name)
        path = self.path_for(name)
        if not path.is_file():
            return VerifyResult(name, path, MISSING, spec.sha256)
        record = self._record(name) or {}
        expected = spec.sha256 or record.get("sha256")
        with reporter(progress) as report:
            actual = sha256_file(path, report(f"verify {name}"))
        if expected is None:
            self._write_record(name, actual, verified=True)
            return VerifyResult(name, path, UNKNOWN, None, actual)
        status = OK if actual == expected else CORRUPTED
        self._write_record(name, expected, verified=status == OK)
        return VerifyResult(name, path, status, expected, actual)

    def remove(self, name: str) -> Path:
        """Delete an installed model (and its record and partial files); returns the removed path."""
        if looks_like_path(name) and name not in self.registry.models:
            raise ModelStoreError(f"{name} is a file path: edgespec only removes models it installed.")
        spec = self.registry.model(name)
        path = self.models_dir / spec.filename
        if not path.is_file():
            raise ModelStoreError(f"model '{name}' is not installed (nothing at {path}).")
        path.unlink()
        self._record_path(name).unlink(missing_ok=True)
        for partial in [self.partial_dir / f"{spec.filename}.part", *self._download_partials(name)]:
            partial.unlink(missing_ok=True)
        return path

    def _download_partials(self, name: str) -> list[Path]:
        return download.partial_files(self.partial_dir, name) if self.partial_dir.is_dir() else []

    # --- verified records ------------------------------------------------------------------------

    def _record_path(self, name: str) -> Path:
        return self.models_dir / f"{name}.gguf.verified.json"

    def _record(self, name: str) -> dict | None:
        return _read_record(self._record_path(name))

    def _write_record(self, name: str, sha256: str, verified: bool) -> None:
        _write_record_at(self._record_path(name), self.models_dir / f"{name}.gguf", sha256, verified)


RECORD_MAX_BYTES = 4096  # a record is ~150 bytes: anything longer is not one the store wrote


def _read_record(path: Path) -> dict | None:
    """The record the store wrote next to a model, or None when there is none or it is not one (junk,
    too large, not a regular file, fields of the wrong type): such a file is ignored, never trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO there must not hang
        with os.fdopen(fd, "rb") as f:
            data = f.read(RECORD_MAX_BYTES + 1) if S_ISREG(os.fstat(fd).st_mode) else b""
        record = json.loads(data) if len(data) <= RECORD_MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not SHA256_RE.fullmatch(str(record.get("sha256"))):
        return None
    size, mtime = record.get("size"), record.get("mtime_ns", 0)
    whole = [isinstance(v, int) and not isinstance(v, bool) for v in (size, 0 if mtime is None else mtime)]
    return record if all(whole) else None


def _write_record_at(record_path: Path, model: Path, sha256: str, verified: bool) -> None:
    """Remember the reference hash; with ``verified``, also the stat it matched (else: unverified)."""
    stat = model.stat()
    record = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns if verified else None}
    tmp = record_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, record_path)


def model_identity(path: str) -> dict:
    """Path, size, mtime, and the sha256 when the store has hashed this exact file (never rehashed here)."""
    p = Path(path)
    try:
        stat = p.stat()
    except OSError:
        return {"path": str(path), "size": None, "mtime_ns": None, "sha256": None}
    sha = None
    record = _read_record(p.with_name(p.name + ".verified.json"))  # written by the store after hashing
    if record is not None and record["size"] == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns:
        sha = record["sha256"]
    return {"path": str(p), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha}
