"""`Tensor`: a lazy n-dimensional array. Methods build a UOp graph; `realize()` schedules it into kernels and runs them.

Only the primitive ops become UOps (EXP2 LOG2 SIN SQRT RECIPROCAL NEG TRUNC, the binary ALU ops, WHERE, CAST,
BITCAST, the movement ops, REDUCE_AXIS); everything else is composed of them here.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import numpy as np

from xgrad.dtype import (
    DType,
    bf16_bits_to_float,
    dtypes,
    fp8_bits_to_float,
    from_np_dtype,
    to_dtype,
    to_np_dtype,
)
from xgrad.engine.capture import capturing
from xgrad.engine.realize import (
    Linear,
    all_tensors,
    lazy_tensors,
    note_view_assign,
    realize_base,
    realize_tensors,
    schedule_tensors,
    view_memory,
)
from xgrad.engine.schedule import buffer_of, new_buffer_uop
from xgrad.errors import (
    DeviceMismatchError,
    DTypeError,
    JitError,
    ShapeError,
)
from xgrad.helpers import TRAINING
from xgrad.hostdata import list_to_np, np_to_uop
from xgrad.mixin.autograd import AutogradMixin
from xgrad.mixin.bitwise import BitwiseMixin
from xgrad.mixin.common import Scalar, canonical_device, scalar_dtype
from xgrad.mixin.conv import ConvMixin
from xgrad.mixin.creation import CreationMixin
from xgrad.mixin.elementwise import ElementwiseMixin
from xgrad.mixin.gather import GatherMixin
from xgrad.mixin.indexing import IndexingMixin
from xgrad.mixin.linalg import LinalgMixin
from xgrad.mixin.movement import MovementMixin
from xgrad.mixin.multi import MultiMixin
from xgrad.mixin.nn import NNMixin
from xgrad.mixin.random import RandomMixin
from xgrad.mixin.reduce import ReduceMixin
from xgrad.mixin.sort import SortMixin
from xgrad.mixin.symbolic_shapes import SymbolicShapeMixin
from xgrad.mixin.unary import UnaryMixin
from xgrad.uop.ops import Ops, UOp

_set = object.__setattr__  # Tensor.__setattr__ less its bookkeeping, where the caller does that itself


class _TensorType(type):
    """Tensor's metaclass, for tinygrad's class-level `Tensor.training`: the TRAINING knob, read and set."""

    @property
    def training(cls) -> bool:
        return bool(TRAINING)

    @training.setter
    def training(cls, mode: bool) -> None:
        TRAINING.value = int(mode)


class Tensor(
    AutogradMixin,
    MultiMixin,
    NNMixin,
    SortMixin,
    ConvMixin,
    LinalgMixin,
    IndexingMixin,
    GatherMixin,
    RandomMixin,
    CreationMixin,
    ReduceMixin,
    UnaryMixin,
    BitwiseMixin,
    ElementwiseMixin,
    MovementMixin,
    SymbolicShapeMixin,
    metaclass=_TensorType,
    concrete=True,
):
    """A lazy tensor.

    Attributes: `uop` is the graph node the tensor stands for (a BUFFER once realized); `grad` holds the gradient
    that `backward()` accumulated (None before); `is_param` says whether an optimizer given the tensor trains it (True
    for every tensor, as in tinygrad: the results of ops too; `is_param_(False)` marks a buffer, such as a running
    statistic, that an optimizer only realizes). `requires_grad` is None unless set (`Tensor(..., requires_grad=...)`,
    `requires_grad_()`, the `requires_grad=` of the creation methods; torch's flag, an alias xgrad keeps): False
    also keeps the tensor out of `backward()` (an input batch's gradient is then not computed each step) and sets
    `is_param` False; True sets `is_param` and gives a 0-d constant a buffer of its own, so it can have a gradient.

    >>> Tensor([1, 2, 3]).tolist()
    [1, 2, 3]
    >>> x = Tensor([3.0])
    >>> x.is_param, x.grad is None, x.uop.shape
    (True, True, (1,))
    >>> _ = (x * x).sum().backward()
    >>> x.grad.tolist()
    [6.0]
    >>> Tensor([1.0]).requires_grad, Tensor([1.0], requires_grad=False).is_param
    (None, False)
    """

    __slots__ = ("uop", "grad", "is_param", "_requires_grad", "__weakref__")

    def __init__(
        self,
        data: Any = None,
        device: str | None = None,
        dtype: DType | str | None = None,
        requires_grad: bool | None = None,
    ):
        dt = to_dtype(dtype) if dtype is not None else None
        if isinstance(data, UOp):
            self.uop = data
        else:
            # a file is a DISK tensor and needs no default device: with core alone (no backend) files still load
            dev = canonical_device(device) if not isinstance(data, pathlib.Path) else "DISK"
            if data is None:
                data = 0
            if isinstance(data, (bool, int, float)):
                d = dt or scalar_dtype(data)
                self.uop = UOp.const(d, data, dev, ())
            elif isinstance(data, bytes):  # the bytes of the values, in `dtype` (uint8 unless given), as tinygrad
                want = dt or dtypes.uint8
                if len(data) % want.itemsize:
                    raise ShapeError(
                        f"{len(data)} bytes are not a whole number of {want.name} values (a multiple of "
                        f"{want.itemsize} bytes); pass the bytes of whole values"
                    )
                # bfloat16 and fp8 have no numpy dtype: read as the unsigned int of their size, then reinterpreted
                raw = want if to_np_dtype(want) is not None else _UINT_OF_SIZE[want.itemsize]
                self.uop = np_to_uop(np.frombuffer(data, dtype=to_np_dtype(raw)), dev, raw)
                if raw != want:
                    self.uop = self.uop.bitcast(want)
            elif isinstance(data, (list, tuple)):
                arr, inferred = list_to_np(data, dt)
                self.uop = np_to_uop(arr, dev, inferred)
            elif isinstance(data, np.ndarray):
                if not data.dtype.isnative:  # big-endian data: the same values in this machine's byte order
                    data = data.astype(data.dtype.newbyteorder("="))
                self.uop = (
                    np_to_uop(data, dev, dt)
                    if data.shape != ()
                    else UOp.const(dt or from_np_dtype(data.dtype), data.item(), dev, ())
                )
            elif isinstance(data, pathlib.Path):
                self.uop = new_buffer_uop(f"DISK:{data.resolve()}", data.stat().st_size, dtypes.uint8)
            else:
                raise DTypeError(
                    f"cannot make a Tensor from {type(data).__name__}; use a number, list, bytes, "
                    "numpy array or pathlib.Path"
                )
            if dt is not None and self.uop.dtype != dt:
                self.uop = self.uop.cast(dt)
        self.grad: Tensor | None = None
        self.is_param: bool = requires_grad is not False
        self._requires_grad: bool | None = requires_grad
        if requires_grad and self.uop.op is Ops.CONST:
            self._own_buffer()
        all_tensors.add(self)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "uop" and not value.plain_buffer:
            lazy_tensors.add(self)  # a later realize may have to point it at a buffer

    def _new(self, uop: UOp) -> Tensor:
        """A Tensor for a new graph node (what `Tensor(uop)` makes, without the checks for other kinds of data)."""
        t = self._operand(uop)
        all_tensors.add(t)
        if not uop.plain_buffer:
            lazy_tensors.add(t)
        return t

    def _operand(self, uop: UOp) -> Tensor:
        """A Tensor for a node that the op making it consumes at once (a Python scalar broadcast to the other
        operand's shape): it joins neither live set, since no realize needs to point it at a buffer and no backward
        gives it a gradient, and `x * 2` costs ~2 us less (of ~13). `_new` is this plus the bookkeeping."""
        t = Tensor.__new__(Tensor)
        _set(t, "uop", uop)
        _set(t, "grad", None)
        _set(t, "is_param", True)
        _set(t, "_requires_grad", None)
        return t

    # ---- realization and data ----
    def realize(self, *lst: Tensor) -> Tensor:
        """Compute this tensor (and `lst`) now. Returns self.

        >>> t = (Tensor([1, 2]) + 1).realize()
        >>> t.tolist()
        [2, 3]"""
        realize_tensors([self, *lst])
        return self

    def linear_with_vars(self, *lst: Tensor) -> tuple[Linear, dict[str, int]]:
        """tinygrad's: the steps that realize this tensor (and `lst`), not run yet, and the values of the bound
        Variables they need. The tensors point at their buffers at once; `run_linear(linear, var_vals)` (from
        `xgrad.engine.realize`) fills them.

        >>> from xgrad.engine.realize import run_linear
        >>> t = Tensor([1, 2]) + 1
        >>> linear, var_vals = t.linear_with_vars()
        >>> len(linear.src), var_vals
        (1, {})
        >>> run_linear(linear, var_vals)
        >>> t.tolist()
        [2, 3]
        """
        items, var_vals = schedule_tensors([self, *lst])
        return Linear(items), var_vals

    def schedule_linear(self, *lst: Tensor) -> Linear:
        """tinygrad's: the steps that realize this tensor (and `lst`), for graphs without bound Variables (use
        `linear_with_vars` for those).

        >>> from xgrad.engine.realize import run_linear
        >>> a = Tensor([1.0, 2.0]) * 2
        >>> linear = a.schedule_linear()
        >>> run_linear(linear)
        >>> a.tolist()
        [2.0, 4.0]
        """
        linear, var_vals = self.linear_with_vars(*lst)
        if var_vals:
            raise ShapeError(
                f"schedule_linear of a graph with bound Variables {sorted(var_vals)}: use linear_with_vars, which "
                "also returns their values"
            )
        return linear

    def contiguous(self) -> Tensor:
        """The same values in a buffer of their own (a kernel boundary): a strided view is materialized.

        >>> Tensor([[1, 2], [3, 4]]).T.contiguous().tolist()
        [[1, 3], [2, 4]]"""
        return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def detach(self) -> Tensor:
        """The same values, cut off from the graph: no gradient flows back through it.

        >>> x = Tensor([2.0]).is_param_()
        >>> _ = (x * x.detach()).sum().backward()
        >>> x.grad.tolist()  # d(x * c)/dx = c = 2
        [2.0]"""
        return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)))

    def clone(self, device: str | tuple[str, ...] | None = None) -> Tensor:
        """A copy with a buffer of its own (on `device` when given), and a clone of `grad` when there is one: later
        assigns to either leave the other alone.

        >>> t = Tensor([1.0, 2.0]).realize()
        >>> c = t.clone()
        >>> _ = t.assign(Tensor([5.0, 6.0])).realize()
        >>> c.tolist(), t.tolist()
        ([1.0, 2.0], [5.0, 6.0])
        """
        src = self if device is None else self.to(device)
        if isinstance(src.device, tuple) or any(isinstance(s, UOp) for s in src.shape):
            out = src.contiguous()
        else:  # a new buffer, assigned: a lazy contiguous() is hash-consed, so two clones of one value were one node
            out = Tensor.empty(*src.shape, dtype=src.dtype, device=src.device).assign(src)
        if self.grad is not None:
            out.grad = self.grad.clone(device)
        out.is_param = self.is_param
        return out

    def replace(self, x: Tensor) -> Tensor:
        """Make this tensor stand for `x`'s values (its graph, dtype and device; the shapes must match), in place,
        without computing anything; returns self. Unlike `assign`, nothing is written into this tensor's buffer.

        >>> t = Tensor([1.0, 2.0])
        >>> t.replace(Tensor([3, 4])).tolist()
        [3, 4]
        """
        if x.shape != self.shape:
            raise ShapeError(f"replace needs the same shape: this tensor has {self.shape}, the new value {x.shape}")
        self.uop = x.uop
        return self

    def to(self, device: str | tuple[str, ...] | None) -> Tensor:
        """A copy on `device` (self when already there); a tuple of devices replicates onto each.

        >>> Tensor([1, 2]).to(Tensor([0]).device).tolist()
        [1, 2]"""
        if isinstance(device, tuple) or isinstance(self.device, tuple):
            return self._to_multi(device)
        dev = canonical_device(device)
        if dev == self.device:
            return self
        out = Tensor(UOp(Ops.COPY, self.dtype, (self.uop, UOp(Ops.DEVICE, arg=dev)))).is_param_(self.is_param)
        if self.grad is not None:  # as tinygrad: the gradient moves with the tensor
            out.grad = self.grad.to(dev)
        return out

    def _host_bytes(self) -> memoryview:
        if capturing():
            raise JitError(
                "reading tensor data inside a TinyJit capture would not be replayed; return the tensor "
                "from the jitted function and read it outside"
            )
        if isinstance(self.device, tuple):  # a multi-device tensor is read from its first device
            return self.to(self.device[0])._host_bytes()
        if _is_disk(self.device) and not _is_plain_buffer(self.uop):  # DISK runs no kernels: read the view's bytes
            realize_base(self)
            return memoryview(bytearray(view_memory(self.uop).as_bytes()))
        if self.uop.op is Ops.ASSIGN:  # a pending assign runs once: realized, self stands for the buffer it wrote
            self.realize()
        # realize a contiguous copy, not self: self keeps its graph (gradients can still flow through it)
        t = self if _is_plain_buffer(self.uop) else self.contiguous()
        t.realize()
        if self.numel() == 0:
            return memoryview(b"")
        return memoryview(bytearray(buffer_of(t.uop).as_bytes()))  # a copy: t's buffer may be reused once t is gone

    def numpy(self) -> np.ndarray:
        """The values as a numpy array (bfloat16 and fp8 come back as float32).

        >>> a = Tensor([[1, 2], [3, 4]]).numpy()
        >>> type(a).__name__, a.shape, a.dtype.name
        ('ndarray', (2, 2), 'int32')"""
        if (concrete := self._resolved()) is not self:  # a symbolic shape: read at the bound values
            return concrete.numpy()
        raw = np.frombuffer(self._host_bytes(), dtype=np.uint8)
        if self.dtype == dtypes.bfloat16:
            out = bf16_bits_to_float(raw.view(np.uint16))
        elif dtypes.is_fp8(self.dtype):
            out = fp8_bits_to_float(raw, self.dtype)
        else:
            np_dt = to_np_dtype(self.dtype)
            assert np_dt is not None
            out = raw.view(np_dt)
        return out.reshape(self.shape)

    def tolist(self) -> Any:
        """The values as (nested) Python lists; a 0-d tensor gives a scalar.

        >>> Tensor([[1, 2], [3, 4]]).tolist(), Tensor(3.5).tolist()
        ([[1, 2], [3, 4]], 3.5)"""
        result: Any = self.numpy().tolist()
        return result

    def item(self) -> Scalar:
        """The value of a one-element tensor as a Python scalar.

        >>> Tensor([[7]]).item(), Tensor(2.5).item()
        (7, 2.5)"""
        if self.numel() != 1:
            raise ShapeError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        value: Scalar = self.numpy().reshape(()).item()
        return value

    def data(self) -> memoryview:
        """A copy of the values as a memoryview in the dtype's struct format, shaped like the tensor (a 0-d tensor
        gives a 0-d view, an empty one a 1-d empty view, as tinygrad's); raw bytes for bfloat16 and fp8, and for
        float16 before Python 3.12 (whose memoryview cannot cast to half).

        >>> Tensor([[1, 2], [3, 4]]).data().tolist()
        [[1, 2], [3, 4]]
        """
        if (concrete := self._resolved()) is not self:  # a symbolic shape: read at the bound values
            return concrete.data()
        fmt = self.dtype.fmt
        if fmt == "e" and sys.version_info < (3, 12):  # memoryview casts to half from Python 3.12 on
            fmt = None
        if fmt is None:  # bfloat16 and fp8 (and float16 before Python 3.12): the raw bytes
            return self._host_bytes()
        if self.numel() == 0:  # tinygrad's: a 1-d empty view in the dtype's format
            empty: memoryview = memoryview(bytearray(0)).cast(fmt)  # type: ignore[call-overload]
            return empty
        shaped: memoryview = self._host_bytes().cast(fmt, self.shape)  # type: ignore[call-overload]
        return shaped

    def assign(self, x: Tensor | Scalar | list[Any]) -> Tensor:
        """Write `x` into this tensor's memory (in place). Into a view of a buffer (`t[1:3].assign(v)`), the write
        belongs to the buffer: reading `t` runs it, as in tinygrad. A DISK tensor is written at once, from a value on
        any device. A single-device value assigned to a multi-device tensor is copied or sharded like it.

        >>> t = Tensor([1.0, 2.0, 3.0]).realize()
        >>> _ = t[1:].assign(Tensor([5.0, 6.0]))
        >>> t.tolist()
        [1.0, 5.0, 6.0]"""
        if _is_disk(self.device):
            return self._assign_disk(x)
        if not isinstance(x, Tensor):
            x = Tensor(x, device=self.device, dtype=self.dtype)
        if x.shape != self.shape:
            x = x._broadcast_to(self.shape)
        if x.dtype != self.dtype:
            raise DTypeError(f"assign needs the same dtype: target is {self.dtype.name}, value is {x.dtype.name}")
        if isinstance(self.device, tuple) and isinstance(x.device, str):
            x = x.shard_like(self)
        if x.device != self.device:
            raise DeviceMismatchError(f"assign needs the same device: target on {self.device}, value on {x.device}")
        if self.uop.base.op is not Ops.BUFFER:
            self.realize()
        self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, x.uop))
        if isinstance(self.device, str) and _is_part_view(self.uop.src[0]):
            note_view_assign(self)
        return self

    def _assign_disk(self, x: Tensor | Scalar | list[Any]) -> Tensor:
        """Write `x` (a tensor on any device, or Python/numpy data) into the DISK memory self covers, now."""
        np_dt = to_np_dtype(self.dtype)
        if not isinstance(x, Tensor) and np_dt is not None:
            arr = np.broadcast_to(np.asarray(x, dtype=np_dt), self.shape)
            data = memoryview(np.ascontiguousarray(arr).tobytes())
        else:
            value = x if isinstance(x, Tensor) else Tensor(x, dtype=self.dtype)
            if value.dtype != self.dtype:
                raise DTypeError(
                    f"assign needs the same dtype: target is {self.dtype.name}, value is {value.dtype.name}"
                )
            data = value._broadcast_to(self.shape)._host_bytes()
        realize_base(self)
        view_memory(self.uop).copyin(data)
        return self

    # ---- in-place operators (assign) ----
    def __iadd__(self, x: Tensor | Scalar) -> Tensor:
        return self.assign(self + x)

    def __isub__(self, x: Tensor | Scalar) -> Tensor:
        return self.assign(self - x)

    def __imul__(self, x: Tensor | Scalar) -> Tensor:
        return self.assign(self * x)

    def __itruediv__(self, x: Tensor | Scalar) -> Tensor:
        return self.assign(self / x)

    # ---- dtype shorthands: last, because inside the class body these names shadow the builtins ----
    # dtype shorthands last: inside the class body their names would shadow the builtins int/float/bool
    def float(self) -> Tensor:
        """Cast to float32.

        >>> Tensor([1, 2]).float().tolist()
        [1.0, 2.0]"""
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        """Cast to float16.

        >>> Tensor([1.5]).half().dtype == dtypes.float16
        True"""
        return self.cast(dtypes.float16)

    def int(self) -> Tensor:
        """Cast to int32 (floats round toward zero).

        >>> Tensor([1.7, -1.7]).int().tolist()
        [1, -1]"""
        return self.cast(dtypes.int32)

    def bool(self) -> Tensor:
        """Cast to bool (nonzero is True).

        >>> Tensor([0, 2]).bool().tolist()
        [False, True]"""
        return self.cast(dtypes.bool)

    def double(self) -> Tensor:
        """Cast to float64.

        >>> Tensor([1, 2]).double().dtype == dtypes.float64
        True"""
        return self.cast(dtypes.float64)

    def bfloat16(self) -> Tensor:
        """Cast to bfloat16 (round to nearest even).

        >>> Tensor([1.00390625]).bfloat16().float().tolist()
        [1.0]"""
        return self.cast(dtypes.bfloat16)

    def long(self) -> Tensor:
        """Cast to int64 (floats round toward zero).

        >>> Tensor([2.9]).long().tolist(), Tensor([2.9]).long().dtype == dtypes.int64
        ([2], True)"""
        return self.cast(dtypes.int64)

    def short(self) -> Tensor:
        """Cast to int16 (ints wrap around).

        >>> Tensor([40000]).short().tolist()
        [-25536]"""
        return self.cast(dtypes.int16)


_UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


def _is_part_view(target: UOp) -> bool:
    """A view of a buffer other than the whole buffer in order (a reshape of it is the tensor that owns it): an assign
    into it is recorded so that reading the buffer runs it."""
    if target.base.op is not Ops.BUFFER:
        return False
    while target.op is Ops.RESHAPE:
        target = target.src[0]
    return target.op is not Ops.BUFFER


def _is_disk(device: str | tuple[str, ...]) -> bool:
    """A DISK tensor: memory the host reads and writes, where no kernel runs."""
    return isinstance(device, str) and device.startswith("DISK")


def _is_plain_buffer(u: UOp) -> bool:
    x = u
    while x.op is Ops.RESHAPE:
        x = x.src[0]
    return x.op is Ops.BUFFER
