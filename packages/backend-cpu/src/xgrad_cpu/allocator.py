"""Host memory for the CPU device: 64-byte aligned buffers with zero-copy memoryviews, and an LRU cache of freed blocks.

Small buffers live in a `bytearray` (over-allocated by the alignment and offset into); big ones in an anonymous
`mmap` (page aligned, handed back to the OS when the last reference goes, eligible for transparent huge pages).
Both are plain Python objects, so the memory stays alive exactly as long as some `CPUBuffer` or memoryview refers
to it: an offset view keeps its base alive without any bookkeeping here.
"""

from __future__ import annotations

import ctypes
import mmap
from collections import OrderedDict

ALIGN = 64
MMAP_THRESHOLD = 1 << 17  # at or above this many bytes, use mmap (glibc malloc's default switch point)
HUGEPAGE_THRESHOLD = 1 << 21
DEFAULT_CACHE_LIMIT = 1 << 30  # bytes of freed blocks kept for reuse


class CPUBuffer:
    """An opaque handle: `ptr` is the data address, `nbytes` the size; `base` is the buffer an offset view came from."""

    __slots__ = ("_mv", "base", "nbytes", "ptr")

    def __init__(self, ptr: int, nbytes: int, mv: memoryview, base: CPUBuffer | None = None) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.base = base
        self._mv = mv  # exactly this buffer's bytes; it also keeps the backing bytearray/mmap alive

    def __repr__(self) -> str:
        view = f", view of {self.base.ptr:#x}" if self.base is not None else ""
        return f"<CPUBuffer {self.ptr:#x} {self.nbytes} bytes{view}>"


def _address(obj: bytearray | mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(obj))


def _new_block(nbytes: int) -> CPUBuffer:
    if nbytes >= MMAP_THRESHOLD:
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if nbytes >= HUGEPAGE_THRESHOLD and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        return CPUBuffer(_address(mm), nbytes, memoryview(mm))
    raw = bytearray(nbytes + ALIGN)  # + ALIGN also makes zero-size buffers point at real memory
    pad = -_address(raw) % ALIGN
    return CPUBuffer(_address(raw) + pad, nbytes, memoryview(raw)[pad : pad + nbytes])


class CPUAllocator:
    """The CPU device's allocator. `free` keeps up to `cache_limit` bytes of blocks for reuse by the next `alloc` of
    the same size (most recently freed first); the caller must not touch a freed handle, its views or memoryviews."""

    def __init__(self, cache_limit: int = DEFAULT_CACHE_LIMIT) -> None:
        self.cache_limit = cache_limit
        self.cached_bytes = 0
        self._cache: OrderedDict[int, list[CPUBuffer]] = OrderedDict()  # nbytes -> free blocks, least recent first

    def alloc(self, nbytes: int) -> CPUBuffer:
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes: {nbytes}")
        if (blocks := self._cache.get(nbytes)) is not None:
            buf = blocks.pop()
            if not blocks:
                del self._cache[nbytes]
            self.cached_bytes -= nbytes
            return buf
        try:
            return _new_block(nbytes)
        except MemoryError:
            self.free_cache()
            return _new_block(nbytes)

    def free(self, handle: CPUBuffer, nbytes: int) -> None:
        assert handle.base is None, "free the base buffer, not an offset view"
        assert nbytes == handle.nbytes, f"free of {nbytes} bytes but the buffer has {handle.nbytes}"
        if nbytes > self.cache_limit:
            return
        self._cache.setdefault(nbytes, []).append(handle)
        self._cache.move_to_end(nbytes)
        self.cached_bytes += nbytes
        while self.cached_bytes > self.cache_limit:
            size, blocks = next(iter(self._cache.items()))
            blocks.pop(0)
            if not blocks:
                del self._cache[size]
            self.cached_bytes -= size

    def free_cache(self) -> None:
        """Drop every cached block (their memory goes back to Python / the OS)."""
        self._cache.clear()
        self.cached_bytes = 0

    def copyin(self, dest: CPUBuffer, src: memoryview) -> None:
        if src.format != "B" or src.ndim != 1:
            src = src.cast("B")
        if src.nbytes != dest.nbytes:
            raise ValueError(f"copyin of {src.nbytes} bytes into a buffer of {dest.nbytes} bytes")
        dest._mv[:] = src

    def copyout(self, dest: memoryview, src: CPUBuffer) -> None:
        if dest.format != "B" or dest.ndim != 1:
            dest = dest.cast("B")
        if dest.nbytes != src.nbytes:
            raise ValueError(f"copyout of a buffer of {src.nbytes} bytes into {dest.nbytes} bytes")
        dest[:] = src._mv

    def offset(self, handle: CPUBuffer, offset: int, nbytes: int) -> CPUBuffer:
        if offset < 0 or nbytes < 0 or offset + nbytes > handle.nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) is outside a buffer of {handle.nbytes} bytes")
        base = handle.base if handle.base is not None else handle
        return CPUBuffer(handle.ptr + offset, nbytes, handle._mv[offset : offset + nbytes], base)

    def as_memoryview(self, handle: CPUBuffer) -> memoryview:
        return handle._mv[:]  # a fresh view: releasing it must not release the buffer's own
