"""The maintainers' scripts in scripts/ that no other test runs: each is a thin entry point, run as a user
would run it (install_llama.py: test_native_safety; build_binary.py: scripts/test.sh and test_binary;
randomgguf.py's functions: test_randomgguf; the GPU kit: test_gpukit; the page: test_benchmarks_page)."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def test_scripts_folder_stays_small():
    entries = [p for p in SCRIPTS.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 10  # scripts/gpu/ counts as one


def test_ship_parallel_drafter_copies_a_trained_adapter_with_its_record(tmp_path, monkeypatch):
    from edgespec.models import drafters
    from edgespec.models.paths import sha256_file

    work, dest = tmp_path / "work", tmp_path / "shipped"
    work.mkdir()
    (work / "a.gguf").write_bytes(b"adapter bytes")
    (work / "loss.csv").write_text("step,wall_seconds,loss\n1,2.0,9.5\n")
    record = {
        "target": "t.gguf", "draft": "d.gguf", "prompts": 3, "data": {"records": 3},
        "train": {"steps": 1, "settings": {"k": 2, "mask_ids": [7, 8]}},
        "adapter": {"path": str(work / "a.gguf"), "sha256": sha256_file(work / "a.gguf"),
                    "base_sha256": "ab"},
    }
    (work / "record.json").write_text(json.dumps(record))
    monkeypatch.setattr(drafters, "shipped_dir", lambda: dest)  # never the package's own data
    argv = ["ship_parallel_drafter.py", str(work), "d.k2", "edgespec train parallel"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(SCRIPTS / "ship_parallel_drafter.py"), run_name="__main__")
    shipped = json.loads((dest / "d.k2.json").read_text())
    assert (dest / "d.k2.gguf").read_bytes() == b"adapter bytes"
    assert shipped["command"] == "edgespec train parallel" and shipped["base_sha256"] == "ab"


def test_randomgguf_runs_as_a_script():
    """The GPU kit's pack.sh runs it by path (no `import`): its command line must work that way."""
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "randomgguf.py"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--like" in out and "--tokenizer-from" in out
