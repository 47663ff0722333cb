"""What a device must provide (typing Protocols) and `Buffer`, a lazily allocated piece of device memory.

A backend's device object satisfies `RuntimeDevice`: a name, an `Allocator`, and `compile(ast)` that turns a kernel
AST (see `xgrad.uop.ops`) into a `Program` it can launch. Core only talks to devices through these protocols.

Buffer identity lives here too: a BUFFER node of the graph carries its `Buffer` (`new_buffer_uop`, `buffer_of`), and
every BUFFER node gets a fresh id (`new_buffer_id`), so two buffers never hash-cons into one node.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, runtime_checkable

from xgrad.device import Device
from xgrad.dtype import DType
from xgrad.errors import OutOfMemoryError
from xgrad.helpers import GlobalCounters
from xgrad.uop.ops import UOp


class Allocator(Protocol):
    """Device memory. Handles are opaque to core."""

    def alloc(self, nbytes: int) -> Any: ...

    def free(self, handle: Any, nbytes: int) -> None: ...

    def copyin(self, dest: Any, src: memoryview) -> None: ...

    def copyout(self, dest: memoryview, src: Any) -> None: ...

    def offset(self, handle: Any, offset: int, nbytes: int) -> Any: ...


@runtime_checkable
class HostVisible(Protocol):
    """An allocator whose memory the host can map directly (CPU, DISK): zero-copy reads."""

    def as_memoryview(self, handle: Any) -> memoryview: ...


_host_visible_types: dict[type, bool] = {}


def host_visible(allocator: Any) -> TypeGuard[HostVisible]:
    """`isinstance(allocator, HostVisible)`, remembered per allocator class: on Python 3.11 an isinstance check against
    a runtime-checkable Protocol lists the protocol's attributes every time (~5 us, per `Tensor.numpy()`)."""
    kind = type(allocator)
    if (hit := _host_visible_types.get(kind)) is None:
        hit = _host_visible_types[kind] = isinstance(allocator, HostVisible)
    return hit


@dataclass
class ProgramInfo:
    """Facts about a compiled kernel, for DEBUG output and GlobalCounters."""

    name: str
    src: str = ""
    ops: int = 0  # estimated operations (per launch)
    mem: int = 0  # estimated bytes moved
    global_size: Any = 1  # int, or an index expression in the kernel's variables
    var_names: tuple[str, ...] = ()
    outs: tuple[int, ...] = (0,)
    extra: dict[str, Any] = field(default_factory=dict)


class Program(Protocol):
    """A compiled kernel. `bufs` are allocator handles in PARAM order, `vals` the variable values by name."""

    info: ProgramInfo

    def __call__(self, bufs: list[Any], vals: dict[str, int], wait: bool = False) -> float | None: ...


class RuntimeDevice(Protocol):
    """What `Device[name]` returns for a device that runs kernels. Optional attribute `max_kernel_buffers: int`: the
    most buffers (output included) one kernel may bind; the scheduler reads it (the MAX_KERNEL_BUFFERS knob wins)."""

    name: str
    allocator: Allocator

    def compile(self, ast: UOp) -> Program: ...

    def synchronize(self) -> None: ...


def protocol_members(protocol: type) -> tuple[str, ...]:
    """The attributes and methods a `typing.Protocol` declares (its own, not `object`'s), sorted."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)}
    return tuple(sorted(names))


def runtime_device_problems(device: object, runs_kernels: bool = True) -> list[str]:
    """What `device` lacks of the contract a device factory must meet (empty when it meets it). Every device has a
    str `name`; one that runs kernels (`DeviceSpec.runs_kernels`) is a `RuntimeDevice` whose `allocator` is an
    `Allocator`. Checked by `Device[...]` when a factory returns, so a broken plugin is named at open time."""
    if device is None:
        return ["it returned None"]
    problems = [] if isinstance(getattr(device, "name", None), str) else ["no str attribute 'name'"]
    if not runs_kernels:
        return problems
    for member in protocol_members(RuntimeDevice):
        if member in ("name", "allocator"):
            continue
        if not callable(getattr(device, member, None)):
            problems.append(f"no method {member}()")
    allocator = getattr(device, "allocator", None)
    if allocator is None:
        problems.append("no attribute 'allocator'")
    else:
        missing = [m for m in protocol_members(Allocator) if not callable(getattr(allocator, m, None))]
        if missing:
            problems.append(f"its allocator has no method {', '.join(m + '()' for m in missing)}")
    return problems


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
