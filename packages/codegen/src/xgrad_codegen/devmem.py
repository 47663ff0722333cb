"""A GPU's global memory for the backends' emulators (the NV PTX interpreter, the AMD RDNA3 emulator).

In: allocations and frees from a mocked driver, and byte addresses computed by emulated threads. Out: numpy loads and
stores over those addresses, many lanes at once. Memory is one flat 64-bit address space of separate allocations,
each a numpy byte array at a 256-byte aligned base with a gap after it, so an address past an allocation's end is
caught (as on a GPU with a fault, never a silent read of a neighbour).
"""

from __future__ import annotations

import bisect

import numpy as np

from xgrad.errors import DeviceError

BASE = 1 << 32  # the first allocation's address: low addresses (a null pointer plus an offset) are never valid
ALIGN = 256
GAP = 4096  # unmapped bytes between allocations


class MemoryFaultError(DeviceError):
    """An emulated access outside every allocation: the address, the access size and what was nearest."""


class DeviceMemory:
    """Allocations by base address. `load`/`store` take arrays of addresses (one per lane) and move one element of a
    numpy dtype per lane; every address must fall, with its whole element, inside one allocation."""

    def __init__(self) -> None:
        self._bases: list[int] = []  # sorted
        self._arrays: dict[int, np.ndarray] = {}
        self._next = BASE

    def alloc(self, nbytes: int) -> int:
        """A new zeroed allocation of `nbytes` (at least 1); returns its address."""
        if nbytes < 0:
            raise DeviceError(f"cannot allocate {nbytes} bytes: the size must be >= 0")
        base = self._next
        self._next = -(-(base + max(nbytes, 1) + GAP) // ALIGN) * ALIGN
        bisect.insort(self._bases, base)
        self._arrays[base] = np.zeros(max(nbytes, 1), np.uint8)
        return base

    def free(self, addr: int) -> None:
        """Free the allocation at `addr` (its base address)."""
        if addr not in self._arrays:
            raise MemoryFaultError(f"free of {addr:#x}, which is not the start of a live allocation")
        del self._arrays[addr]
        self._bases.remove(addr)

    def _find(self, addr: int, nbytes: int) -> tuple[np.ndarray, int]:
        i = bisect.bisect_right(self._bases, addr) - 1
        if i >= 0:
            base = self._bases[i]
            arr = self._arrays[base]
            if addr + nbytes <= base + arr.size:
                return arr, addr - base
        raise MemoryFaultError(f"access of {nbytes} bytes at {addr:#x} is outside every allocation{self._near(addr)}")

    def _near(self, addr: int) -> str:
        i = bisect.bisect_right(self._bases, addr) - 1
        if i < 0:
            return ""
        base = self._bases[i]
        return f" (nearest: {self._arrays[base].size} bytes at {base:#x})"

    def view(self, addr: int, nbytes: int) -> np.ndarray:
        """The `nbytes` bytes at `addr` as a writeable uint8 array (a view: writes go to device memory)."""
        arr, off = self._find(addr, nbytes)
        return arr[off : off + nbytes]

    def write(self, addr: int, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Copy host bytes to `addr`."""
        src = (
            np.ascontiguousarray(data).view(np.uint8).ravel()
            if isinstance(data, np.ndarray)
            else np.frombuffer(data, np.uint8)
        )
        self.view(addr, src.size)[:] = src

    def read(self, addr: int, nbytes: int) -> bytes:
        """Copy `nbytes` bytes at `addr` to the host."""
        return self.view(addr, nbytes).tobytes()

    def _resolve(self, addrs: np.ndarray, itemsize: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Group lanes by allocation: (lane indexes, byte offsets, that allocation's bytes) per allocation touched."""
        addrs = np.asarray(addrs, np.uint64).ravel()
        if addrs.size == 0:
            return []
        bases = np.asarray(self._bases, np.uint64)
        idx = np.searchsorted(bases, addrs, side="right").astype(np.int64) - 1
        out = []
        for i in np.unique(idx):
            lanes = np.nonzero(idx == i)[0]
            if i < 0:
                self._find(int(addrs[lanes[0]]), itemsize)  # raises
            arr = self._arrays[int(bases[i])]
            offs = (addrs[lanes] - bases[i]).astype(np.int64)
            bad = offs + itemsize > arr.size
            if bad.any():
                self._find(int(addrs[lanes[bad][0]]), itemsize)  # raises with the address
            out.append((lanes, offs, arr))
        return out

    def load(self, addrs: np.ndarray, dtype: np.dtype | type) -> np.ndarray:
        """One element of `dtype` from each address (any alignment)."""
        dt = np.dtype(dtype)
        res = np.empty(np.asarray(addrs).size, dt)
        raw = res.view(np.uint8).reshape(-1, dt.itemsize)
        for lanes, offs, arr in self._resolve(addrs, dt.itemsize):
            raw[lanes] = arr[offs[:, None] + np.arange(dt.itemsize)]
        return res

    def store(self, addrs: np.ndarray, values: np.ndarray) -> None:
        """Store `values[i]` at `addrs[i]`; where lanes store to one address, the highest lane's value is kept."""
        vals = np.ascontiguousarray(values).ravel()
        raw = vals.view(np.uint8).reshape(-1, vals.dtype.itemsize)
        for lanes, offs, arr in self._resolve(addrs, vals.dtype.itemsize):
            arr[offs[:, None] + np.arange(vals.dtype.itemsize)] = raw[lanes]
