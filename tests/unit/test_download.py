"""Hugging Face downloads through the real huggingface_hub client, against a local hub stand-in."""

from __future__ import annotations

import hashlib
import json
import random
import socket

import pytest
from huggingface_hub import constants as hf_constants

from edgespec.errors import ModelStoreError
from edgespec.models.paths import format_bytes
from edgespec.models.store import ModelStore
from tests.support.hubserver import HubServer

REPO = "test/tiny-GGUF"
DATA = random.Random(0).randbytes(300_000)
CORRUPT = bytes([DATA[0] ^ 1]) + DATA[1:]  # one bit flipped
CHUNK = hf_constants.DOWNLOAD_CHUNK_SIZE  # huggingface_hub writes the body to disk in pieces this big
BIG = random.Random(1).randbytes(CHUNK + 200_000)  # one piece on disk before a cut, then the rest


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def register_tiny(env, sha: str | None, file: str = "tiny.gguf", repo: str = REPO) -> None:
    sha_line = f'sha256 = "{sha}"\n' if sha else ""
    source = f'hf = {{ repo = "{repo}", file = "{file}" }}\n'
    env.write_registry(f'[models.tiny]\ntokenizer = "toy"\nquant = "Q8_0"\n{sha_line}{source}')


@pytest.fixture
def hub(edgespec_env, monkeypatch):
    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def nothing_installed(store: ModelStore) -> bool:
    """No model file, and no partial download left behind either."""
    partials = list(store.partial_dir.iterdir()) if store.partial_dir.exists() else []
    return not store.is_installed("tiny") and not partials


def test_pull_downloads_checks_and_installs(hub, edgespec_env):
    hub.add(REPO, "tiny.gguf", DATA)
    register_tiny(edgespec_env, sha256(DATA))
    store = ModelStore()
    reports = []
    [path] = store.pull("tiny", progress=False, on_progress=lambda done, total: reports.append((done, total)))
    assert path == edgespec_env.home / "models" / "tiny.gguf"
    assert path.read_bytes() == DATA
    assert reports[-1] == (len(DATA), len(DATA))
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)
    assert store.is_verified("tiny")
    assert list(store.partial_dir.iterdir()) == []
    assert [(s.method, s.range) for s in hub.seen] == [("HEAD", None), ("GET", None)]


def test_pull_shows_a_progress_bar_on_stderr(hub, edgespec_env, capsys):
    hub.add(REPO, "tiny.gguf", DATA)
    register_tiny(edgespec_env, sha256(DATA))
    ModelStore().pull("tiny")
    assert "download tiny" in capsys.readouterr().err


def test_a_log_gets_a_downloads_start_and_end_as_lines(hub, edgespec_env, capsys):
    """stderr is not a terminal here (a Docker or CI log): a bar would show nothing until the end."""
    hub.add(REPO, "tiny.gguf", DATA)
    register_tiny(edgespec_env, sha256(DATA))
    ModelStore().pull("tiny")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("download tiny: ")]
    size = format_bytes(len(DATA))
    assert lines[0].startswith("download tiny: 0 B of ") or lines[0].startswith(f"download tiny: {size} of ")
    assert lines[-1].startswith(f"download tiny: {size} of {size} (")
    assert len(lines) <= 3  # start, end, and one line per LOG_EVERY_S between


def test_the_hubs_sha256_is_checked_when_models_toml_has_none(hub, edgespec_env):
    hub.add(REPO, "tiny.gguf", CORRUPT, advertised_sha256=sha256(DATA))
    register_tiny(edgespec_env, sha=None)
    store = ModelStore()
    with pytest.raises(ModelStoreError, match=f"expected {sha256(DATA)}"):
        store.pull("tiny", progress=False)
    assert nothing_installed(store)


def test_without_any_reference_the_hash_is_recorded_at_download(hub, edgespec_env):
    hub.add(REPO, "tiny.gguf", DATA, lfs=False)  # small non-LFS files report a git blob id, not a sha256
    register_tiny(edgespec_env, sha=None)
    store = ModelStore()
    store.pull("tiny", progress=False)
    assert store.is_verified("tiny")
    result = store.verify("tiny", progress=False)
    assert (result.status, result.expected_sha256) == ("OK", sha256(DATA))


def test_a_dropped_connection_is_resumed_with_a_range_request(hub, edgespec_env):
    hub.add(REPO, "tiny.gguf", BIG, drop_after=CHUNK + 50_000)
    register_tiny(edgespec_env, sha256(BIG))
    [path] = ModelStore().pull("tiny", progress=False)
    first, second = hub.gets()
    assert first.range is None and first.body_bytes == CHUNK + 50_000
    assert second.range == f"bytes={CHUNK}-"
    assert second.body_bytes == len(BIG) - CHUNK  # only what was missing
    assert path.read_bytes() == BIG


