"""The target's layers on llama.cpp RPC servers, and this machine's backend served to others.

llama.cpp's RPC backend (``ggml-rpc.h``, protocol 7.0.0 in the llama.cpp that llama-cpp-python
0.3.36 vendors) is compiled into llama-cpp-python's libraries when they are built with
``GGML_RPC=ON`` (``scripts/install_llama.py`` does). llama-cpp-python binds none of its functions,
so the few prototypes used here are declared below from the vendored ``ggml-backend.h`` and
``ggml-rpc.h``; no llama.cpp struct is copied (devices and registries are opaque pointers).

What llama.cpp's RPC client does when the network fails decides the design. It aborts the process
(``GGML_ABORT``) when it cannot connect, when the handshake fails, and when a server dies mid-decode
("Remote RPC server crashed…", raised on its dispatcher thread), and it has no timeouts: a server
that stops answering blocks a decode for ever. So:

- before llama.cpp connects, each server is checked here with a timeout: a TCP connect and the
  protocol's HELLO (unreachable, busy, another protocol version → an ``EngineError`` with the fix);
- every llama.cpp call that may talk to a server (load, context, decode, clear, free) runs on one
  worker thread, and its caller waits at most ``timeout`` seconds (``_Link.call``);
- ggml's abort callback catches an abort raised in ``ggml-rpc.cpp``, records it and parks that
  thread for good instead of returning to ``abort()``: the waiting caller raises ``RpcLost`` and the
  process (the chat app) stays up. Nothing on the link is touched again — freeing would send to the
  lost server and wait for ever — so those objects leak, and RPC stays unusable in this process until
  it restarts (llama.cpp keeps one connection per endpoint and cannot reconnect it).

The server side (``serve``) runs llama.cpp's server in a child process, behind a proxy that checks
each message (rpc_backend.py, rpc_child.py, rpc_proxy.py, rpc_session.py, rpc_protocol.py).

Where the layers go. With a local GPU, the device list is the RPC devices, then the GPU (llama.cpp's
own order, ``llama_prepare_model_devices``): the last layers, the output layer and the logits stay
local. With this machine's CPU, listing the CPU as a device gives the graph two CPU backends (the
device and llama.cpp's fallback), and the first local layer's norm runs on the other one: two copies
of the last server's output, two network round trips where one is needed (traced, protocol 7.0.0).
So the CPU is not listed: it keeps the *first* layers as llama.cpp keeps layers it does not offload
(``n_gpu_layers``), the servers hold the rest, and the output layer's weights stay in this machine's
memory (``tensor_buft_overrides``), so the logits never cross the network. The draft never sees an
RPC device (none is registered globally).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from time import monotonic

import llama_cpp as C

from ..errors import EngineError
from ._backend import _ensure_backend
from .rpc_endpoints import CHECK_TIMEOUT, check_server, parse_endpoints, refusing

_CPU, _GPU, _IGPU = 0, 1, 2  # enum ggml_backend_dev_type
RESTART = "restart edgespec: llama.cpp cannot reconnect a running process to a lost server"


class RpcLost(EngineError):
    """An RPC server died, hung or became unreachable after llama.cpp connected to it."""


# -- the library's prototypes (ggml-backend.h, ggml-rpc.h, ggml.h) ------------------------------------
_p, _size, _str = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)  # ggml_abort_callback_t
_PROTOTYPES = {
    "ggml_backend_rpc_add_server": (_p, [_str]),
    "ggml_backend_rpc_start_server": (None, [_str, _str, _size, _size, ctypes.POINTER(_p)]),
    "ggml_backend_reg_dev_count": (_size, [_p]),
    "ggml_backend_reg_dev_get": (_p, [_p, _size]),
    "ggml_backend_dev_count": (_size, []),
    "ggml_backend_dev_get": (_p, [_size]),
    "ggml_backend_dev_by_type": (_p, [ctypes.c_int]),
    "ggml_backend_dev_type": (ctypes.c_int, [_p]),
    "ggml_backend_dev_name": (_str, [_p]),
    "ggml_backend_dev_description": (_str, [_p]),
    "ggml_backend_dev_memory": (None, [_p, ctypes.POINTER(_size), ctypes.POINTER(_size)]),
    "ggml_set_abort_callback": (_p, [_ABORT_CALLBACK]),
    "ggml_backend_dev_buffer_type": (_p, [_p]),
}
OUTPUT_HERE = rb"^output(_norm)?\.weight$"  # the output layer's weights, kept in this machine's memory


class _BuftOverride(ctypes.Structure):
    """``struct llama_model_tensor_buft_override`` (llama.h): a name pattern and a buffer type, two
    pointers; llama-cpp-python declares the field as a bare pointer."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _library():
    """llama-cpp-python's library with the prototypes declared; an ``EngineError`` if RPC is missing."""
    _ensure_backend()
    lib = C.llama_cpp._lib
    if not hasattr(lib, "ggml_backend_rpc_add_server"):
        raise EngineError(
            "this llama-cpp-python was built without llama.cpp's RPC backend. Reinstall it with "
            "`python scripts/install_llama.py` (it builds with GGML_RPC=ON)."
        )
    for name, (restype, argtypes) in _PROTOTYPES.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


