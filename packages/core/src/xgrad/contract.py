"""What a device must provide: the typing Protocols a plugin's device object meets (`RuntimeDevice`, its `Allocator`,
the `Program` it compiles), and `runtime_device_problems`, the check `Device[...]` runs on a device a factory returns.

Imports nothing of xgrad at run time, so `xgrad.device` (which runs the check) and `xgrad.buffer` (which opens
devices through `Device`) both import it at the top. `xgrad.buffer` re-exports every name: backends import from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

if TYPE_CHECKING:
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
    most buffers (output included) one kernel may bind; the scheduler reads it (the MAX_KERNEL_BUFFERS knob wins).
    Optional method `compile_ahead(asts: list[UOp]) -> None`: the kernels one schedule runs next, in order, before
    the first runs: a device may build them at once (in parallel), so that `compile` of each then finds it built."""

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
