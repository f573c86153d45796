"""The lab stays small (issue 59): its tracked files under 1.5 MB together and 100 KB each, so raw step
logs, traces and full-size plots stay out of git (lab/README.md)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOTAL_LIMIT = 1_500_000
FILE_LIMIT = 100_000


def lab_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "lab"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        pytest.skip(f"git ls-files failed: {listed.stderr.strip()}")
    paths = [ROOT / name for name in listed.stdout.split("\0") if name]
    return [p for p in paths if p.is_file()]  # a tracked file deleted in the work tree counts nothing


def test_the_lab_is_under_its_size_limits():
    sizes = {p.relative_to(ROOT).as_posix(): p.stat().st_size for p in lab_files()}
    too_big = {name: size for name, size in sizes.items() if size > FILE_LIMIT}
    assert not too_big, f"lab files over {FILE_LIMIT} bytes (keep a summary, see lab/README.md): {too_big}"
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert total < TOTAL_LIMIT, f"lab/ tracks {total} bytes (limit {TOTAL_LIMIT}); largest: {largest}"
