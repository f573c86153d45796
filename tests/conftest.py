from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgespec.commands import models
from edgespec.errors import EdgespecError

# Ctrl-C is under test (generate, rpc-server, a load): a suite started in the background by a shell
# without job control inherits SIGINT ignored, and so would every child. Python's own handler instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass(frozen=True)
class EdgespecEnv:
    """An isolated EDGESPEC_HOME (models) and EDGESPEC_CONFIG (the user's models.toml)."""

    home: Path
    config: Path

    @property
    def user_registry(self) -> Path:
        return self.config / "models.toml"

    def write_registry(self, text: str) -> Path:
        self.user_registry.write_text(text)
        return self.user_registry


@pytest.fixture
def edgespec_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EdgespecEnv:
    env = EdgespecEnv(home=tmp_path / "home", config=tmp_path / "config")
    env.config.mkdir()
    monkeypatch.setenv("EDGESPEC_HOME", str(env.home))
    monkeypatch.setenv("EDGESPEC_CONFIG", str(env.config))
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    return env


@pytest.fixture
def models_cli() -> Callable[..., int]:
    """Runs ``edgespec models ARGV...`` in-process the way ``edgespec.cli.main`` does; returns the exit code.

    Only the ``models`` subcommand is registered, so these tests do not need llama.cpp.
    """

    def run(*argv: str) -> int:
        parser = argparse.ArgumentParser(prog="edgespec")
        models.register(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["models", *argv])
        try:
            return int(args.run(args) or 0)
        except EdgespecError as exc:
            print(f"edgespec: error: {exc}", file=sys.stderr)
            return 1

    return run


# -- the real bundled pair, loaded once per session by the tests that need it ----------------------
@pytest.fixture(scope="session")
def pair():
    from tests.support.realmodels import bundled_paths

    target, draft = bundled_paths()
    from edgespec.engine import EngineSettings, ModelPair

    with ModelPair(target, draft, EngineSettings(n_ctx=2048, max_tree_nodes=32)) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def batch_noise(pair) -> float:
    from tests.support.realmodels import measure_batch_noise

    return measure_batch_noise(pair)


@pytest.fixture(scope="session")
def plain_runs(pair) -> dict[str, tuple[list[int], list[float]]]:
    from tests.support.realmodels import plain_outputs

    return plain_outputs(pair)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty edgespec home and config directory of the test's own."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EDGESPEC_CONFIG", str(tmp_path / "config"))
    return tmp_path / "home"


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> str:
    """The tiny random GGUF with a synthetic tokenizer (randomgguf.write_tiny_gguf): no model file needed."""
    from tests.support.scripts import load

    randomgguf = load("randomgguf")

    return str(randomgguf.write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf"))
