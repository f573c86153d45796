"""≥ 30 consecutive chat replies on the real pair with speculation on (auto after its profile, chain,
DySpec, TSD) through the real app and its thread worker: no native crash, every reply saved."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the repo: the child scripts import tests.support
SUPPORT = ROOT / "tests" / "support"
REPLIES = 32


@pytest.mark.model
@pytest.mark.slow
def test_many_replies_with_speculation_never_crash(tmp_path):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not importable")
    fault_log = tmp_path / "faults.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(SUPPORT / "chat_stress.py"), str(tmp_path / "chats.sqlite3"), str(REPLIES),
         str(fault_log)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    print(done.stdout)
    assert done.returncode == 0, (
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n"
        f"faulthandler:\n{fault_log.read_text() if fault_log.exists() else '(none)'}"
    )
    assert done.stdout.count(" ok ") == REPLIES
