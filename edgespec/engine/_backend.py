"""llama.cpp's backend as a whole: starting it once (silenced), what this build and CPU can do (compiled
features, GPU offload, versions), and the AMX guard.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import warnings
from functools import cache
from pathlib import Path

import llama_cpp as C
import llama_cpp.llama_cpp as _binding

from ..errors import EngineError

_BACKEND_READY = False

# llama.cpp's tiled K-quant matmul (ggml-cpu/tiled, batches of 8 rows or more), on unless this variable is
# 0; ggml reads it once per process. Off, the 2-core EPYC (AVX2 build, bundled pair) verified 8 tokens
# in 191-203 ms instead of 269-325 and 16 in 315-345 instead of 339-415, prefilled 128 in 2.5 s instead
# of 2.0-2.3 — yet served the 6-turn conversation in 103-105 s against 91-99 s on (lab/notebook.md), so
# edgespec leaves llama.cpp's default; the cost profile records the setting.
TILED_MATMUL = "GGML_CPU_TILED_MM"

# The library that llama-cpp-python 0.3.36's ctypes declarations describe (the llama.cpp and ggml its sdist
# vendors): ``_model.py`` and ``_context.py`` fill ``llama_batch`` and the model and context parameters
# through them. Another libllama under the same binding (LLAMA_CPP_LIB_PATH, a library built from other
# sources) may lay those structures out differently, which is memory corruption, not an error: refused
# before first use.
EXPECTED_LIBRARY = {"llama.cpp": "0.5.0-dev", "ggml": "0.25.3"}


def library_versions() -> dict[str, str]:
    """The versions the loaded libllama and the libggml-base beside it report of themselves."""
    libllama = Path(_binding._lib._name)
    found = {"llama.cpp": C.llama_version().decode()}
    with contextlib.suppress(OSError, AttributeError):  # already loaded by libllama: the same handle
        ggml = ctypes.CDLL(str(libllama.with_name(libllama.name.replace("llama", "ggml-base"))))
        ggml.ggml_version.restype = ctypes.c_char_p
        found["ggml"] = ggml.ggml_version().decode()
    return found


def check_library(found: dict[str, str]) -> None:
    """An ``EngineError`` unless every version found is the expected one (ggml's is read where its
    library is found beside libllama)."""
    if any(EXPECTED_LIBRARY.get(name) != version for name, version in found.items()):
        raise EngineError(
            f"the loaded llama.cpp library ({_binding._lib._name}: {found}) is not the one llama-cpp-python "
            f"{C.__version__} was written for ({EXPECTED_LIBRARY}); its structures may differ, so edgespec "
            "will not call it. Unset LLAMA_CPP_LIB_PATH, or reinstall llama-cpp-python with "
            "`python scripts/install_llama.py`."
        )


def _ensure_backend() -> None:
    global _BACKEND_READY
    if not _BACKEND_READY:
        check_library(library_versions())
        C.llama_log_set(_SILENT_LOG, ctypes.c_void_p(0))
        C.llama_backend_init()
        _BACKEND_READY = True


def address(pointer) -> int:
    """The address a ctypes function or pointer holds (0 for NULL)."""
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


_HEARD: list[str] | None = None  # llama.cpp's log while ``llama_log`` listens (offload.py reads it)


@contextlib.contextmanager
def llama_log():
    """The text llama.cpp logs while the block runs, as a list filled in (one thread loads at a time)."""
    global _HEARD
    _HEARD = heard = []
    try:
        yield heard
    finally:
        _HEARD = None


@C.llama_log_callback
def _SILENT_LOG(level, text, user_data):  # noqa: N802 - a C callback object
    if _HEARD is not None:
        _HEARD.append(text.decode("utf-8", errors="replace"))
    if os.environ.get("EDGESPEC_LLAMA_LOG"):
        print(text.decode("utf-8", errors="replace"), end="", flush=True)


class EngineWarning(UserWarning):
    """Something the user should know about the native backend (printed once as a note)."""


def cpu_flags() -> set[str]:
    """The instruction-set flags of this CPU (Linux /proc/cpuinfo; empty elsewhere)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    return set()


def amx_crash_risk(flags: set[str], info: str) -> bool:
    """True when this llama.cpp build has its AMX matmul compiled in *and* the CPU has AMX: the
    combination whose AMX buffers segfault on Q4_K models (llama.cpp's ``ggml_backend_amx_mul_mat``
    on Sapphire Rapids and later). Builds from ``scripts/install_llama.py`` never compile AMX."""
    return "AMX_INT8 = 1" in info and bool({"amx_int8", "amx_tile"} & flags)


@cache
def amx_guard() -> bool:
    """Whether to keep llama.cpp's extra (AMX, repacked) weight buffers off on this machine."""
    _ensure_backend()
    risky = amx_crash_risk(cpu_flags(), system_info())
    if risky:
        warnings.warn(
            "this llama-cpp-python was built with AMX, whose kernels crash on this CPU: weight repacking is "
            "off (slower). Reinstall it without AMX: `python scripts/install_llama.py` (see README).",
            EngineWarning,
            stacklevel=3,
        )
    return risky


@cache
def tiled_matmul() -> bool:
    """Whether llama.cpp's tiled K-quant matmul is on in this process, as ggml reads the switch once:
    non-zero is on (atoi, so a word is 0)."""
    if TILED_MATMUL not in os.environ:
        return True
    number = re.match(r"\s*[+-]?\d+", os.environ[TILED_MATMUL])
    return number is not None and int(number.group()) != 0


def supports_gpu_offload() -> bool:
    return bool(C.llama_supports_gpu_offload())


def backend_versions() -> list[str]:
    """llama-cpp-python and llama.cpp versions and the CPU features compiled into this build."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        binding = version("llama-cpp-python")
    except PackageNotFoundError:  # a frozen binary carries the module, not its metadata
        binding = getattr(C, "__version__", "?")
    _ensure_backend()
    llama = C.llama_version().decode() if hasattr(C, "llama_version") else "?"
    gpu = "GPU offload available" if supports_gpu_offload() else "CPU only"
    features = " ".join(compiled_features())
    lines = [f"llama-cpp-python {binding} (llama.cpp {llama})", f"backend: {gpu}; CPU: {features}"]
    if amx_crash_risk(cpu_flags(), system_info()):
        lines.append("warning: AMX compiled in on an AMX CPU: repacking is kept off (see README, Install)")
    return lines


def compiled_features() -> list[str]:
    """The CPU features this llama.cpp build has compiled in (AVX2, AVX512, REPACK, AMX_INT8, ...)."""
    # system info reads "CPU : SSE3 = 1 | AVX = 1 | ... |": the names of the features set to 1
    return [f.split("=")[0].split(":")[-1].strip() for f in system_info().split("|") if "= 1" in f]


def system_info() -> str:
    return C.llama_print_system_info().decode("utf-8", errors="replace")
