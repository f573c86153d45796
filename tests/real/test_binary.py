"""The single binary (scripts/build_binary.py), run as a user would: outside any virtualenv, with a
clean environment, in a real terminal, and in a chroot that has no Python at all.

``EDGESPEC_BINARY`` names the binary (scripts/test.sh builds it and sets it); without it these tests
are skipped with that reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from time import monotonic, sleep

import pytest

BINARY = os.environ.get("EDGESPEC_BINARY")
pytestmark = pytest.mark.skipif(not BINARY, reason="EDGESPEC_BINARY is not set (scripts/test.sh builds it)")
PROMPT = "Write a Python function that returns the square of a number."


@pytest.fixture(scope="module")
def unpack(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("unpack")


def clean_env(home: Path, unpack: Path, **extra: str) -> dict[str, str]:
    """No virtualenv, no PYTHONPATH, a minimal PATH (sh, tar and gzip for the launcher)."""
    return {"HOME": str(home), "PATH": "/usr/bin:/bin", "EDGESPEC_UNPACK_DIR": str(unpack), **extra}


def run_binary(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.abspath(BINARY), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd="/")


@pytest.fixture(scope="module")
def pair_files() -> tuple[str, str]:
    from edgespec.models.store import ModelStore

    store = ModelStore()
    spec = store.registry.default_pair
    target, draft = (store.ensure(m.name, progress=False) for m in (spec.target, spec.draft))
    return str(target), str(draft)


def test_version_and_help_in_a_clean_environment(tmp_path, unpack):
    env = clean_env(tmp_path, unpack)
    version = run_binary("--version", env=env)
    assert version.returncode == 0, version.stderr
    lines = version.stdout.splitlines()
    assert lines[0].startswith("edgespec ") and "(single binary)" in lines[0]
    assert lines[1].startswith("llama-cpp-python 0.3.36 (llama.cpp ")
    assert "CPU:" in lines[2] and "AVX2" in lines[2] and "AMX" not in lines[2]
    assert run_binary("--help", env=env).stdout.count("generate") >= 1


def test_without_models_it_says_how_to_get_them(tmp_path, unpack):
    env = clean_env(tmp_path, unpack, EDGESPEC_HOME=str(tmp_path / "empty"))
    done = run_binary("generate", "hi", env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "single binary cannot use" in done.stderr and "models pull" in done.stderr
    assert "--target TARGET.gguf" in done.stderr


@pytest.mark.model
def test_models_list_and_generate_equal_the_package(tmp_path, unpack, pair_files):
    from edgespec.models.paths import home_dir

    env = clean_env(tmp_path, unpack, EDGESPEC_HOME=str(home_dir()))
    listed = run_binary("models", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    installed = {m["name"] for m in json.loads(listed.stdout) if m["kind"] == "model" and m["verified"]}
    assert {Path(p).stem for p in pair_files} <= installed

    target, draft = pair_files
    args = ["generate", PROMPT, "--target", target, "--draft", draft, "--strategy", "chain", "--json",
            "--max-tokens", "24", "--threads", "2"]
    frozen = run_binary(*args, env=env)
    assert frozen.returncode == 0, frozen.stderr
    package = subprocess.run([sys.executable, "-m", "edgespec.cli", *args], capture_output=True, text=True,
                             timeout=300)
    assert package.returncode == 0, package.stderr
    assert json.loads(frozen.stdout)["tokens"] == json.loads(package.stdout)["tokens"]


@pytest.mark.model
def test_chat_answers_in_a_real_terminal(tmp_path, unpack, pair_files):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    target, draft = pair_files
    env = clean_env(tmp_path, unpack, TERM="xterm-256color")
    command = " ".join(
        [f"{k}={v}" for k, v in env.items()]
        + [os.path.abspath(BINARY), "chat", "--target", target, "--draft", draft, "--strategy",
           "chain", "--max-tokens", "12", "--ctx", "1024"]
    )
    session = f"edgespec-binary-{os.getpid()}"
    tmux = ["tmux", "-L", session]
    subprocess.run([*tmux, "new-session", "-d", "-x", "120", "-y", "40", "-s", session, "env -i " + command],
                   check=True)
    try:
        screen = _wait_for(tmux, session, lambda s: " ready " in s, "the chat to load")
        subprocess.run([*tmux, "send-keys", "-t", session, "Say hello in Python.", "Enter"], check=True)
        screen = _wait_for(tmux, session, lambda s: "max tokens reached" in _flat(s), "the answer")
        assert "12 tokens" in _flat(screen) and "chain" in screen
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def _flat(screen: str) -> str:
    """The screen's text with box borders and line wraps folded into single spaces."""
    return re.sub(r"[\s│]+", " ", screen)


def _wait_for(tmux: list[str], session: str, ready, what: str, timeout: float = 240) -> str:
    deadline = monotonic() + timeout
    while True:
        screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True,
                                text=True).stdout
        if ready(screen):
            return screen
        assert monotonic() < deadline, f"timed out waiting for {what}; screen:\n{screen}"
        sleep(0.5)


# What every Debian has (libc6 and zlib1g are "required" packages, in debian:stable-slim too); PyInstaller's
# bootloader links zlib. Everything else — libpython, libstdc++, libgomp, llama.cpp — is in the binary.
SYSTEM_LIBS = ("ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0",
               "librt.so.1", "libutil.so.1", "libz.so.1")
LAUNCHER_TOOLS = ("sh", "tail", "tar", "gzip", "mktemp", "mkdir", "mv", "rm", "test", "[")


def test_runs_in_a_chroot_with_no_python(tmp_path):
    """A root with glibc and zlib, a static busybox for the launcher's sh/tail/tar, and the binary."""
    busybox = shutil.which("busybox")
    chroot = shutil.which("chroot", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if os.geteuid() != 0 or busybox is None or chroot is None:
        pytest.skip("needs root and busybox-static (scripts/test.sh installs it when run as root)")
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "tmp").mkdir()
    shutil.copy2(busybox, root / "bin" / "busybox")
    for tool in LAUNCHER_TOOLS:
        (root / "bin" / tool).symlink_to("busybox")
    for directory in ("lib/x86_64-linux-gnu", "lib64"):
        (root / directory).mkdir(parents=True)
    for lib in SYSTEM_LIBS:
        source = Path("/lib/x86_64-linux-gnu") / lib
        if source.exists():
            shutil.copy2(source, root / "lib/x86_64-linux-gnu" / lib)
    (root / "lib64" / "ld-linux-x86-64.so.2").symlink_to("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
    (root / "dev").mkdir()
    for name, minor in (("null", 3), ("zero", 5), ("urandom", 9)):  # as every system has them
        os.mknod(root / "dev" / name, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    shutil.copy2(BINARY, root / "edgespec")
    assert not list(root.rglob("python*")) and not list(root.rglob("libpython*"))
    env = {"HOME": "/tmp", "PATH": "/bin"}
    done = subprocess.run([chroot, str(root), "/edgespec", "--version"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "llama-cpp-python 0.3.36" in done.stdout
    listed = subprocess.run([chroot, str(root), "/edgespec", "models", "list"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "qwen2.5-coder-1.5b" in listed.stdout, listed.stderr
