"""The emulators' device memory: allocations, host copies, per-lane loads and stores, faults outside allocations."""

import numpy as np
import pytest

from xgrad_codegen.devmem import DeviceMemory, MemoryFaultError


def test_host_copies_and_lane_access() -> None:
    mem = DeviceMemory()
    a, b = mem.alloc(64), mem.alloc(12)
    assert a % 256 == 0 and b % 256 == 0 and a != b and min(a, b) >= 1 << 32
    data = np.arange(16, dtype=np.float32)
    mem.write(a, data)
    assert np.array_equal(np.frombuffer(mem.read(a, 64), np.float32), data)
    addrs = a + 4 * np.array([3, 0, 15, 7], np.uint64)
    assert np.array_equal(mem.load(addrs, np.float32), data[[3, 0, 15, 7]])
    # lanes spread over two allocations, unaligned
    mem.store(np.array([b, b + 4, a + 2], np.uint64), np.array([1, 2, 3], np.int32))
    assert np.frombuffer(mem.read(b, 8), np.int32).tolist() == [1, 2]
    assert mem.load(np.array([a + 2], np.uint64), np.int32)[0] == 3


def test_faults_name_the_address() -> None:
    mem = DeviceMemory()
    a = mem.alloc(16)
    with pytest.raises(MemoryFaultError, match=hex(a + 16)):
        mem.load(np.array([a, a + 16], np.uint64), np.float32)
    with pytest.raises(MemoryFaultError, match="outside every allocation"):
        mem.store(np.array([a + 14], np.uint64), np.zeros(1, np.float32))  # straddles the end
    with pytest.raises(MemoryFaultError):
        mem.load(np.array([8], np.uint64), np.uint8)  # below every allocation
    mem.free(a)
    with pytest.raises(MemoryFaultError):
        mem.read(a, 4)
    with pytest.raises(MemoryFaultError, match="not the start"):
        mem.free(a)