# -- the watchdog ---------------------------------------------------------------------------------------
@dataclass
class _Job:
    fn: Callable[..., object]
    args: tuple
    done: threading.Event = field(default_factory=threading.Event)
    finished: bool = False
    result: object = None
    error: BaseException | None = None


class _Link:
    """One worker thread runs every llama.cpp call that may talk to an RPC server; callers wait with a
    bounded timeout, and a lost server (ggml's abort, parked) or a silent one makes RPC unusable here."""

    def __init__(self) -> None:
        self.lost: str | None = None  # why RPC is unusable in this process; None while it is fine
        self.heartbeat = 0.0  # when the call in flight last showed progress (model loading reports it)
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._current: _Job | None = None
        self._worker: threading.Thread | None = None
        self._callback = _ABORT_CALLBACK(self._on_abort)  # kept alive: the library holds its address
        self._abort_message = ""

    def call(self, fn, args: tuple, what: str, endpoints: tuple[str, ...], timeout: float):
        return self.wait(self.submit(fn, args), what, endpoints, timeout)

    def submit(self, fn, args: tuple) -> _Job:
        """Hand ``fn(*args)`` to the worker; ``wait`` for it (one job in flight at a time)."""
        if self.lost:
            raise RpcLost(self.lost)
        if self._worker is None:
            _library().ggml_set_abort_callback(self._callback)
            self._worker = threading.Thread(target=self._work, name="edgespec-rpc", daemon=True)
            self._worker.start()
        job = _Job(fn, args)
        self._current, self.heartbeat = job, monotonic()
        self._jobs.put(job)
        return job

    def wait(self, job: _Job, what: str, endpoints: tuple[str, ...], timeout: float):
        """``job``'s result, waited for at most ``timeout`` seconds without progress."""
        while not job.done.wait(max(0.0, min(1.0, self.heartbeat + timeout - monotonic()))):
            if monotonic() - self.heartbeat >= timeout:
                names = ", ".join(endpoints)
                self.lost = (
                    f"the RPC server(s) {names} did not answer within {timeout:g} s while {what} "
                    f"(--rpc-timeout): check the servers and the network, then {RESTART}."
                )
                raise RpcLost(self.lost)
        if not job.finished:  # woken by the abort callback
            names = ", ".join(refusing(endpoints) or endpoints)
            self.lost = (
                f"lost the connection to the RPC server {names} while {what} (stopped, crashed or cut off; "
                f"llama.cpp: {self._abort_message}). Start `edgespec rpc-server` there again, then {RESTART}."
            )
            raise RpcLost(self.lost)
        if job.error is not None:
            raise job.error
        return job.result

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.result = job.fn(*job.args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                job.error = exc
            job.finished = True
            job.done.set()

    def _on_abort(self, message: bytes) -> None:
        text = (message or b"").decode("utf-8", errors="replace")
        if "ggml-rpc" not in text:  # any other abort: llama.cpp's own behaviour (print, then abort())
            print(text, file=sys.stderr, flush=True)
            return
        self._abort_message = text.rsplit(": ", 1)[-1].strip()
        self.lost = self.lost or (
            f"lost the connection to an RPC server (llama.cpp: {self._abort_message}). Start "
            f"`edgespec rpc-server` there again, then {RESTART}."
        )
        if self._current is not None:  # its caller says which server, and what it was doing
            self._current.done.set()
        libc = ctypes.CDLL(None)
        while True:  # park this thread for good: returning would abort() the whole process
            libc.pause()


_LINK = _Link()


# -- where a model's layers go ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    ptr: int  # ggml_backend_dev_t
    name: str  # llama.cpp's: RPC0, RPC1, …, CPU, CUDA0
    where: str  # the endpoint, or "this machine"
    free: int  # bytes
    total: int


class Placement:
    """A model's devices: every device of each RPC server, in the order given, then this machine's
    (its GPUs when ``local_gpu`` and the build has some, else its CPU, which is not passed to llama.cpp
    as a device: see the module's docstring) — the output layer and the logits stay local. ``shares``:
    llama.cpp's ``tensor_split``, one value per device (empty: by free memory; a 0 for this machine
    keeps no layer here). ``timeout``: seconds a call may take."""

    def __init__(
        self, endpoints: tuple[str, ...], shares: tuple[float, ...], local_gpu: bool, timeout: float
    ):
        self.endpoints, self.timeout = parse_endpoints(endpoints), timeout
        if _LINK.lost:  # before the check: a server still connected to this process would seem busy
            raise RpcLost(_LINK.lost)
        for endpoint in self.endpoints:
            check_server(endpoint, min(timeout, CHECK_TIMEOUT))
        lib = _library()
        self.devices: list[Device] = []
        for endpoint in self.endpoints:
            add = lib.ggml_backend_rpc_add_server  # connects: checked above, so it will not abort
            reg = self.call(add, (endpoint.encode(),), f"connecting to {endpoint}")
            if not reg:
                raise EngineError(f"the RPC server {endpoint} offers no device. Check its output.")
            for i in range(lib.ggml_backend_reg_dev_count(reg)):
                self.devices.append(self._device(lib.ggml_backend_reg_dev_get(reg, i), endpoint))
        here = local_devices(lib, gpu=local_gpu)
        self.devices += [self._device(d, "this machine") for d in here]
        self.shares = _check_shares(shares, self.devices)
        self._progress = C.llama_progress_callback(self._loading)

    def _device(self, ptr: int, where: str) -> Device:
        lib = C.llama_cpp._lib
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        memory = lib.ggml_backend_dev_memory  # on an RPC device: a round trip
        self.call(memory, (ptr, ctypes.byref(free), ctypes.byref(total)), f"asking {where} for its memory")
        return Device(ptr, lib.ggml_backend_dev_name(ptr).decode(), where, free.value, total.value)

    @property
    def cpu_here(self) -> bool:
        """This machine's share is its CPU (not listed as a device: see the module's docstring)."""
        return C.llama_cpp._lib.ggml_backend_dev_type(self.devices[-1].ptr) == _CPU

    def _arrays(self, n_layer: int, cpu_here: bool):
        """The device list, the split and the layers offloaded; with this machine's CPU, the list and
        split of the RPC devices alone, its share of the layers kept (the first ones)."""
        listed, shares = self.devices, self.shares
        n_gpu_layers = -1  # every layer, and the output layer, over the device list
        if cpu_here:
            weights = shares or tuple(float(d.free) for d in self.devices)
            here = round(n_layer * weights[-1] / sum(weights))
            listed, shares = listed[:-1], tuple(weights[:-1])
            if here >= n_layer or not any(shares):
                n_gpu_layers = 0  # every layer here: the servers hold nothing
            elif here > 0:
                n_gpu_layers = n_layer + 1 - here  # llama.cpp counts the output layer as one more
        devices = (ctypes.c_void_p * (len(listed) + 1))(*(d.ptr for d in listed), None)
        split = (ctypes.c_float * max(C.llama_max_devices(), len(listed)))(*shares)
        return devices, split, n_gpu_layers

    def _loading(self, progress: float, user_data) -> bool:
        _LINK.heartbeat = monotonic()  # a slow link loading a large model is not a silent server
        return True

    def apply(self, params, n_layer: int) -> None:
        """Point ``llama_model_params`` (of a model of ``n_layer`` layers) at these devices, split as
        asked; with this machine's CPU, the output layer's weights kept here."""
        cpu_here = self.cpu_here
        devices, split, n_gpu_layers = self._keep = self._arrays(n_layer, cpu_here)
        params.devices = ctypes.cast(devices, ctypes.c_void_p).value
        params.n_gpu_layers = n_gpu_layers
        params.tensor_split = split if self.shares or cpu_here else None
        if cpu_here:
            cpu = _library().ggml_backend_dev_buffer_type(self.devices[-1].ptr)
            overrides = (_BuftOverride * 2)(_BuftOverride(OUTPUT_HERE, cpu), _BuftOverride(None, None))
            self._keep += (overrides,)  # alive while llama.cpp reads it
            params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p).value
        params.progress_callback = self._progress

    def call(self, fn, args: tuple, what: str):
        return _LINK.call(fn, args, what, self.endpoints, self.timeout)

    def guard(self, fn, what: str):
        """``fn`` run on the RPC worker, waited for at most ``timeout`` seconds."""
        return lambda *args: self.call(fn, args, what)

    def start(self, fn, args: tuple, what: str) -> tuple[threading.Event, Callable[[], object]]:
        """``fn(*args)`` begun on the RPC worker: an event set when it is over, and the function that
        waits for its result as ``call`` does. The caller may work meanwhile (the draft looks ahead)."""
        job = _LINK.submit(fn, args)
        return job.done, lambda: _LINK.wait(job, what, self.endpoints, self.timeout)

    def release(self, fn, ptr) -> None:
        """Free ``ptr`` with ``fn`` — unless a server was lost: then it leaks (freeing would wait for
        ever on the lost connection)."""
        if _LINK.lost is None:
            with contextlib.suppress(RpcLost):
                self.call(fn, (ptr,), "freeing memory on the RPC servers")

    def describe(self) -> str:
        """Where the layers are, e.g. ``RPC 10.0.0.2:50052, 10.0.0.3:50052 + this machine (CPU)``."""
        here = [d.name for d in self.devices if d.where == "this machine"]
        if self.shares and not any(self.shares[-len(here) :]):
            return f"RPC {', '.join(self.endpoints)}"
        return f"RPC {', '.join(self.endpoints)} + this machine ({'+'.join(here)})"

    def load_failed(self, path: str) -> str:
        """What to say when llama.cpp could not load ``path`` onto these devices."""
        size = os.path.getsize(path)
        listing = ", ".join(f"{d.name} ({d.where}, {d.free / 2**30:.1f} GiB free)" for d in self.devices)
        return (
            f"llama.cpp could not load {os.path.basename(path)} ({size / 2**30:.1f} GiB) onto {listing}. "
            "If the weights do not fit, give the fuller devices a smaller share with --tensor-split, add a "
            "server, or pick a smaller quantization; set EDGESPEC_LLAMA_LOG=1 for llama.cpp's messages."
        )

    def check_fit(self, path: str) -> None:
        """Refuse early when an RPC device's share of the weights is larger than its free memory."""
        problem = fit_problem(os.path.getsize(path), self.shares, self.devices)
        if problem:
            raise EngineError(f"{os.path.basename(path)}: {problem}")


