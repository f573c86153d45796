"""edgespec rpc-server's checks (edgespec/engine/rpc_protocol.py) in process: what a client sends
passes, what would reach one of llama.cpp's asserts is refused with its reason, and weights beyond a
session's share of --cache are set but not written."""

from __future__ import annotations

import re
import struct

import pytest

from tests.support.rpc_wire import COMPUTE, OP_ADD, graph, tensor

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")


@pytest.fixture(scope="module")
def checks_of():
    from edgespec.engine.rpc_child import type_traits
    from edgespec.engine.rpc_protocol import Checks

    traits = type_traits()
    assert (traits.block[0], traits.size[0]) == (1, 4) and (traits.block[8], traits.size[8]) == (32, 34)

    def make(cache_dir=None, memory=1 << 30):
        checks = Checks(traits, (memory,), cache_dir)
        checks.alloc(struct.pack("<IQ", 0, 4096))
        checks.allocated_buffer(struct.pack("<IQ", 0, 4096), 0x1000, 4096, 0x10000)
        return checks

    return make


def test_the_checks_pass_what_a_client_sends_and_name_what_they_refuse(checks_of):
    from edgespec.engine.rpc_protocol import ALLOC_BUFFER, FREE_BUFFER, Refused

    checks = checks_of()
    a = tensor(1, buffer=0x1000, data=0x10000, ne=(4, 2, 1, 1))
    c = tensor(2, buffer=0x1000, data=0x10020, ne=(4, 2, 1, 1), op=OP_ADD, src=(1, 1), flags=COMPUTE)
    checks.graph(graph([2], [a, c]))
    refusals = {
        "outside its buffer (1044544 bytes past its end)": graph(  # the issue's: 1 MiB past a 4 KiB buffer
            [1], [tensor(1, buffer=0x1000, data=0x10000 + (1 << 20), ne=(16, 1, 1, 1))]
        ),
        "a null node, or a node listed twice": graph([2, 2], [a, c]),
        "outside this session's buffers": graph([1], [tensor(1, buffer=0x2000, data=0x10000)]),
        "more than 2^62 elements": graph([1], [tensor(1, buffer=0x1000, ne=(2**32 - 1,) * 4)]),
        "whole number of its type's blocks": graph([1], [tensor(1, buffer=0x1000, data=0x10000, type=8)]),
    }
    for why, message in refusals.items():
        with pytest.raises(Refused, match=re.escape(why)):
            checks.graph(message)
    head = a + b"\x00" + struct.pack("<Q", 0)
    assert checks.set_tensor(head, 32) == head  # the whole tensor
    with pytest.raises(Refused, match="SET_TENSOR: 33 bytes at offset 0 of a tensor of 32 bytes"):
        checks.set_tensor(head, 33)  # ggml_backend_tensor_set's assert
    with pytest.raises(Refused, match="ALLOC_BUFFER of 1073741824 bytes: beyond the device's memory"):
        checks.check(ALLOC_BUFFER, struct.pack("<IQ", 0, 1 << 30))
    with pytest.raises(Refused, match="buffer 0x2000 is not one of this session's"):
        checks.check(FREE_BUFFER, struct.pack("<Q", 0x2000))


def test_weights_cached_beyond_the_devices_memory_are_set_but_not_written(checks_of, tmp_path):
    checks = checks_of(cache_dir=str(tmp_path), memory=4096)
    head = tensor(1, buffer=0x1000, data=0x10000, ne=(1024, 1, 1, 1)) + b"\x01" + struct.pack("<Q", 0)
    assert checks.set_tensor(head, 4096) == head  # within the session's share: cached
    cleared = checks.set_tensor(head, 4096)  # beyond it: the flag cleared, the data set all the same
    assert cleared[296] == 0 and cleared[:296] == head[:296] and cleared[297:] == head[297:]