def test_an_interrupted_pull_resumes_on_the_next_pull(hub, edgespec_env, models_cli, capsys):
    hub.add(REPO, "tiny.gguf", BIG)
    register_tiny(edgespec_env, sha256(BIG))
    store = ModelStore()

    def interrupt_after_first_piece(done: int, total: int) -> None:
        if done > CHUNK:
            raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-download

    with pytest.raises(KeyboardInterrupt):
        store.pull("tiny", progress=False, on_progress=interrupt_after_first_piece)
    assert not store.is_installed("tiny")
    assert [p.stat().st_size for p in store.partial_dir.iterdir()] == [CHUNK]
    capsys.readouterr()
    assert models_cli("list", "--json") == 0
    [tiny] = [row for row in json.loads(capsys.readouterr().out) if row["name"] == "tiny"]
    assert tiny["installed"] is False and tiny["verified"] is False

    [path] = store.pull("tiny", progress=False)
    resumed = hub.gets()[-1]
    assert resumed.range == f"bytes={CHUNK}-"
    assert resumed.body_bytes == len(BIG) - CHUNK
    assert path.read_bytes() == BIG
    assert list(store.partial_dir.iterdir()) == []


def test_a_sha256_mismatch_installs_nothing_and_keeps_no_partial(hub, edgespec_env, models_cli, capsys):
    hub.add(REPO, "tiny.gguf", CORRUPT, advertised_sha256=sha256(DATA))  # the bytes do not match the claim
    register_tiny(edgespec_env, sha256(DATA))
    store = ModelStore()
    with pytest.raises(ModelStoreError) as caught:
        store.pull("tiny", progress=False)
    message = str(caught.value)
    assert "sha256 mismatch for 'tiny'" in message
    assert f"expected {sha256(DATA)}, got {sha256(CORRUPT)}" in message
    assert "tiny.gguf" in message and "was removed" in message
    assert nothing_installed(store)
    assert models_cli("list", "--json") == 0
    [tiny] = [row for row in json.loads(capsys.readouterr().out) if row["name"] == "tiny"]
    assert tiny["installed"] is False


def test_a_changed_upstream_file_is_refused_before_downloading(hub, edgespec_env):
    hub.add(REPO, "tiny.gguf", DATA)
    register_tiny(edgespec_env, "0" * 64)
    store = ModelStore()
    with pytest.raises(ModelStoreError, match="changed upstream. Nothing was downloaded. Pin `revision`"):
        store.pull("tiny", progress=False)
    assert hub.gets() == []
    assert nothing_installed(store)


def test_a_missing_file_names_repo_file_and_registry_entry(hub, edgespec_env):
    hub.add(REPO, "tiny.gguf", DATA)
    register_tiny(edgespec_env, None, file="tiny-q9.gguf")
    with pytest.raises(ModelStoreError) as caught:
        ModelStore().pull("tiny", progress=False)
    assert str(caught.value) == (
        f"file not found on the hub: repo '{REPO}', file 'tiny-q9.gguf', revision 'main'. "
        f'Check [models."tiny"] in {edgespec_env.user_registry}.'
    )


def test_a_missing_repository_is_reported_as_such(hub, edgespec_env):
    register_tiny(edgespec_env, None, repo="test/nope-GGUF")
    with pytest.raises(ModelStoreError, match="repository not found on the hub: repo 'test/nope-GGUF'"):
        ModelStore().pull("tiny", progress=False)


def test_an_unreachable_hub_says_what_to_do(edgespec_env, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    register_tiny(edgespec_env, None)
    store = ModelStore()
    with pytest.raises(ModelStoreError) as caught:
        store.pull("tiny", progress=False)
    message = str(caught.value)
    assert f"cannot reach the Hugging Face hub at {endpoint}" in message
    assert "HF_ENDPOINT" in message
    assert "edgespec models pull qwen2.5-coder-1.5b+0.5b" in message
    assert "local .gguf file" in message
    assert nothing_installed(store)


def test_disk_space_is_checked_before_downloading(hub, edgespec_env):
    hub.add(REPO, "tiny.gguf", DATA, advertised_size=2**60)
    register_tiny(edgespec_env, None)
    store = ModelStore()
    with pytest.raises(ModelStoreError, match="not enough disk space for 'tiny': it needs 1048576.0 TiB"):
        store.pull("tiny", progress=False)
    assert hub.gets() == []
    assert nothing_installed(store)


def test_ensure_never_downloads_implicitly(hub, edgespec_env):
    hub.add(REPO, "tiny.gguf", DATA)
    register_tiny(edgespec_env, sha256(DATA))
    with pytest.raises(ModelStoreError, match="not installed. Download it with: edgespec models pull tiny"):
        ModelStore().ensure("tiny", progress=False)
    assert hub.seen == []


def test_models_pull_command(hub, edgespec_env, models_cli, capsys):
    hub.add(REPO, "tiny.gguf", DATA)
    register_tiny(edgespec_env, sha256(DATA))
    assert models_cli("pull", "tiny") == 0
    assert models_cli("pull", "tiny") == 0
    out = capsys.readouterr().out.splitlines()
    path = edgespec_env.home / "models" / "tiny.gguf"
    assert out == [f"tiny: installed at {path}", f"tiny: already installed at {path}"]
    assert len(hub.gets()) == 1
