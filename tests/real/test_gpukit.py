"""The GPU kit without a GPU: the speedup prediction (pure), the carry size, and the whole measurement
run end to end on the CPU with tiny random-weight models."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from edgespec.profile.costs import CostProfile
from tests.support.scripts import load

gpu_kit = load("kit")
main, predict = gpu_kit.main, gpu_kit.predict

ROOT = Path(__file__).resolve().parents[2]


def _result(python_ms: float) -> dict:
    curve = {1: 0.010, 2: 0.011, 4: 0.012, 8: 0.013, 16: 0.020, 64: 0.050}  # a GPU-like c_t
    draft = {n: s / 5 for n, s in curve.items()}
    profile = CostProfile(target=curve, draft=draft, catchup=draft)
    return {
        "target": "t",
        "costs": profile.as_dict(),
        "plain": {"tokens_per_second": 100.0, "python_ms_per_step": 0.2},
        "overhead": [{"strategy": "dyspec", "budget": 8, "python_ms_per_step": python_ms}],
    }


def test_predicted_speedup_follows_the_documented_formula():
    acceptance = {
        "dyspec:8": {"mal": 3.0, "verified_per_step": 9.0, "draft_decodes_per_step": 4.0},
        "dyspec:16": {"mal": 4.0, "verified_per_step": 17.0, "draft_decodes_per_step": 5.0},  # not measured
        "auto": {"mal": 1.0, "verified_per_step": 1.0, "draft_decodes_per_step": 0.0},
    }
    result = _result(python_ms=1.0)
    (row,) = predict(result, acceptance)
    costs = CostProfile.from_dict(result["costs"]).model()
    # step = c_t(9) + c_k(1) + (P − 1)·c_d(⌈8/4⌉) + python; plain = 1 / (plain tokens/s)
    step = costs.t(9) + costs.k(1) + 3 * costs.d(2) + 0.001
    assert row["key"] == "dyspec:8" and row["passes"] == 4.0 and row["verified"] == 9
    assert row["speedup"] == pytest.approx(3.0 * (1 / 100.0) / step)
    (slow,) = predict(_result(python_ms=5.0), acceptance)  # Python overhead is paid every step
    assert slow["speedup"] < row["speedup"]


@pytest.mark.slow
@pytest.mark.model
def test_kit_fits_the_64_mib_carry():
    sdist = os.environ.get("EDGESPEC_SDIST")
    if not sdist:
        pytest.skip("set EDGESPEC_SDIST to a llama_cpp_python-*.tar.gz to pack the kit offline")
    out = subprocess.run(
        ["bash", "scripts/gpu/pack.sh", sdist], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    kit = sum(f.stat().st_size for f in (ROOT / "gpu-kit").rglob("*") if f.is_file())
    tree = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    tracked = sum((ROOT / p).stat().st_size for p in tree.decode().split("\0") if p and (ROOT / p).is_file())
    assert "gpu-kit:" in out and kit + tracked < 64 * 2**20


@pytest.mark.model
def test_measurement_runs_end_to_end_on_cpu(tmp_path):
    """The whole run on tiny 1-layer random models (tokenizer from the bundled draft), CPU only."""
    make_gguf = load("randomgguf").main
    from tests.support.realmodels import bundled_paths

    _, draft = bundled_paths()
    tokenizer = tmp_path / "tok.gguf"
    tiny = "--like qwen2.5-0.5b --type Q8_0 --layers 1 --embd 64 --ff 128 --heads 1 --kv-heads 1".split()
    assert make_gguf([*tiny, "--tokenizer-from", draft, "--out", str(tokenizer)]) == 0
    out = tmp_path / "gpu-test.json"
    argv = ["--tokenizer-from", str(tokenizer), "--work", str(tmp_path / "work"), "--out", str(out)]
    argv += "--targets qwen2.5-1.5b --layers 1 --gpu-layers 0 --threads 1 --sizes 1,2,4 --repeats 1".split()
    argv += "--budgets 8 --strategies chain,dyspec --tokens 8".split()
    acceptance = tmp_path / "acceptance.json"  # a bench --json document's results, as the kit reads them
    rows = [("chain", 3.4, 5.0, 4.0), ("dyspec:8", 4.4, 9.0, 4.7), ("auto", 1.0, 1.0, 0.0)]
    results = [
        {"key": k, "mal": m, "verified_per_step": v, "draft_decodes_per_step": d} for k, m, v, d in rows
    ]
    acceptance.write_text(json.dumps({"results": results}))
    argv += ["--acceptance", str(acceptance)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    (result,) = doc["results"]
    assert set(result["costs"]["target"]) == {"1", "2", "4"} and result["plain"]["tokens_per_second"] > 0
    assert [(o["strategy"], o["budget"]) for o in result["overhead"]] == [("chain", 8), ("dyspec", 8)]
    assert all(o["python_ms_per_step"] > 0 for o in result["overhead"])
    # the step's wall time as it ran: its draft and verify parts, Python besides
    for o in result["overhead"]:
        assert o["step_ms"] >= max(o["draft_ms_per_step"], o["verify_ms_per_step"]) > 0
    assert [p["key"] for p in doc["predicted"][result["target"]]] == ["dyspec:8"]
    assert "predicted speedup" in out.with_suffix(".md").read_text()
