"""The prepared GPU device check (scripts/gpu/check.sh) in its ``DRY=1`` mode: every stage's logic on the
CPU with tiny random models, each writing its result; and the verify-row check it relies on catches a
token that is not its row's argmax."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edgespec.engine.ports import Joined
from edgespec.engine.rows import RowsVerified
from tests.support.scripts import load

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("sanity", "lossless", "auto", "sampling", "curves", "binary")


@pytest.mark.slow  # 1-2 minutes on 2 cores: the full suite only
def test_dry_run_writes_every_stage_and_each_passes(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {
        **os.environ,
        "DRY": "1",
        "OUT": str(out),
        "WORK": str(work),
        "PYTHON": sys.executable,
        "BINARY": f"{sys.executable} -m edgespec",
    }
    done = subprocess.run(
        ["bash", "scripts/gpu/check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    results = {}
    for stage in STAGES:
        assert (out / stage / "summary.md").read_text().startswith(f"# {stage}: ")
        results[stage] = json.loads((out / stage / "result.json").read_text())
    failed = {s: r.get("error") or r.get("failures") for s, r in results.items() if not r["ok"]}
    assert not failed and done.returncode == 0, (failed, done.stdout[-3000:])
    lossless = results["lossless"]
    assert {c["pair"] for c in lossless["cases"]} == {"draft≠target", "draft=target"}
    assert {c["flash_attn"] for c in lossless["cases"]} == {True, False}
    assert {"chain", "dyspec", "auto"} <= {c["strategy"] for c in lossless["cases"]}
    assert lossless["rows_checked"] > 100  # the argmax check read the verify rows
    assert {c["reductions"] for c in lossless["cases"]} == {"numpy", "backend"}
    assert results["auto"]["runs"]["plain"]["tokens"] and results["auto"]["auto_over_plain"] > 0
    assert results["sampling"]["chain"]["same_tokens"]
    assert [r["target_gpu_layers"] for r in results["curves"]["results"]] == [-1, 1]  # full and half of 2
    assert results["binary"]["answer"]["tokens"]


def test_a_token_that_is_not_its_rows_argmax_is_counted():
    check = load("rowcheck")
    rows = np.zeros((3, 8), dtype=np.float32)
    rows[0, 5], rows[1, 2], rows[2, 7] = 1.0, 1.0, 1.0  # argmax: node 0 → 5, node 1 → 2, node 2 → 7

    def step(emitted: list[int]) -> SimpleNamespace:
        return SimpleNamespace(accepted_path=(0, 1, 2), tokens=[SimpleNamespace(id=t) for t in emitted])

    assert check.argmax_errors(step([5, 2, 7]), RowsVerified(rows)) == (3, 0)
    assert check.argmax_errors(step([5, 3, 7]), RowsVerified(rows)) == (3, 1)
    # after mcsd's root decode: node 0 is the root's own row, node i the batch's row i − 1
    joined = Joined(RowsVerified(rows[:1]), RowsVerified(rows[1:]))
    assert check.argmax_errors(step([5, 2, 7]), joined) == (3, 0)
    assert check.argmax_errors(step([5, 2, 6]), joined) == (3, 1)
    assert check.argmax_errors(step([5]), object()) == (0, 0)  # rows not kept: nothing to check


def test_the_carry_holds_every_package_the_check_imports():
    """What `import check` loads beyond the standard library is numpy, llama_cpp (the kit's py/) or a
    package pack.sh copies into the kit's site/: the GPU machine has no package registry."""
    listing = "import sys, check; print(*{m.split('.')[0] for m in sys.modules} - sys.stdlib_module_names)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("", "scripts/gpu", "scripts"))}
    done = subprocess.run([sys.executable, "-c", listing], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    packed = re.search(r"for pkg in (.*?); do", (ROOT / "scripts/gpu/pack.sh").read_text(), re.S).group(1)
    allowed = {p.removesuffix(".py") for p in packed.replace("\\", " ").split()}
    allowed |= {"numpy", "llama_cpp", "gguf", "edgespec", "randomgguf"}
    allowed |= {p.stem for p in (ROOT / "scripts" / "gpu").glob("*.py")}  # check.py and its siblings
    missing = {m for m in loaded if not m.startswith("_") and not m.startswith("cython")} - allowed
    assert not missing, f"add to scripts/gpu/pack.sh's site packages: {sorted(missing)}"