def _check_shares(shares: tuple[float, ...], devices: list[Device]) -> tuple[float, ...]:
    if not shares:
        return ()
    order = ", ".join(f"{d.name} ({d.where})" for d in devices)
    if len(shares) != len(devices) or min(shares) < 0 or sum(shares) <= 0:
        raise EngineError(
            f"--tensor-split needs {len(devices)} non-negative values, not all 0, one per device in this "
            f"order: {order} (got {','.join(f'{s:g}' for s in shares)})."
        )
    return tuple(float(s) for s in shares)


def fit_problem(size: int, shares: tuple[float, ...], devices: list[Device]) -> str | None:
    """Why ``size`` bytes of weights split by ``shares`` (empty: by free memory, as llama.cpp does)
    would not fit the RPC devices' free memory, or None. This machine's device is not checked: its
    weights are memory-mapped from the file."""
    weights = shares or tuple(float(d.free) for d in devices)
    total = sum(weights) or 1.0
    for device, weight in zip(devices, weights):
        need = size * weight / total
        if device.where != "this machine" and need > device.free:
            return (
                f"about {need / 2**30:.1f} GiB of the weights would go to {device.name} ({device.where}), "
                f"which has {device.free / 2**30:.1f} GiB free. Give it a smaller share with --tensor-split, "
                "add a server, or pick a smaller quantization."
            )
    return None


def local_devices(lib, gpu: bool) -> list[int]:
    """This machine's devices for a model's share, as llama.cpp's rpc-server picks what to serve: its
    GPUs (when ``gpu`` and the build has some), else its CPU."""
    devices = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
    gpus = [d for d in devices if lib.ggml_backend_dev_type(d) in (_GPU, _IGPU)] if gpu else []
    return gpus or [lib.ggml_backend_dev_by_type(_CPU)]


def serve(endpoint: str, threads: int, cache_dir: str | None):
    """Start llama.cpp's RPC server for this machine's GPUs (else its CPU) on ``endpoint`` in a child
    process (rpc_backend.py, rpc_child.py: a crafted message that aborts it costs the child, not the
    caller) and return its handle (``is_alive``, ``join``, ``stop``). ``edgespec rpc-server`` puts it
    on a loopback port behind its proxy (rpc_proxy.py)."""
    from .rpc_backend import start

    return start(endpoint, threads, cache_dir)
