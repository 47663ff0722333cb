"""What a device must provide (typing Protocols) and `Buffer`, a lazily allocated piece of device memory.

A backend's device object satisfies `RuntimeDevice`: a name, an `Allocator`, and `compile(ast)` that turns a kernel
AST (see `xgrad.uop.ops`) into a `Program` it can launch. Core only talks to devices through these protocols; they
are defined in `xgrad.contract` (which `xgrad.device` imports without a cycle) and re-exported here.

Buffer identity lives here too: a BUFFER node of the graph carries its `Buffer` (`new_buffer_uop`, `buffer_of`), and
every BUFFER node gets a fresh id (`new_buffer_id`), so two buffers never hash-cons into one node.
"""

from __future__ import annotations

import itertools
from typing import Any

from xgrad.contract import Allocator as Allocator
from xgrad.contract import HostVisible as HostVisible
from xgrad.contract import Program as Program
from xgrad.contract import ProgramInfo as ProgramInfo
from xgrad.contract import RuntimeDevice as RuntimeDevice
from xgrad.contract import host_visible as host_visible
from xgrad.contract import protocol_members as protocol_members
from xgrad.contract import runtime_device_problems as runtime_device_problems
from xgrad.device import Device
from xgrad.dtype import DType
from xgrad.errors import OutOfMemoryError
from xgrad.helpers import GlobalCounters
from xgrad.uop.ops import UOp


class Buffer:
    """`size` elements of `dtype` on `device`, allocated on first use. A view (`base` given) shares its base's memory
    from byte `offset`."""

    def __init__(self, device: str, size: int, dtype: DType, base: Buffer | None = None, offset: int = 0):
        self.device = device
        self.size = size
        self.dtype = dtype
        self.base = base
        self.offset = offset
        self._handle: Any = None
        self._allocator: Allocator | None = None  # the allocator that made `_handle`, which frees it

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_allocated(self) -> bool:
        return self._handle is not None

    def _runtime(self) -> Any:
        return Device[self.device]

    @property
    def allocator(self) -> Allocator:
        return self._runtime().allocator  # type: ignore[no-any-return]

    def ensure_allocated(self) -> Buffer:
        if self._handle is None:
            alloc = self.allocator
            if self.base is not None:
                self.base.ensure_allocated()
                self._handle = alloc.offset(self.base._handle, self.offset, self.nbytes)
            else:
                try:
                    self._handle = alloc.alloc(self.nbytes)
                except (MemoryError, OSError) as e:
                    raise OutOfMemoryError(
                        f"{self.device} could not allocate {self.nbytes:,} bytes ({self.size:,} x {self.dtype.name}): "
                        f"{e}; use smaller tensors, free others, or move the work to a device with more memory"
                    ) from None
                self._allocator = alloc
                GlobalCounters.mem_used += self.nbytes
                per_device = GlobalCounters.mem_used_per_device
                per_device[self.device] = per_device.get(self.device, 0) + self.nbytes
        return self

    @property
    def handle(self) -> Any:
        return self.ensure_allocated()._handle

    def copyin(self, data: memoryview) -> Buffer:
        data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        assert data.nbytes == self.nbytes, f"copyin of {data.nbytes} bytes into a buffer of {self.nbytes}"
        self.allocator.copyin(self.handle, data)
        return self

    def copyout(self, dest: memoryview) -> memoryview:
        dest = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
        assert dest.nbytes == self.nbytes, f"copyout of {self.nbytes} bytes into {dest.nbytes}"
        self._runtime().synchronize()
        self.allocator.copyout(dest, self.handle)
        return dest

    def as_bytes(self) -> memoryview:
        """The contents as host bytes (zero-copy where the memory is host visible)."""
        alloc = self.allocator
        if host_visible(alloc):
            self._runtime().synchronize()
            return alloc.as_memoryview(self.handle)
        return self.copyout(memoryview(bytearray(self.nbytes)))

    def __del__(self) -> None:
        if self._allocator is not None:
            try:
                GlobalCounters.mem_used -= self.nbytes
                GlobalCounters.mem_used_per_device[self.device] -= self.nbytes
                self._allocator.free(self._handle, self.nbytes)
            except Exception:  # interpreter shutdown: the device may be gone
                pass

    def __repr__(self) -> str:
        return f"<Buffer {self.device} {self.size} {self.dtype.name}{' view' if self.base is not None else ''}>"


# ---- buffer identity: BUFFER nodes of the graph and the Buffers they hold ----
_buffer_ids = itertools.count()


def new_buffer_id() -> int:
    """A fresh id for a BUFFER node (ids only grow: a node numbered below an id existed before it was drawn)."""
    return next(_buffer_ids)


def new_buffer_uop(device: str, size: int, dtype: DType) -> UOp:
    """A BUFFER node with a fresh Buffer attached (allocated when first used)."""
    uop = UOp.buffer(device, size, dtype, next(_buffer_ids))
    uop.__dict__["buffer"] = Buffer(device, size, dtype)
    # its shape and device, known here: computing them on first use (cached_property misses) cost ~10 us of a cold
    # cached realize, and reading the result (`Tensor.numpy()`) asks for the device
    uop.__dict__["shape"] = (int(size),)
    uop.__dict__["device"] = device
    return uop


def buffer_of(u: UOp) -> Buffer:
    """The Buffer behind a realized node (a BUFFER node, or movement ops on one)."""
    buf: Buffer = u.base.__dict__["buffer"]
    return buf
