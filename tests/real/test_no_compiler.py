"""Installing without a C compiler: edgespec is pure Python (numpy does the logits rows), so ``CC=false pip
install`` of the source tree works, and the installed copy gives the same greedy tokens as this checkout,
end to end on the real pair."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Write a Python function that checks whether a number is prime."


@pytest.fixture(scope="module")
def no_compiler_install(tmp_path_factory) -> Path:
    """``CC=false pip install`` of this source tree into a folder of its own: nothing may need compiling."""
    work = tmp_path_factory.mktemp("nocc")
    source = work / "src"
    source.mkdir()
    for name in ("edgespec", "tui"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    target = work / "site"
    env = dict(os.environ, CC="false", CXX="false", LDSHARED="false")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
         str(target), str(source)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert (target / "edgespec" / "engine" / "rows.py").is_file()
    assert not list((target / "edgespec").rglob("*.so")), "something was compiled with CC=false"
    return target


def generate(strategy: str, pythonpath: str | None) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [sys.executable, "-m", "edgespec", "generate", PROMPT, "--strategy", strategy, "--json",
         "--max-tokens", "24", "--threads", "2", "--ctx", "512"],
        env=env, capture_output=True, text=True, timeout=600, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout), done.stderr


@pytest.mark.model
def test_no_compiler_installs_and_dyspec_gives_this_checkouts_greedy_tokens(no_compiler_install):
    from tests.support.realmodels import bundled_paths

    bundled_paths()  # skips with the fix when the pair is not installed
    here, _ = generate("dyspec", str(ROOT))
    installed, _ = generate("dyspec", str(no_compiler_install))
    assert installed["tokens"] == here["tokens"]
    assert installed["stats"]["target_calls"] == here["stats"]["target_calls"]
