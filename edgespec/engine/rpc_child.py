"""`edgespec rpc-server`'s library side: the backend's child process (``child``: llama.cpp's RPC server
on a thread, ``serve_here``, until its parent goes; started by rpc_backend.py as
``python -m edgespec.engine.rpc_child``), and ggml's tensor types for the proxy's checks
(``type_traits``)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

import numpy as np

from .rpc import _library, local_devices
from .rpc_protocol import TYPE_COUNT, TypeTraits

COULD_NOT_LISTEN = 3  # the child's exit status when llama.cpp returned without serving
# create_node in ggml-rpc.cpp recurses once per tensor of a chain: a graph of MAX_GRAPH_BYTES holds
# ~113k tensors, far beyond a default 8 MiB thread stack. Reserved, not committed, memory.
STACK_BYTES = 512 << 20


def type_traits() -> TypeTraits:
    """ggml's block size and bytes per block of every tensor type, from the library itself."""
    lib = _library()
    lib.ggml_blck_size.restype, lib.ggml_blck_size.argtypes = ctypes.c_int64, [ctypes.c_int]
    lib.ggml_type_size.restype, lib.ggml_type_size.argtypes = ctypes.c_size_t, [ctypes.c_int]
    block = np.array([lib.ggml_blck_size(t) for t in range(TYPE_COUNT)], dtype=np.int64)
    size = np.array([lib.ggml_type_size(t) for t in range(TYPE_COUNT)], dtype=np.uint64)
    return TypeTraits(block, size)


def serve_here(endpoint: str, threads: int, cache_dir: str | None) -> threading.Thread:
    """llama.cpp's RPC server for this machine's GPUs (else its CPU) on a thread of this process:
    ``ggml_backend_rpc_start_server`` serves one client after another until the process ends, and
    returns early only when it cannot listen (it prints why)."""
    lib = _library()
    devices = local_devices(lib, gpu=True)
    array = (ctypes.c_void_p * len(devices))(*devices)
    cache = cache_dir.encode() if cache_dir else None
    previous = threading.stack_size()
    try:
        threading.stack_size(STACK_BYTES)
    except (ValueError, RuntimeError):  # a platform without it: the default stack
        pass
    try:
        thread = threading.Thread(
            target=lib.ggml_backend_rpc_start_server,
            args=(endpoint.encode(), cache, threads, len(devices), array),
            name="edgespec-rpc-server",
            daemon=True,
        )
        thread.start()
    finally:
        threading.stack_size(previous)
    return thread


def child(endpoint: str, threads: int, cache_dir: str | None) -> int:
    """The child's life: serve until the parent goes (Ctrl-C in a terminal reaches the whole process
    group: the parent decides, so the child ignores it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_leave_with_parent, name="edgespec-rpc-parent", daemon=True).start()
    server = serve_here(endpoint, threads, cache_dir)
    server.join()
    sys.stdout.flush()
    os._exit(COULD_NOT_LISTEN)  # no static destructors under a llama.cpp thread


def _leave_with_parent() -> None:
    try:
        sys.stdin.buffer.read()
    except (OSError, ValueError):
        pass
    os._exit(0)


if __name__ == "__main__":
    endpoint, threads, cache_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3] or None
    sys.exit(child(endpoint, threads, cache_dir))
