"""llama.cpp's RPC protocol as `edgespec rpc-server`'s proxy reads it, and the checks that keep a
client's message from reaching one of llama.cpp's aborts.

The protocol (7.0.0: ``ggml-rpc.cpp`` of the llama.cpp that llama-cpp-python 0.3.36 vendors) is a
stream of requests — ``| command (1 byte) | size (uint64 LE) | payload |`` — each answered, for the
commands that answer, by ``| size (uint64 LE) | payload |``, in order. The server trusts what it
reads: a tensor whose data lies outside its buffer, a tensor read or written past its end, an element
count beyond int64 are ``GGML_ASSERT``s there, and an assert aborts the whole process. Everything such
an assert tests is known here from the session's own traffic (the buffers it allocated, their bases
and sizes), so ``Checks`` refuses those messages before llama.cpp sees them. What llama.cpp computes
from a well-formed graph (an operation's own asserts on shapes, an index out of range) is not
checked: that is what the backend's child process and its restart are for (rpc_proxy.py).

Every size a client controls has a limit and costs time and memory linear in it: fixed-size requests
must have their exact size; a graph at most ``MAX_GRAPH_BYTES``; tensor data at most the tensor's
bytes, inside a buffer of the session; allocations at most the device's memory, in all
(``MAX_BUFFERS`` of them); weights written to ``--cache`` at most the devices' memory per session.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

(
    ALLOC_BUFFER, GET_ALIGNMENT, GET_MAX_SIZE, BUFFER_GET_BASE, FREE_BUFFER, BUFFER_CLEAR, SET_TENSOR,
    SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR, GRAPH_COMPUTE, GET_DEVICE_MEMORY, INIT_TENSOR,
    GET_ALLOC_SIZE, HELLO, DEVICE_COUNT, GRAPH_RECOMPUTE, MEMSET_TENSOR,
) = range(18)  # enum rpc_cmd; RPC_CMD_NONE (18) and beyond are refused
NAMES = (
    "ALLOC_BUFFER GET_ALIGNMENT GET_MAX_SIZE BUFFER_GET_BASE FREE_BUFFER BUFFER_CLEAR SET_TENSOR "
    "SET_TENSOR_HASH GET_TENSOR COPY_TENSOR GRAPH_COMPUTE GET_DEVICE_MEMORY INIT_TENSOR GET_ALLOC_SIZE "
    "HELLO DEVICE_COUNT GRAPH_RECOMPUTE MEMSET_TENSOR"
).split()
CAPS = 24  # RPC_CONN_CAPS_SIZE: rpc_msg_hello_req
HELLO_REPLY = 4 + CAPS  # rpc_msg_hello_rsp: major, minor, patch, padding, caps
MAX_DIMS, MAX_SRC = 4, 10  # GGML_MAX_DIMS, GGML_MAX_SRC (ggml.h)
# GGML_TYPE_COUNT (ggml.h) and GGML_OP_COUNT (ggml-rpc.h asserts it for protocol 7.0.0) of the vendored
# llama.cpp: a message naming a type or an operation beyond them is refused.
TYPE_COUNT, OP_COUNT = 43, 101

# struct rpc_tensor (packed): 296 bytes.
TENSOR_DTYPE = np.dtype(
    [
        ("id", "<u8"), ("type", "<u4"), ("buffer", "<u8"), ("ne", "<u4", (4,)), ("nb", "<u4", (4,)),
        ("op", "<u4"), ("op_params", "<i4", (16,)), ("flags", "<i4"), ("src", "<u8", (MAX_SRC,)),
        ("view_src", "<u8"), ("view_offs", "<u8"), ("data", "<u8"), ("name", "S64"), ("use_count", "<i4"),
    ]
)
TENSOR = TENSOR_DTYPE.itemsize
assert TENSOR == 296
VARIABLE = -1
# command: (request size, response size); VARIABLE: checked by the command's own rule; None: no response
SIZES = {
    ALLOC_BUFFER: (12, 16),
    GET_ALIGNMENT: (4, 8),
    GET_MAX_SIZE: (4, 8),
    BUFFER_GET_BASE: (8, 8),
    FREE_BUFFER: (8, None),
    BUFFER_CLEAR: (9, None),
    SET_TENSOR: (VARIABLE, None),
    SET_TENSOR_HASH: (TENSOR + 16, 1),
    GET_TENSOR: (TENSOR + 16, VARIABLE),
    COPY_TENSOR: (2 * TENSOR, 1),
    GRAPH_COMPUTE: (VARIABLE, None),
    GET_DEVICE_MEMORY: (4, 16),
    INIT_TENSOR: (TENSOR, None),
    GET_ALLOC_SIZE: (4 + (1 + MAX_SRC) * TENSOR, 8),
    DEVICE_COUNT: (0, 4),
    GRAPH_RECOMPUTE: (4, None),
    MEMSET_TENSOR: (TENSOR + 17, None),
}
SET_TENSOR_HEAD = TENSOR + 1 + 8  # rpc_tensor, cache flag, offset; then the data
MAX_GRAPH_BYTES = 32 << 20  # a 70B model's graph is a few MB; llama.cpp keeps the message in memory
MAX_BUFFERS = 4096  # llama.cpp allocates a few dozen per model and context
_LIMIT = 2.0**62  # element counts and byte sizes beyond it are refused (ggml's arithmetic is 64-bit)


class Refused(Exception):
    """A message that must not reach llama.cpp; ``str()`` says why, for the log."""


@dataclass(frozen=True)
class TypeTraits:
    """ggml's block size and block bytes per tensor type, read from the library (rpc_child.py)."""

    block: np.ndarray  # int64, 0 for removed types
    size: np.ndarray  # uint64


