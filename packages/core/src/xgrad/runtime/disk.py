"""The DISK device: a file as a flat uint8 tensor (`Tensor(pathlib.Path(...))` or `DISK:/abs/path`), mapped with mmap.

DISK memory is host visible, so copies to another device read the mapping directly. DISK runs no kernels: compute
on a real device after `.to("CPU")`.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

from xgrad.device import parse_device
from xgrad.errors import DeviceError
from xgrad.uop.ops import UOp


def _file_identity(path: str) -> tuple[int, int, int] | None:
    """Which file is at `path` now: a file replaced at the same path (os.replace) must be mapped anew."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class DiskAllocator:
    def __init__(self, path: str):
        self.path = path
        self._map: mmap.mmap | None = None
        self._file_size = 0
        self._identity: tuple[int, int, int] | None = None

    def _mapping(self, nbytes: int) -> memoryview:
        identity = _file_identity(self.path)
        if self._map is None or self._file_size < nbytes or identity != self._identity:
            mode = "r+b" if os.path.exists(self.path) else "w+b"
            with open(self.path, mode) as f:
                size = os.fstat(f.fileno()).st_size
                if size < nbytes:
                    f.truncate(nbytes)
                    size = nbytes
                self._file_size = size
                self._map = mmap.mmap(f.fileno(), size) if size else None
            self._identity = _file_identity(self.path)
        return memoryview(self._map) if self._map is not None else memoryview(bytearray(0))

    def alloc(self, nbytes: int) -> Any:
        return self._mapping(nbytes)[:nbytes]

    def free(self, handle: Any, nbytes: int) -> None:
        pass

    def copyin(self, dest: Any, src: memoryview) -> None:
        dest[:] = src

    def copyout(self, dest: memoryview, src: Any) -> None:
        dest[:] = src

    def offset(self, handle: Any, offset: int, nbytes: int) -> Any:
        return handle[offset : offset + nbytes]

    def as_memoryview(self, handle: Any) -> memoryview:
        return memoryview(handle)

    def read_done(self, handle: Any) -> None:
        """After a copy out of `handle`: its whole pages leave this process's resident memory (MADV_DONTNEED; the
        file's pages stay in the OS page cache, so reading them again costs a page fault, not a disk read). Loading
        a model copies each weight once: without this, the file stays resident beside the copy (twice the RSS)."""
        if self._map is None or not isinstance(handle, memoryview) or handle.readonly or not handle.nbytes:
            return
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        start = ctypes.addressof(ctypes.c_char.from_buffer(handle)) - base
        page = mmap.PAGESIZE
        lo, hi = -(-start // page) * page, (start + handle.nbytes) // page * page  # whole pages inside the read
        if hi > lo and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class DiskDevice:
    graph: Any = None  # no device graph (see CompiledDevice.graph)

    def __init__(self, name: str):
        path = parse_device(name).path
        if not path:
            raise DeviceError(f"DISK device needs a file path, like DISK:/tmp/weights.bin (got {name!r})")
        self.name = name
        self.allocator = DiskAllocator(path)

    def compile(self, ast: UOp) -> Any:
        raise DeviceError(f"the DISK device cannot compute; move the tensor first: t.to('CPU') ({self.name})")

    def synchronize(self) -> None:
        pass
