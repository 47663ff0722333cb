import ctypes
import gc
import os

import pytest

from xgrad_cpu.allocator import MMAP_THRESHOLD, CPUAllocator

SIZES = [0, 1, 3, 63, 64, 65, 1000, MMAP_THRESHOLD - 1, MMAP_THRESHOLD, 3 << 20]


@pytest.mark.parametrize("nbytes", SIZES)
def test_alloc_is_64_byte_aligned_any_size(nbytes: int) -> None:
    alloc = CPUAllocator()
    bufs = [alloc.alloc(nbytes) for _ in range(4)]
    for buf in bufs:
        assert buf.ptr % 64 == 0
        assert buf.ptr != 0
        assert buf.nbytes == nbytes


@pytest.mark.parametrize("nbytes", SIZES)
def test_copyin_copyout_round_trip_any_size(nbytes: int) -> None:
    alloc = CPUAllocator()
    data = os.urandom(nbytes)
    buf = alloc.alloc(nbytes)
    alloc.copyin(buf, memoryview(data))
    out = bytearray(nbytes)
    alloc.copyout(memoryview(out), buf)
    assert bytes(out) == data
    assert ctypes.string_at(buf.ptr, nbytes) == data  # the bytes really live at .ptr


def test_as_memoryview_is_zero_copy_and_writable() -> None:
    alloc = CPUAllocator()
    buf = alloc.alloc(16)
    mv = alloc.as_memoryview(buf)
    assert mv.format == "B" and mv.nbytes == 16 and not mv.readonly
    mv[3] = 7
    ctypes.memset(buf.ptr + 5, 9, 1)
    assert mv[5] == 9
    out = bytearray(16)
    alloc.copyout(memoryview(out), buf)
    assert out[3] == 7 and out[5] == 9


def test_as_memoryview_release_keeps_buffer_usable() -> None:
    alloc = CPUAllocator()
    buf = alloc.alloc(8)
    alloc.as_memoryview(buf).release()
    alloc.copyin(buf, memoryview(b"abcdefgh"))
    assert bytes(alloc.as_memoryview(buf)) == b"abcdefgh"


@pytest.mark.parametrize("nbytes", [256, 4 * MMAP_THRESHOLD])
def test_offset_view_shares_memory_with_base(nbytes: int) -> None:
    alloc = CPUAllocator()
    base = alloc.alloc(nbytes)
    view = alloc.offset(base, 64, 32)
    assert view.ptr == base.ptr + 64 and view.nbytes == 32
    alloc.copyin(view, memoryview(bytes(range(32))))
    assert bytes(alloc.as_memoryview(base)[64:96]) == bytes(range(32))
    inner = alloc.offset(view, 8, 4)  # a view of a view points into the same base
    assert inner.ptr == base.ptr + 72 and inner.base is base
    assert bytes(alloc.as_memoryview(inner)) == bytes(range(8, 12))


def test_offset_view_keeps_base_alive_when_base_dropped() -> None:
    alloc = CPUAllocator(cache_limit=0)
    base = alloc.alloc(4 * MMAP_THRESHOLD)
    alloc.copyin(base, memoryview(b"\x05" * base.nbytes))
    view = alloc.offset(base, base.nbytes - 16, 16)
    del base
    gc.collect()
    assert ctypes.string_at(view.ptr, 16) == b"\x05" * 16


def test_offset_outside_buffer_raises() -> None:
    alloc = CPUAllocator()
    buf = alloc.alloc(16)
    with pytest.raises(ValueError):
        alloc.offset(buf, 8, 9)


def test_copyin_size_mismatch_raises() -> None:
    alloc = CPUAllocator()
    buf = alloc.alloc(16)
    with pytest.raises(ValueError):
        alloc.copyin(buf, memoryview(b"x" * 15))


def test_copyin_accepts_typed_memoryview_as_bytes() -> None:
    alloc = CPUAllocator()
    buf = alloc.alloc(8)
    alloc.copyin(buf, memoryview(bytearray(8)).cast("i"))
    assert bytes(alloc.as_memoryview(buf)) == bytes(8)


def test_free_then_alloc_reuses_block_of_same_size() -> None:
    alloc = CPUAllocator()
    buf = alloc.alloc(1000)
    ptr = buf.ptr
    alloc.free(buf, 1000)
    assert alloc.cached_bytes == 1000
    reused = alloc.alloc(1000)
    assert reused.ptr == ptr
    assert alloc.cached_bytes == 0
    assert alloc.alloc(1000).ptr != reused.ptr


def test_free_evicts_least_recent_sizes_when_over_cache_limit() -> None:
    alloc = CPUAllocator(cache_limit=3000)
    a, b, c = alloc.alloc(1000), alloc.alloc(1500), alloc.alloc(1200)
    alloc.free(a, 1000)
    alloc.free(b, 1500)
    alloc.free(c, 1200)  # over the limit: the 1000-byte block (least recent) goes
    assert alloc.cached_bytes == 2700
    assert alloc.alloc(1000).ptr != a.ptr  # a is still referenced here, so its address cannot come back
    alloc.free_cache()
    assert alloc.cached_bytes == 0
