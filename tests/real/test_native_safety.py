"""The native backend can neither crash the app nor be crashed by it.

- The install builds llama-cpp-python with explicit CPU flags: never -march=native, never AMX (whose
  kernels segfault on Q4_K models on Sapphire Rapids), everything else the CPU has.
- At run time, an AMX build on an AMX CPU keeps llama.cpp's extra (AMX) buffers off.
- A crashing backend is found by a test decode in a child process and reported with the fix.
- Two threads using one engine get an ``EngineError``, not corrupted memory; so does use after close.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path
from time import monotonic, sleep

import pytest
import tomllib

from edgespec.engine._backend import amx_crash_risk
from edgespec.engine.probe import run_probe
from edgespec.errors import EngineError
from tests.support.scripts import load

ROOT = Path(__file__).resolve().parents[2]
SAPPHIRE_RAPIDS = set(
    "sse4_2 f16c fma bmi2 avx avx2 avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi avx512_vnni "
    "avx512_bf16 avx_vnni amx_tile amx_int8 amx_bf16".split()
)
ZEN3 = set("sse4_2 f16c fma bmi2 avx avx2".split())


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("-D"))


def test_install_flags_never_native_never_amx():
    install = load("install_llama")
    spr = _flags(install.cmake_args(SAPPHIRE_RAPIDS))
    assert spr["GGML_NATIVE"] == "OFF"
    assert all(spr[f"GGML_AMX_{x}"] == "OFF" for x in ("TILE", "INT8", "BF16"))
    assert all(spr[o] == "ON" for o in ("GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX2"))
    zen3 = _flags(install.cmake_args(ZEN3))
    assert zen3["GGML_AVX2"] == "ON" and zen3["GGML_AVX512"] == "OFF" and zen3["GGML_AVX_VNNI"] == "OFF"
    # AVX-512 needs all five sub-extensions ggml turns on together
    assert _flags(install.cmake_args(ZEN3 | {"avx512f"}))["GGML_AVX512"] == "OFF"
    portable = _flags(install.cmake_args(None))
    assert [o for o, v in portable.items() if v == "ON"] == ["GGML_RPC", *install.PORTABLE]
    # ggml's RPC backend in every build (edgespec rpc-server, --rpc), CPU flags or not
    assert spr["GGML_RPC"] == zen3["GGML_RPC"] == "ON"
    # the user's own flags (CUDA) come after ours, and change the cache key
    cuda = install.cmake_args(ZEN3, "-DGGML_CUDA=on")
    assert cuda[-1] == "-DGGML_CUDA=on"
    build_key = load("llama_build.wheel").build_key
    assert build_key(cuda) != build_key(install.cmake_args(ZEN3))


def test_install_script_pins_the_version_pyproject_pins():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"llama-cpp-python=={load('llama_build.wheel').LLAMA_CPP_PYTHON}" in deps


def test_another_llama_cpp_under_the_binding_is_refused_before_any_call(monkeypatch):
    """The ctypes structures the engine fills (llama_batch, the parameters) are llama-cpp-python's
    declarations of the llama.cpp it vendors; a library of another version (LLAMA_CPP_LIB_PATH) is an
    error with the fix at start, before a model or a batch is touched."""
    from edgespec.engine import _backend

    assert _backend.library_versions() == _backend.EXPECTED_LIBRARY  # the pinned build is the one loaded
    monkeypatch.setattr(_backend, "_BACKEND_READY", False)
    monkeypatch.setattr(_backend, "library_versions", lambda: {"llama.cpp": "0.6.1", "ggml": "0.31.0"})
    with pytest.raises(EngineError, match="LLAMA_CPP_LIB_PATH") as raised:
        _backend._ensure_backend()
    assert "0.6.1" in str(raised.value) and "0.5.0-dev" in str(raised.value)
    monkeypatch.setattr(_backend, "library_versions", lambda: {"llama.cpp": "0.5.0-dev"})  # ggml not found
    _backend._ensure_backend()  # what was found agrees: no error


@pytest.mark.parametrize(
    "setting,on", [(None, True), ("0", False), ("1", True), ("off", False), (" 2x", True)]
)
def test_the_tiled_matmul_setting_is_read_as_ggml_reads_it(setting, on):
    """GGML_CPU_TILED_MM (llama.cpp's tiled K-quant matmul: on unless 0, read with atoi) changes the cost
    curve from 8 tokens on, so the cost profile's key carries what ggml will do in this process."""
    env = {k: v for k, v in os.environ.items() if k != "GGML_CPU_TILED_MM"}
    if setting is not None:
        env["GGML_CPU_TILED_MM"] = setting
    code = "from edgespec.engine import tiled_matmul; print(tiled_matmul())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(on)]


def test_cpu_flags_read_the_first_processor():
    install = load("install_llama")
    cpuinfo = "processor : 0\nflags\t\t: fpu avx2 amx_int8\n\nprocessor : 1\nflags : fpu\n"
    assert install.cpu_flags(cpuinfo) == {"fpu", "avx2", "amx_int8"}


@pytest.mark.parametrize(
    "cpu,info,risky",
    [
        (SAPPHIRE_RAPIDS, "AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1", True),  # native build on SPR
        (SAPPHIRE_RAPIDS, "AVX512 = 1 | REPACK = 1", False),  # install_llama.py's build on SPR
        (ZEN3, "AVX2 = 1 | AMX_INT8 = 1", False),  # (an AMX build cannot run here anyway)
        (ZEN3, "AVX2 = 1 | REPACK = 1", False),
    ],
)
def test_amx_guard_only_where_build_and_cpu_both_have_amx(cpu, info, risky):
    assert amx_crash_risk(cpu, info) is risky


def test_a_crashing_backend_becomes_a_message_with_the_fix():
    segfault = [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]
    with pytest.raises(EngineError) as caught:
        run_probe(segfault, "/models/target.gguf")
    message = str(caught.value)
    assert "crashed (SIGSEGV)" in message and "target.gguf" in message
    assert "scripts/install_llama.py" in message and "--no-repack" in message
    assert run_probe([sys.executable, "-c", "pass"], "m.gguf") is True
    assert run_probe([sys.executable, "-c", "raise SystemExit(1)"], "m.gguf") is False  # ordinary error


# -- the real backend --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def draft_path() -> str:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama_cpp is not importable")
    from edgespec.models.store import ModelStore

    store = ModelStore()
    spec = store.registry.default_pair
    return str(store.ensure(spec.draft.name, progress=False))


@pytest.mark.model
def test_two_threads_on_one_context_get_an_error_not_a_crash(draft_path):
    from edgespec.engine._context import Context, ContextSettings
    from edgespec.engine._model import Model

    model = Model(draft_path)
    ctx = Context(model, ContextSettings(n_ctx=1024, n_batch=512, n_seq_max=1, n_threads=1))
    tokens = model.tokenize("def f(x):\n    return x * 2\n" * 40)[:500]
    errors: list[Exception] = []

    def long_decode() -> None:
        try:
            ctx.decode(tokens, range(len(tokens)), [(0,)] * len(tokens), [False] * len(tokens))
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion below
            errors.append(exc)

    try:
        worker = threading.Thread(target=long_decode)
        worker.start()
        deadline = monotonic() + 10
        while not ctx._owner._lock.locked():  # wait until the worker is inside llama_decode
            assert monotonic() < deadline and worker.is_alive()
            sleep(0.001)
        for intrude in (
            lambda: ctx.decode([tokens[0]], [len(tokens)], [(0,)], [True]),
            lambda: ctx.logits_rows(1),
            lambda: ctx.seq_rm(0, 0),
            ctx.close,
        ):
            with pytest.raises(EngineError, match="already in use by another thread"):
                intrude()
        worker.join(60)
        assert not errors and ctx.seq_pos_max(0) == len(tokens) - 1  # the owner finished undisturbed
    finally:
        ctx.close()
        model.close()
    with pytest.raises(EngineError, match="already closed"):
        ctx.decode([tokens[0]], [0], [(0,)], [True])
    with pytest.raises(EngineError, match="already closed"):
        model.tokenize("hi")


@pytest.mark.model
def test_backend_probe_runs_once_then_costs_nothing(draft_path, tmp_path, monkeypatch):
    from edgespec.engine import probe
    from edgespec.engine._backend import system_info

    info = system_info()
    probe.ensure_backend_works(draft_path, True, 0, info, tmp_path / "probes")
    assert len(list((tmp_path / "probes").glob("*.ok"))) == 1

    def must_not_run(*args, **kwargs):
        raise AssertionError("probed again")

    monkeypatch.setattr(probe, "run_probe", must_not_run)
    started = monotonic()
    probe.ensure_backend_works(draft_path, True, 0, info, tmp_path / "probes")
    assert monotonic() - started < 0.05
    with pytest.raises(AssertionError, match="probed again"):  # other settings: another probe
        probe.ensure_backend_works(draft_path, False, 0, info, tmp_path / "probes")