@dataclass
class Checks:
    """One session's state as far as the checks need it: its buffers (as the backend's ``buffers`` set,
    with their bases and sizes), what it allocated per device and cached; and the checks."""

    traits: TypeTraits
    device_memory: tuple[int, ...]  # each device's total bytes, from the backend at its start
    cache_dir: str | None
    buffers: dict[int, list[int]] = field(default_factory=dict)  # remote_ptr: [device, size, base]
    allocated: list[int] = field(default_factory=list)
    cached: int = 0

    def __post_init__(self) -> None:
        self.allocated = [0] * len(self.device_memory)

    # -- the buffers, from the backend's own answers -------------------------------------------------
    def device(self, payload: bytes, what: str) -> int:
        (device,) = struct.unpack_from("<I", payload)
        if device >= len(self.device_memory):
            count = len(self.device_memory)
            raise Refused(f"{what}: device {device} does not exist (the server has {count})")
        return device

    def alloc(self, payload: bytes) -> None:
        device = self.device(payload, "ALLOC_BUFFER")
        (size,) = struct.unpack_from("<Q", payload, 4)
        if len(self.buffers) >= MAX_BUFFERS:
            raise Refused(f"more than {MAX_BUFFERS} buffers")
        free = self.device_memory[device] - self.allocated[device]
        if self.device_memory[device] and size > free:  # (a device that reports no memory: no limit)
            raise Refused(
                f"ALLOC_BUFFER of {size} bytes: beyond the device's memory ({free} bytes left of "
                f"{self.device_memory[device]})"
            )

    def allocated_buffer(self, payload: bytes, ptr: int, size: int, base: int) -> None:
        """The backend allocated ``size`` bytes at ``base`` for the request ``payload``."""
        device = struct.unpack_from("<I", payload)[0]
        self.buffers[ptr] = [device, size, base]
        self.allocated[device] += size

    def known(self, payload: bytes) -> int:
        (ptr,) = struct.unpack_from("<Q", payload)
        if ptr not in self.buffers:
            raise Refused(f"buffer {ptr:#x} is not one of this session's")
        return ptr

    def free(self, ptr: int) -> None:
        device, size, _ = self.buffers.pop(ptr)
        self.allocated[device] -= size

    # -- tensors ---------------------------------------------------------------------------------------
    def tensors(self, raw, what: str, need_buffer: bool = True) -> np.ndarray:
        """``raw`` (whole rpc_tensors) checked as ``deserialize_tensor`` and ``ggml_new_tensor_4d`` would
        assert; their ``ggml_nbytes`` (uint64). ``need_buffer``: each must lie in a buffer of this
        session (else: no buffer at all, or one of this session's)."""
        t = np.frombuffer(raw, dtype=TENSOR_DTYPE)
        types = t["type"]
        if len(t) == 0:
            return np.zeros(0, dtype=np.uint64)
        if int(types.max()) >= len(self.traits.block):
            raise Refused(f"{what}: tensor type {int(types.max())} does not exist")
        block, unit = self.traits.block[types], self.traits.size[types]
        if not block.all():
            raise Refused(f"{what}: tensor type {int(types[block == 0][0])} was removed from ggml")
        if int(t["op"].max()) >= OP_COUNT:
            raise Refused(f"{what}: operation {int(t['op'].max())} does not exist")
        ne, nb = t["ne"].astype(np.uint64), t["nb"].astype(np.uint64)
        # ggml_new_tensor_impl asserts that the element count fits int64; floats bound it safely.
        if (np.maximum(ne, 1).astype(np.float64).prod(axis=1) >= _LIMIT).any():
            raise Refused(f"{what}: a tensor of more than 2^62 elements")
        if (ne[:, 0] % block.astype(np.uint64)).any():  # ggml_row_size: whole blocks per row
            raise Refused(f"{what}: a row that is not a whole number of its type's blocks")
        nbytes = self._nbytes(ne, nb, block, unit, what)
        # The buffers named (a graph names a few): unknown ones are a null buffer to the backend.
        names, at = np.unique(t["buffer"], return_inverse=True)
        table = np.array([self.buffers.get(int(b), (0, 0, 0))[1:] for b in names], dtype=np.uint64)
        found = np.array([int(b) in self.buffers for b in names])[at.reshape(-1)]
        if need_buffer and not found.all():
            raise Refused(f"{what}: a tensor outside this session's buffers")
        if not (found | (t["buffer"] == 0)).all():
            raise Refused(f"{what}: a tensor in a buffer that is not one of this session's")
        if found.any():
            size, base = (table[at.reshape(-1)][found]).T
            d, n = t["data"][found], nbytes[found]
            before = d < base
            offset = np.where(before, 0, d - base)
            outside = before | (offset > size) | (n > size - np.minimum(offset, size))
            if outside.any():
                i = int(np.flatnonzero(outside)[0])
                past = int(d[i]) + int(n[i]) - int(base[i]) - int(size[i])
                raise Refused(
                    f"{what}: a tensor's data lies outside its buffer ({past} bytes past its end)"
                    if not before[i]
                    else f"{what}: a tensor's data lies before its buffer"
                )
        return nbytes

    @staticmethod
    def _nbytes(ne, nb, block, unit, what: str) -> np.ndarray:
        """``ggml_nbytes``, refused where it would pass 2^62 (and wrap in ggml's size_t)."""
        rest = np.where(ne[:, 1:] > 0, ne[:, 1:] - np.uint64(1), np.uint64(0)) * nb[:, 1:]
        ones = block == 1
        head0 = np.where(ne[:, 0] > 0, ne[:, 0] - np.uint64(1), np.uint64(0)) * nb[:, 0] + unit
        first = np.where(ones, head0, ne[:, 0] * nb[:, 0] // np.maximum(block, 1).astype(np.uint64))
        estimate = first.astype(np.float64) + rest.astype(np.float64).sum(axis=1)
        if (estimate >= _LIMIT).any():
            raise Refused(f"{what}: a tensor of more than 2^62 bytes")
        nbytes = first + rest.sum(axis=1)
        return np.where((ne == 0).any(axis=1), np.uint64(0), nbytes)

    def region(self, payload: bytes, what: str, offset: int, size: int) -> None:
        """``size`` bytes at ``offset`` in the tensor at the head of ``payload``: inside it
        (``ggml_backend_tensor_set/get`` assert it)."""
        (nbytes,) = self.tensors(payload[:TENSOR], what)
        if size and (offset > int(nbytes) or size > int(nbytes) - offset):
            raise Refused(f"{what}: {size} bytes at offset {offset} of a tensor of {int(nbytes)} bytes")

    # -- each command's payload --------------------------------------------------------------------------
    def set_tensor(self, head: bytes, size: int) -> bytes:
        """SET_TENSOR's fixed part checked (``size`` bytes of data follow), as it goes to the backend:
        its cache flag cleared once the session has had its share of ``--cache`` (the devices'
        memory): the weights are set all the same, and the client cannot tell."""
        flag, offset = struct.unpack_from("<BQ", head, TENSOR)
        self.region(head, "SET_TENSOR", offset, size)
        if flag and self.cache_dir:
            if self.cached + size > sum(self.device_memory):
                return head[:TENSOR] + b"\x00" + head[TENSOR + 1 :]
            self.cached += size
        return head

    def set_tensor_hash(self, payload: bytes) -> None:
        offset, digest = struct.unpack_from("<QQ", payload, TENSOR)
        size = 0
        if self.cache_dir:  # the backend writes the cached file's bytes at offset
            try:
                size = os.path.getsize(os.path.join(self.cache_dir, f"{digest:016x}"))
            except OSError:
                size = 0
        self.region(payload, "SET_TENSOR_HASH", offset, size)

    def get_tensor(self, payload: bytes) -> int:
        offset, size = struct.unpack_from("<QQ", payload, TENSOR)
        self.region(payload, "GET_TENSOR", offset, size)
        return size

    def graph(self, payload: bytes) -> None:
        """GRAPH_COMPUTE: ``| device | n_nodes | node ids | n_tensors | rpc_tensors |``, exactly."""
        if len(payload) < 12:
            raise Refused("GRAPH_COMPUTE: shorter than its header")
        self.device(payload, "GRAPH_COMPUTE")
        (n_nodes,) = struct.unpack_from("<I", payload, 4)
        if len(payload) < 12 + 8 * n_nodes:
            raise Refused("GRAPH_COMPUTE: fewer node ids than it says")
        (n_tensors,) = struct.unpack_from("<I", payload, 8 + 8 * n_nodes)
        if len(payload) != 12 + 8 * n_nodes + TENSOR * n_tensors:
            raise Refused("GRAPH_COMPUTE: its size does not match its counts")
        nodes = np.frombuffer(payload, dtype="<u8", count=n_nodes, offset=8)
        tensors = payload[12 + 8 * n_nodes :]
        ids = np.frombuffer(tensors, dtype=TENSOR_DTYPE)["id"]
        # A node 0 is a null node (computed: a crash); one listed twice makes the server write its use
        # count at ggml_hash_insert's "already there" index, out of bounds.
        if (nodes == 0).any() or len(np.unique(nodes)) != n_nodes:
            raise Refused("GRAPH_COMPUTE: a null node, or a node listed twice")
        if not np.isin(nodes, ids).all():
            raise Refused("GRAPH_COMPUTE: a node that is not among its tensors")
        self.tensors(tensors, "GRAPH_COMPUTE")

    def check(self, cmd: int, payload: bytes) -> None:
        """The checks of a whole fixed-size request (SET_TENSOR and GRAPH_COMPUTE have their own)."""
        if cmd in (GET_ALIGNMENT, GET_MAX_SIZE, GET_DEVICE_MEMORY, GRAPH_RECOMPUTE):
            self.device(payload, NAMES[cmd])
        elif cmd == ALLOC_BUFFER:
            self.alloc(payload)
        elif cmd in (BUFFER_GET_BASE, FREE_BUFFER, BUFFER_CLEAR):
            self.known(payload)
        elif cmd == SET_TENSOR_HASH:
            self.set_tensor_hash(payload)
        elif cmd == GET_TENSOR:
            self.get_tensor(payload)
        elif cmd == COPY_TENSOR:
            self.tensors(payload, "COPY_TENSOR")
        elif cmd == MEMSET_TENSOR:
            self.tensors(payload[:TENSOR], "MEMSET_TENSOR")
        elif cmd == INIT_TENSOR:
            self.tensors(payload, "INIT_TENSOR", need_buffer=False)
        elif cmd == GET_ALLOC_SIZE:  # its tensor and its sources with an id; not yet allocated, maybe
            self.device(payload, "GET_ALLOC_SIZE")
            tensors = np.frombuffer(payload, dtype=TENSOR_DTYPE, offset=4)
            used = tensors[(tensors["id"] != 0) | (np.arange(len(tensors)) == 0)]
            self.tensors(used.tobytes(), "GET_ALLOC_SIZE", need_buffer=False)


def frame(cmd: int, payload: bytes = b"") -> bytes:
    """A request as llama.cpp's client sends it."""
    return struct.pack("<BQ", cmd, len(payload)) + payload


def describe(cmd: int) -> str:
    return NAMES[cmd] if 0 <= cmd < len(NAMES) else f"command {cmd}"
