"""Custom kernels: `Tensor.custom_kernel(*tensors, fxn=..., grad_fxn=...)` runs a kernel written in UOps on the
tensors' buffers, as tinygrad's (an alpha API there too).

In: the tensors, each realized into one whole buffer of its own first, and `fxn`, which gets one `KernelArg` per
tensor (its shape and dtype; indexing it, `A[i]` or `A[i, j]`, gives the INDEX node of that element) and returns the
kernel's SINK of STOREs over RANGEs: xgrad's kernel AST, where an INDEX used as a value is loaded and loops are
implicit in the ranges (tinygrad's `end`, `group` and `simplify` are accepted). Out: one Tensor per argument, its
values after the kernel ran. Each is a DETACH of its buffer whose arg names the call (a CUSTOM_KERNEL node over the
kernel and the arguments' graphs), so autodiff reaches the arguments through `grad_fxn` and not through the buffer.

The kernel runs when custom_kernel is called (tinygrad's at the next realize); a TinyJit captures it as it captures
any other kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xgrad.buffer import buffer_of
from xgrad.dtype import dtypes
from xgrad.engine.realize import run_schedule
from xgrad.engine.schedule import ScheduleItem
from xgrad.errors import DeviceMismatchError, IndexingError, ShapeError, XgradError
from xgrad.helpers import prod
from xgrad.mixin.base import TensorBase
from xgrad.uop.ops import GroupOp, KernelInfo, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


class CustomKernelError(XgradError, RuntimeError):
    """`fxn` of a custom kernel returned something that is not a kernel over its arguments."""


class KernelArg:
    """One argument of a custom kernel as `fxn` sees it: a PARAM with the tensor's shape (row-major). `A[i, j]` is
    the INDEX of element (i, j), with RANGE nodes or ints as indices; `flatten()` and `reshape()` view it anew."""

    __slots__ = ("param", "shape")

    def __init__(self, param: UOp, shape: tuple[int, ...]):
        self.param = param
        self.shape = shape

    @property
    def dtype(self) -> Any:
        """The element dtype."""
        return self.param.dtype

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.shape)

    def numel(self) -> int:
        """The number of elements."""
        return int(prod(self.shape))

    def flatten(self) -> KernelArg:
        """The same buffer seen as one axis."""
        return KernelArg(self.param, (self.numel(),))

    def reshape(self, *shape: Any) -> KernelArg:
        """The same buffer seen with another shape of as many elements."""
        sizes = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if prod(sizes) != self.numel():
            raise ShapeError(f"a custom kernel argument of shape {self.shape} cannot be seen as shape {sizes}")
        return KernelArg(self.param, tuple(sizes))

    def __getitem__(self, idx: UOp | int | tuple[UOp | int, ...]) -> UOp:
        idxs = idx if isinstance(idx, tuple) else (idx,)
        if len(idxs) != len(self.shape):
            raise IndexingError(f"a custom kernel argument of shape {self.shape} takes {len(self.shape)} indices")
        linear: UOp = UOp.const(dtypes.index, 0)
        stride = 1
        for i, size in reversed(list(zip(idxs, self.shape))):
            linear = linear + (i if isinstance(i, UOp) else UOp.const(dtypes.index, i)) * stride
            stride *= size
        return self.param.index(linear)

    def index(self, *idxs: UOp | int) -> UOp:
        """`self[idxs]`."""
        return self[idxs]


# ---- finishing fxn's AST: loads where INDEX nodes are used as values, groups of stores flattened ----
def _load(u: UOp) -> UOp:
    return u.load() if u.op is Ops.INDEX else u


def load_index_values(x: UOp) -> UOp | None:
    """An INDEX used as a value (an operand, or what a STORE writes) is a LOAD of it."""
    start = 1 if x.op is Ops.STORE else 0
    if not any(s.op is Ops.INDEX for s in x.src[start:]):
        return None
    return x.replace(src=x.src[:start] + tuple(_load(s) for s in x.src[start:]))


def flatten_groups(x: UOp) -> UOp | None:
    """`UOp.group(a, b)` (a NOOP) inside the SINK: its stores become the SINK's."""
    if not any(s.op is Ops.NOOP for s in x.src):
        return None
    return x.replace(src=tuple(g for s in x.src for g in (s.src if s.op is Ops.NOOP else (s,))))


pm_finish_custom_kernel = PatternMatcher(
    [
        (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.REDUCE, Ops.STORE}, name="x"), load_index_values),
        (UPat(Ops.SINK, name="x"), flatten_groups),
    ]
)


def _finish(built: Any, nargs: int) -> UOp:
    if not isinstance(built, UOp) or built.op is not Ops.SINK:
        raise CustomKernelError(
            f"fxn of a custom kernel must return a SINK of STOREs (`store.sink(arg=KernelInfo(...))`), not {built!r}"
        )
    ast = graph_rewrite(built, pm_finish_custom_kernel, name="finish custom kernel")
    for u in ast.toposort:
        if u.op is Ops.PARAM and not 0 <= u.arg < nargs:
            raise CustomKernelError(f"the kernel reads argument {u.arg}, but the custom kernel got {nargs}")
    if not any(u.op is Ops.STORE for u in ast.toposort) and ast.src:
        raise CustomKernelError("the kernel stores nothing; write its outputs with `A[i].store(value)`")
    if not isinstance(ast.arg, KernelInfo):
        ast = ast.replace(arg=KernelInfo(name="custom"))
    return ast


def custom_kernel(
    srcs: tuple[Tensor, ...], fxn: Callable[..., Any], grad_fxn: Callable[..., Any] | None
) -> list[Tensor]:
    """Run the kernel `fxn` builds on the buffers of `srcs`; the tensors after it (see the module docstring)."""
    device = srcs[0].device
    if isinstance(device, tuple) or any(s.device != device for s in srcs):
        raise DeviceMismatchError(
            f"a custom kernel runs on one device; its arguments are on {[s.device for s in srcs]}: move them with .to()"
        )
    owned = [s if s.uop.plain_buffer else s.contiguous() for s in srcs]
    owned[0].realize(*owned[1:])
    ast = _finish(fxn(*(KernelArg(UOp(Ops.PARAM, o.dtype, (), i), o.shape) for i, o in enumerate(owned))), len(srcs))
    if ast.src:
        run_schedule([ScheduleItem(ast, tuple(buffer_of(o.uop).ensure_allocated() for o in owned), device)])
    call = UOp(Ops.CUSTOM_KERNEL, dtypes.void, (ast, *(s.uop for s in srcs)), grad_fxn)
    return [TensorBase._tensor_cls()(UOp(Ops.DETACH, o.dtype, (o.uop,), (call, i))) for i, o in enumerate(owned)]


__all__ = ["CustomKernelError", "KernelArg", "custom_kernel", "pm_finish_custom_kernel"]
