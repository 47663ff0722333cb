"""`Tensor`: a lazy n-dimensional array. Methods build a UOp graph; `realize()` schedules it into kernels and runs them.

Only the primitive ops become UOps (EXP2 LOG2 SIN SQRT RECIPROCAL NEG TRUNC, the binary ALU ops, WHERE, CAST,
BITCAST, the movement ops, REDUCE_AXIS); everything else is composed of them here.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from xgrad.device import Device
from xgrad.dtype import DType, dtypes, from_np_dtype, least_upper_dtype, least_upper_float, sum_acc_dtype, to_dtype
from xgrad.errors import DTypeError, IndexingError, ShapeError, XgradError
from xgrad.helpers import DISALLOW_BROADCAST, argfix, prod
from xgrad.uop.ops import Ops, UOp

Scalar = int | float | bool


def _canonical_device(device: str | None) -> str:
    return Device.canonicalize(device) if device is not None else Device.DEFAULT


def _np_to_uop(arr: np.ndarray, device: str, dtype: DType | None) -> UOp:
    from xgrad.dtype import float_to_bf16_bits, float_to_fp8_bits
    from xgrad.engine.schedule import buffer_of, new_buffer_uop

    src_dtype = from_np_dtype(arr.dtype)
    target = dtype or src_dtype
    raw: np.ndarray
    if target == dtypes.bfloat16:
        raw = float_to_bf16_bits(arr.astype(np.float32))
    elif dtypes.is_fp8(target):
        raw = float_to_fp8_bits(arr.astype(np.float32), target)
    else:
        from xgrad.dtype import to_np_dtype

        np_dt = to_np_dtype(target)
        assert np_dt is not None
        raw = arr.astype(np_dt)
    raw = np.ascontiguousarray(raw)
    buf = new_buffer_uop(device, int(raw.size), target)
    if raw.size:
        buffer_of(buf).copyin(memoryview(raw.reshape(-1).view(np.uint8)))  # type: ignore[arg-type]
    return buf.reshape(tuple(int(s) for s in arr.shape))


class Tensor:
    """A lazy tensor.

    >>> Tensor([1, 2, 3]).tolist()
    [1, 2, 3]
    """

    __slots__ = ("uop", "grad", "is_param", "__weakref__")

    def __init__(self, data: Any = None, device: str | None = None, dtype: DType | str | None = None):
        dt = to_dtype(dtype) if dtype is not None else None
        if isinstance(data, UOp):
            self.uop = data
        else:
            dev = _canonical_device(device)
            if data is None:
                data = 0
            if isinstance(data, (bool, int, float)):
                d = dt or _scalar_dtype(data)
                self.uop = UOp.const(d, data, dev, ())
            elif isinstance(data, bytes):
                self.uop = _np_to_uop(np.frombuffer(data, dtype=np.uint8), dev, dt or dtypes.uint8)
            elif isinstance(data, (list, tuple)):
                inferred = dt or dtypes.from_py(data)
                arr = np.array(data, dtype=_np_for_py(inferred))
                self.uop = _np_to_uop(arr, dev, inferred)
            elif isinstance(data, np.ndarray):
                self.uop = (
                    _np_to_uop(data, dev, dt)
                    if data.shape != ()
                    else UOp.const(dt or from_np_dtype(data.dtype), data.item(), dev, ())
                )
            elif isinstance(data, pathlib.Path):
                from xgrad.engine.schedule import new_buffer_uop

                self.uop = new_buffer_uop(f"DISK:{data.resolve()}", data.stat().st_size, dtypes.uint8)
            else:
                raise DTypeError(
                    f"cannot make a Tensor from {type(data).__name__}; use a number, list, bytes, "
                    "numpy array or pathlib.Path"
                )
            if dt is not None and self.uop.dtype != dt:
                self.uop = self.uop.cast(dt)
        self.grad: Tensor | None = None
        self.is_param: bool = False
        from xgrad.engine.realize import all_tensors

        all_tensors.add(self)

    # ---- properties ----
    @property
    def shape(self) -> tuple[int, ...]:
        assert self.uop.shape is not None
        return tuple(int(s) for s in self.uop.shape)

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def device(self) -> str:
        dev = self.uop.device
        assert dev is not None
        return dev

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return int(prod(self.shape))

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def is_floating_point(self) -> bool:
        return dtypes.is_float(self.dtype)

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        return self.shape if dim is None else self.shape[self._axis(dim)]

    def __len__(self) -> int:
        if not self.shape:
            raise XgradError("len() of a 0-d tensor")
        return self.shape[0]

    def __bool__(self) -> bool:
        raise XgradError("the truth value of a Tensor is ambiguous; use .item() or .any()/.all()")

    def __repr__(self) -> str:
        return f"<Tensor {self.device} {self.shape} {self.dtype.name}>"

    __hash__ = object.__hash__

    # ---- creation ----
    @staticmethod
    def empty(*shape: Any, device: str | None = None, dtype: DType | str | None = None) -> Tensor:
        from xgrad.engine.schedule import new_buffer_uop

        sh = tuple(int(s) for s in argfix(*shape))
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float()
        return Tensor(new_buffer_uop(_canonical_device(device), prod(sh), dt).reshape(sh))

    @staticmethod
    def full(
        shape: Sequence[int] | int, fill_value: Scalar, device: str | None = None, dtype: DType | str | None = None
    ) -> Tensor:
        sh = (shape,) if isinstance(shape, int) else tuple(shape)
        if any(s < 0 for s in sh):
            raise ShapeError(f"negative dimension in shape {sh}")
        dt = to_dtype(dtype) if dtype is not None else _scalar_dtype(fill_value)
        return Tensor(UOp.const(dt, fill_value, _canonical_device(device), sh))

    @staticmethod
    def zeros(*shape: Any, **kwargs: Any) -> Tensor:
        return Tensor.full(argfix(*shape), 0.0 if "dtype" not in kwargs else 0, **kwargs)

    @staticmethod
    def ones(*shape: Any, **kwargs: Any) -> Tensor:
        return Tensor.full(argfix(*shape), 1.0 if "dtype" not in kwargs else 1, **kwargs)

    @staticmethod
    def arange(
        start: Scalar,
        stop: Scalar | None = None,
        step: Scalar = 1,
        device: str | None = None,
        dtype: DType | str | None = None,
    ) -> Tensor:
        """>>> Tensor.arange(5).tolist()
        [0, 1, 2, 3, 4]"""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise XgradError("arange step must not be 0")
        dt = (
            to_dtype(dtype)
            if dtype is not None
            else least_upper_dtype(*(_scalar_dtype(x) for x in (start, stop, step)))
        )
        n = max(0, math.ceil((stop - start) / step))
        iota = Tensor(UOp(Ops.IOTA, dt, (UOp(Ops.DEVICE, arg=_canonical_device(device)),), n))
        return iota * step + start if (step != 1 or start != 0) else iota

    def full_like(self, fill_value: Scalar, **kwargs: Any) -> Tensor:
        return Tensor.full(
            self.shape, fill_value, dtype=kwargs.get("dtype", self.dtype), device=kwargs.get("device", self.device)
        )

    def zeros_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(1, **kwargs)

    # ---- realization and data ----
    def realize(self, *lst: Tensor) -> Tensor:
        """Compute this tensor (and `lst`) now. Returns self."""
        from xgrad.engine.realize import realize_tensors

        realize_tensors([self, *lst])
        return self

    def contiguous(self) -> Tensor:
        return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def detach(self) -> Tensor:
        return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)))

    def to(self, device: str | None) -> Tensor:
        dev = _canonical_device(device)
        if dev == self.device:
            return self
        return Tensor(UOp(Ops.COPY, self.dtype, (self.uop, UOp(Ops.DEVICE, arg=dev))))

    def _host_bytes(self) -> memoryview:
        from xgrad.engine.schedule import buffer_of

        t = self.contiguous() if not _is_plain_buffer(self.uop) else self
        t.realize()
        if self.numel() == 0:
            return memoryview(b"")
        return buffer_of(t.uop).as_bytes()

    def numpy(self) -> np.ndarray:
        """The values as a numpy array (bfloat16 and fp8 come back as float32)."""
        from xgrad.dtype import bf16_bits_to_float, fp8_bits_to_float, to_np_dtype

        raw = np.frombuffer(self._host_bytes(), dtype=np.uint8).copy()
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
        result: Any = self.numpy().tolist()
        return result

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ShapeError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        value: Scalar = self.numpy().reshape(()).item()
        return value

    def data(self) -> memoryview:
        return self._host_bytes()

    def assign(self, x: Tensor | Scalar | list[Any]) -> Tensor:
        """Write `x` into this tensor's memory (in place)."""
        if not isinstance(x, Tensor):
            x = Tensor(x, device=self.device, dtype=self.dtype)
        if x.shape != self.shape:
            x = x._broadcast_to(self.shape)
        if x.dtype != self.dtype:
            raise DTypeError(f"assign needs the same dtype: target is {self.dtype.name}, value is {x.dtype.name}")
        if x.device != self.device:
            raise XgradError(f"assign needs the same device: target on {self.device}, value on {x.device}")
        if self.uop.base.op is not Ops.BUFFER:
            self.realize()
        self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, x.uop))
        return self

    # ---- autograd ----
    def contiguous_backward(self) -> Tensor:
        """The same values; in the backward pass the gradient flowing through here is made contiguous (realized).

        >>> x = Tensor([1.0, 2.0])
        >>> x.contiguous_backward().tolist()
        [1.0, 2.0]
        """
        return Tensor(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)))

    def is_param_(self, is_param: bool = True) -> Tensor:
        """Mark this tensor as a trainable parameter (read by optimizers), in place. Returns self.

        >>> Tensor([1.0]).is_param_().is_param
        True
        """
        self.is_param = is_param
        return self

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """The gradients of this tensor with respect to `targets`, as new lazy tensors (nothing is mutated).

        Only floating-point tensors have gradients. A non-scalar tensor needs `gradient`, the gradient of its output.
        A target this tensor does not depend on (or only through non-differentiable ops) gets zeros.

        >>> x = Tensor([1.0, 2.0, 3.0])
        >>> w = Tensor([4.0, 5.0, 6.0])
        >>> dx, dw = (x * w).sum().gradient(x, w)
        >>> dx.tolist(), dw.tolist()
        ([4.0, 5.0, 6.0], [1.0, 2.0, 3.0])
        """
        from xgrad.gradient import compute_gradient

        for t, what in [(self, "the differentiated tensor"), *((t, "a gradient target") for t in targets)]:
            if not dtypes.is_float(t.dtype) or t.dtype in dtypes.weaks:
                raise DTypeError(f"{what} has dtype {t.dtype.name}; only floating-point tensors have gradients")
        if gradient is None:
            if self.shape != ():
                raise ShapeError(
                    f"gradient of a tensor of shape {self.shape} needs `gradient=` (a tensor of that shape); "
                    "only a 0-d (scalar) tensor has an implicit gradient of 1.0"
                )
            root_grad = UOp.const(self.dtype, 1.0, self.device, ())
        else:
            if gradient.shape != self.shape:
                raise ShapeError(f"gradient has shape {gradient.shape}, the tensor has shape {self.shape}")
            if gradient.device != self.device:
                raise XgradError(f"gradient is on {gradient.device}, the tensor on {self.device}; move it with .to()")
            root_grad = gradient.uop.cast(self.dtype)
        grads = compute_gradient(self.uop, root_grad, {t.uop for t in targets})
        return [Tensor(grads[t.uop]) if t.uop in grads else t.zeros_like() for t in targets]

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Compute the gradient of this tensor for every live floating-point tensor in its graph and store it in
        `.grad`, or add it to an existing `.grad` (with `assign`). Skipped: what is only reached through `detach()`,
        and bare 0-d constants such as `Tensor(2.0)` unless marked `is_param`. A non-scalar tensor needs `gradient`.
        Returns self.

        >>> w = Tensor([1.0, 2.0, 3.0])
        >>> (w * w).sum().backward().item()
        14.0
        >>> w.grad.tolist()
        [2.0, 4.0, 6.0]
        """
        from xgrad.engine.realize import all_tensors
        from xgrad.gradient import nodes_with_gradient_path

        in_graph = nodes_with_gradient_path(self.uop)
        targets = [
            t
            for t in list(all_tensors)
            if t.uop in in_graph
            and dtypes.is_float(t.dtype)
            and t.dtype not in dtypes.weaks
            and t.uop.device is not None
            and (t.uop.op is not Ops.CONST or t.is_param)
        ]
        for t, g in zip(targets, self.gradient(*targets, gradient=gradient)):
            if t.grad is None:
                t.grad = g
            else:
                t.grad.assign(t.grad + g)
        return self

    # ---- movement ----
    def _axis(self, axis: int, ndim: int | None = None) -> int:
        n = self.ndim if ndim is None else ndim
        if not -max(n, 1) <= axis < max(n, 1):
            raise IndexingError(f"axis {axis} is out of range for a tensor with {n} dimensions")
        return axis + n if axis < 0 else axis

    def reshape(self, shape: Any, *args: int) -> Tensor:
        new = list(argfix(shape, *args))
        if new.count(-1) > 1:
            raise ShapeError(f"reshape to {tuple(new)}: only one dimension can be -1")
        if -1 in new:
            rest = prod(s for s in new if s != -1)
            if rest == 0 or self.numel() % rest:
                raise ShapeError(f"cannot reshape {self.shape} to {tuple(new)}")
            new[new.index(-1)] = self.numel() // rest
        if any(s < 0 for s in new) or prod(new) != self.numel():
            raise ShapeError(f"cannot reshape tensor of shape {self.shape} ({self.numel()} elements) to {tuple(new)}")
        return Tensor(self.uop.reshape(tuple(int(s) for s in new)))

    def permute(self, order: Any, *args: int) -> Tensor:
        o = tuple(self._axis(a) for a in argfix(order, *args))
        if sorted(o) != list(range(self.ndim)):
            raise ShapeError(f"permute order {o} is not a permutation of the {self.ndim} axes of {self.shape}")
        return Tensor(self.uop.permute(o))

    def expand(self, shape: Any, *args: int) -> Tensor:
        new = tuple(
            s if s != -1 else old
            for s, old in zip(argfix(shape, *args), (1,) * (len(argfix(shape, *args)) - self.ndim) + self.shape)
        )
        return self._broadcast_to(new)

    def pad(self, padding: Sequence[Any], value: Scalar = 0.0) -> Tensor:
        """Pad with `value`; `padding` is per-dim (before, after) pairs or a flat torch-style list (last dim first).
        Negative pads shrink."""
        if all(isinstance(p, int) for p in padding):
            flat = list(padding)
            if len(flat) % 2 or len(flat) // 2 > self.ndim:
                raise ShapeError(f"flat padding {tuple(flat)} must have an even length of at most 2*{self.ndim}")
            pairs = [(0, 0)] * (self.ndim - len(flat) // 2) + [
                (flat[i], flat[i + 1]) for i in reversed(range(0, len(flat), 2))
            ]
        else:
            pairs = [(0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding]
        if len(pairs) != self.ndim:
            raise ShapeError(f"padding {tuple(padding)} has {len(pairs)} entries for {self.ndim} dimensions")
        for (b, a), s in zip(pairs, self.shape):
            if -b - a > s or -b > s or -a > s:
                raise ShapeError(
                    f"negative padding {(b, a)} removes more than the size {s} of a dimension of {self.shape}"
                )
        x = self.shrink(tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape)))
        grow = tuple((max(0, b), max(0, a)) for b, a in pairs)
        out = Tensor(x.uop.pad(grow))
        if value != 0 and any(b or a for b, a in grow):
            mask = Tensor(UOp.const(dtypes.bool, True, self.device, x.shape).pad(grow))
            out = mask.where(out, value)
        return out

    def shrink(self, arg: Sequence[tuple[int, int] | None]) -> Tensor:
        if len(arg) != self.ndim:
            raise ShapeError(f"shrink {tuple(arg)} has {len(arg)} entries for {self.ndim} dimensions")
        full = tuple((0, s) if a is None else (int(a[0]), int(a[1])) for a, s in zip(arg, self.shape))
        for (b, e), s in zip(full, self.shape):
            if not 0 <= b <= e <= s:
                raise ShapeError(f"shrink {full} is out of range for shape {self.shape}")
        return Tensor(self.uop.shrink(full))

    def flip(self, axis: Any, *args: int) -> Tensor:
        axes = {self._axis(a) for a in argfix(axis, *args)}
        return Tensor(self.uop.flip(tuple(i in axes for i in range(self.ndim))))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = self._axis(start_dim), self._axis(end_dim)
        return self.reshape(self.shape[:s] + (prod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = self._axis(dim0), self._axis(dim1)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:  # noqa: N802
        return self.transpose()

    def unsqueeze(self, dim: int) -> Tensor:
        d = self._axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self, dim: int | None = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        d = self._axis(dim)
        return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1 :])

    def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        if self.shape == shape:
            return self
        if len(shape) < self.ndim:
            raise ShapeError(f"cannot broadcast shape {self.shape} to {shape}")
        padded = (1,) * (len(shape) - self.ndim) + self.shape
        if any(p != s and p != 1 for p, s in zip(padded, shape)):
            raise ShapeError(f"cannot broadcast shape {self.shape} to {shape}")
        return Tensor(self.uop.reshape(padded).expand(shape))

    # ---- elementwise ----
    def _const(self, value: Scalar, dtype: DType | None = None) -> Tensor:
        return Tensor(UOp.const(dtype or self.dtype, value, self.device, self.shape))

    def _broadcasted(self, y: Tensor | Scalar, reverse: bool = False) -> tuple[Tensor, Tensor]:
        x: Tensor = self
        if not isinstance(y, Tensor):
            if not isinstance(y, (bool, int, float)):
                raise DTypeError(f"cannot combine a Tensor with {type(y).__name__}")
            out_dt = least_upper_dtype(x.dtype, _weak_dtype(y))
            x = x.cast(out_dt)
            y_t = x._const(y)
        else:
            y_t = y
            if x.device != y_t.device:
                raise XgradError(f"tensors are on different devices: {x.device} and {y_t.device}; move one with .to()")
            out_dt = least_upper_dtype(x.dtype, y_t.dtype)
            x, y_t = x.cast(out_dt), y_t.cast(out_dt)
            if x.shape != y_t.shape:
                shape = _broadcast_shape(x.shape, y_t.shape)
                if DISALLOW_BROADCAST:
                    raise ShapeError(f"implicit broadcast of {x.shape} and {y_t.shape} with DISALLOW_BROADCAST=1")
                x, y_t = x._broadcast_to(shape), y_t._broadcast_to(shape)
        return (y_t, x) if reverse else (x, y_t)

    def _binop(self, op: Ops, y: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(y, reverse)
        return Tensor(a.uop.alu(op, b.uop))

    def _unop(self, op: Ops) -> Tensor:
        return Tensor(UOp(op, self.dtype, (self.uop,)))

    def _float(self) -> Tensor:
        return self.cast(least_upper_float(self.dtype))

    def cast(self, dtype: DType | str) -> Tensor:
        dt = to_dtype(dtype)
        return self if dt == self.dtype else Tensor(self.uop.cast(dt))

    def bitcast(self, dtype: DType | str) -> Tensor:
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise DTypeError(f"bitcast between {self.dtype.name} and {dt.name} needs equal item sizes")
        return self if dt == self.dtype else Tensor(self.uop.bitcast(dt))

    def neg(self) -> Tensor:
        return (
            self.logical_not()
            if self.dtype == dtypes.bool
            else self._unop(Ops.NEG)
            if dtypes.is_float(self.dtype)
            else self * -1
        )

    def exp2(self) -> Tensor:
        return self._float()._unop(Ops.EXP2)

    def log2(self) -> Tensor:
        return self._float()._unop(Ops.LOG2)

    def _in_float32(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """Compute a composed op in float32 when self is a narrower float, rounding once at the end (as torch)."""
        x = self._float()
        return fn(x.cast(dtypes.float32)).cast(x.dtype) if x.dtype.itemsize < 4 else fn(x)

    def exp(self) -> Tensor:
        return self._in_float32(lambda x: (x * (1 / math.log(2))).exp2())

    def log(self) -> Tensor:
        return self._in_float32(lambda x: x.log2() * math.log(2))

    def sqrt(self) -> Tensor:
        return self._float()._unop(Ops.SQRT)

    def rsqrt(self) -> Tensor:
        return self.sqrt().reciprocal()

    def reciprocal(self) -> Tensor:
        return self._float()._unop(Ops.RECIPROCAL)

    def sin(self) -> Tensor:
        return self._float()._unop(Ops.SIN)

    def cos(self) -> Tensor:
        return ((math.pi / 2) - self._float()).sin()

    def tan(self) -> Tensor:
        return self.sin() / self.cos()

    def trunc(self) -> Tensor:
        return self._unop(Ops.TRUNC) if dtypes.is_float(self.dtype) else self

    def floor(self) -> Tensor:
        t = self.trunc()
        return (self < t).where(t - 1, t) if dtypes.is_float(self.dtype) else self

    def ceil(self) -> Tensor:
        t = self.trunc()
        return (self > t).where(t + 1, t) if dtypes.is_float(self.dtype) else self

    def square(self) -> Tensor:
        return self * self

    def abs(self) -> Tensor:
        return self if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool else self.maximum(-self)

    def sign(self) -> Tensor:
        return (self > 0).where(1, 0).cast(self.dtype) - (self < 0).where(1, 0).cast(self.dtype)

    def relu(self) -> Tensor:
        return (self > 0).where(self, 0)

    def sigmoid(self) -> Tensor:
        return (1 + (-self._float()).exp()).reciprocal()

    def tanh(self) -> Tensor:
        return 2.0 * (2.0 * self._float()).sigmoid() - 1.0

    def logical_not(self) -> Tensor:
        return Tensor(self.cast(dtypes.bool).uop.alu(Ops.CMPNE, True))

    def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._binop(Ops.ADD, x, reverse)

    def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a + (-b)

    def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._binop(Ops.MUL, x, reverse)

    def div(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return a._float()._binop(Ops.FDIV, b._float())

    def idiv(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Floor division (Python semantics) for ints; floor(a/b) for floats."""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            return (a / b).floor()
        q = a._binop(Ops.IDIV, b)
        needs_fix = (a._binop(Ops.MOD, b) != 0) & ((a < 0) != (b < 0)) if not dtypes.is_unsigned(a.dtype) else None
        return q if needs_fix is None else needs_fix.where(q - 1, q)

    def mod(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Remainder with the sign of the divisor (Python semantics)."""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            return a - (a / b).floor() * b
        r = a._binop(Ops.MOD, b)
        if dtypes.is_unsigned(a.dtype):
            return r
        return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)

    def pow(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if not isinstance(x, Tensor) and not reverse and x == 2:
            return self * self
        af = a._float()
        mag = (af.abs().log2() * b._float()).exp2()
        # negative base: sign from the parity of an integral exponent, nan otherwise
        bf = b._float()
        is_int_exp = bf.trunc() == bf
        odd = (bf.abs() % 2) == 1
        signed = (af < 0).where(is_int_exp.where(odd.where(-mag, mag), math.nan), mag)
        out = (bf == 0).where(1.0, signed)
        return out if dtypes.is_float(a.dtype) else out.cast(a.dtype)

    def maximum(self, x: Tensor | Scalar) -> Tensor:
        return self._binop(Ops.MAX, x)

    def minimum(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        if a.dtype == dtypes.bool:
            return a & b
        return -((-a).maximum(-b)) if not dtypes.is_unsigned(a.dtype) else (a < b).where(a, b)

    def where(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        """Pick `x` where self is true, else `y`."""
        cond = self.cast(dtypes.bool)
        if isinstance(x, Tensor):
            xt, yt = x._broadcasted(y)
        elif isinstance(y, Tensor):
            yt, xt = y._broadcasted(x)
        else:
            dt = least_upper_dtype(_weak_dtype(x), _weak_dtype(y))
            dt = (
                dtypes.default_float()
                if dt == dtypes.weakfloat
                else dtypes.default_int()
                if dt == dtypes.weakint
                else dt
            )
            xt, yt = cond._const(x, dt), cond._const(y, dt)
        shape = _broadcast_shape(_broadcast_shape(cond.shape, xt.shape), yt.shape)
        cond, xt, yt = cond._broadcast_to(shape), xt._broadcast_to(shape), yt._broadcast_to(shape)
        return Tensor(UOp(Ops.WHERE, xt.dtype, (cond.uop, xt.uop, yt.uop)))

    def _cmp(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        return Tensor(a.uop.alu(op, b.uop))

    def __lt__(self, x: Tensor | Scalar) -> Tensor:
        return self._cmp(Ops.CMPLT, x)

    def __gt__(self, x: Tensor | Scalar) -> Tensor:
        return self._cmp(Ops.CMPLT, x, True)

    def __le__(self, x: Tensor | Scalar) -> Tensor:
        return (self > x).logical_not()

    def __ge__(self, x: Tensor | Scalar) -> Tensor:
        return (self < x).logical_not()

    def __eq__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPEQ, x)

    def __ne__(self, x: Tensor | Scalar) -> Tensor:  # type: ignore[override]
        return self._cmp(Ops.CMPNE, x)

    def _bitop(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype):
            raise DTypeError(f"{op.name.lower()} is only for integer or bool tensors, not {a.dtype.name}")
        return a._binop(op, b)

    def bitwise_and(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitop(Ops.AND, x, reverse)

    def bitwise_or(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitop(Ops.OR, x, reverse)

    def bitwise_xor(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitop(Ops.XOR, x, reverse)

    def lshift(self, x: Tensor | int, reverse: bool = False) -> Tensor:
        return self._bitop(Ops.SHL, x, reverse)

    def rshift(self, x: Tensor | int, reverse: bool = False) -> Tensor:
        return self._bitop(Ops.SHR, x, reverse)

    def bitwise_not(self) -> Tensor:
        if self.dtype == dtypes.bool:
            return self.logical_not()
        return self._bitop(Ops.XOR, -1 if not dtypes.is_unsigned(self.dtype) else int(dtypes.max(self.dtype)))

    # ---- reductions ----
    def _reduce(self, op: Ops, axis: int | Sequence[int] | None, keepdim: bool) -> Tensor:
        axes = (
            tuple(range(self.ndim))
            if axis is None
            else tuple(self._axis(a) for a in ((axis,) if isinstance(axis, int) else axis))
        )
        if self.ndim == 0:
            return self
        if op is Ops.MAX and any(self.shape[a] == 0 for a in axes):
            raise ShapeError(f"max over an empty axis of shape {self.shape} has no identity")
        out_shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
        if self.numel() == 0:
            ident = 0 if op is Ops.ADD else 1
            ret = Tensor.full(out_shape, ident, device=self.device, dtype=self.dtype)
        else:
            ret = Tensor(self.uop.reduce_axis(op, axes))
        return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False, dtype: DType | None = None) -> Tensor:
        """>>> Tensor([[1, 2], [3, 4]]).sum(1).tolist()
        [3, 7]"""
        acc = to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype)
        ret = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
        keep_low_float = dtype is None and dtypes.is_float(self.dtype)
        return ret.cast(self.dtype) if keep_low_float else ret

    def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return self._reduce(Ops.MAX, axis, keepdim)

    def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool:
            return -((-self.cast(dtypes.int64 if self.dtype.itemsize >= 4 else dtypes.int32)).max(axis, keepdim)).cast(
                self.dtype
            )
        return -((-self).max(axis, keepdim))

    def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        out = self._float().sum(axis, keepdim)
        n = prod(self.shape) // max(1, prod(out.shape)) if out.numel() else 0
        return out / n if n else out * math.nan

    def softmax(self, axis: int = -1) -> Tensor:
        x = self._float()
        e = (x - x.max(axis, keepdim=True)).exp()
        return e / e.sum(axis, keepdim=True)

    def matmul(self, w: Tensor) -> Tensor:
        if self.ndim == 0 or w.ndim == 0:
            raise ShapeError(f"matmul needs at least 1-d tensors, got {self.shape} and {w.shape}")
        if self.shape[-1] != w.shape[-min(w.ndim, 2)]:
            raise ShapeError(
                f"matmul shapes {self.shape} and {w.shape} do not fit: {self.shape[-1]} != {w.shape[-min(w.ndim, 2)]}"
            )
        x = self.reshape(self.shape[:-1] + (1,) * min(w.ndim - 1, 1) + self.shape[-1:])
        wt = w.reshape(w.shape[:-2] + (1,) * min(self.ndim - 1, 1) + w.shape[-min(w.ndim, 2) :]).transpose(
            -1, -min(w.ndim, 2)
        )
        return (x * wt).sum(-1)

    # ---- operators ----
    def __neg__(self) -> Tensor:
        return self.neg()

    def __invert__(self) -> Tensor:
        return self.bitwise_not()

    def __add__(self, x: Tensor | Scalar) -> Tensor:
        return self.add(x)

    def __radd__(self, x: Scalar) -> Tensor:
        return self.add(x, True)

    def __sub__(self, x: Tensor | Scalar) -> Tensor:
        return self.sub(x)

    def __rsub__(self, x: Scalar) -> Tensor:
        return self.sub(x, True)

    def __mul__(self, x: Tensor | Scalar) -> Tensor:
        return self.mul(x)

    def __rmul__(self, x: Scalar) -> Tensor:
        return self.mul(x, True)

    def __truediv__(self, x: Tensor | Scalar) -> Tensor:
        return self.div(x)

    def __rtruediv__(self, x: Scalar) -> Tensor:
        return self.div(x, True)

    def __floordiv__(self, x: Tensor | Scalar) -> Tensor:
        return self.idiv(x)

    def __rfloordiv__(self, x: Scalar) -> Tensor:
        return self.idiv(x, True)

    def __mod__(self, x: Tensor | Scalar) -> Tensor:
        return self.mod(x)

    def __rmod__(self, x: Scalar) -> Tensor:
        return self.mod(x, True)

    def __pow__(self, x: Tensor | Scalar) -> Tensor:
        return self.pow(x)

    def __rpow__(self, x: Scalar) -> Tensor:
        return self.pow(x, True)

    def __matmul__(self, x: Tensor) -> Tensor:
        return self.matmul(x)

    def __and__(self, x: Tensor | Scalar) -> Tensor:
        return self.bitwise_and(x)

    def __rand__(self, x: Scalar) -> Tensor:
        return self.bitwise_and(x, True)

    def __or__(self, x: Tensor | Scalar) -> Tensor:
        return self.bitwise_or(x)

    def __ror__(self, x: Scalar) -> Tensor:
        return self.bitwise_or(x, True)

    def __xor__(self, x: Tensor | Scalar) -> Tensor:
        return self.bitwise_xor(x)

    def __rxor__(self, x: Scalar) -> Tensor:
        return self.bitwise_xor(x, True)

    def __lshift__(self, x: int) -> Tensor:
        return self.lshift(x)

    def __rshift__(self, x: int) -> Tensor:
        return self.rshift(x)

    def __iadd__(self, x: Tensor | Scalar) -> Tensor:
        return self.assign(self + x)

    def __isub__(self, x: Tensor | Scalar) -> Tensor:
        return self.assign(self - x)

    def __imul__(self, x: Tensor | Scalar) -> Tensor:
        return self.assign(self * x)

    def __itruediv__(self, x: Tensor | Scalar) -> Tensor:
        return self.assign(self / x)

    # dtype shorthands last: inside the class body their names would shadow the builtins int/float/bool
    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        return self.cast(dtypes.float16)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def bool(self) -> Tensor:
        return self.cast(dtypes.bool)


def _is_plain_buffer(u: UOp) -> bool:
    x = u
    while x.op is Ops.RESHAPE:
        x = x.src[0]
    return x.op is Ops.BUFFER


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"shapes {a} and {b} cannot be broadcast together")
        out.append(y if x == 1 else x)
    return tuple(out)


def _weak_dtype(x: Scalar) -> DType:
    return dtypes.bool if isinstance(x, bool) else dtypes.weakint if isinstance(x, int) else dtypes.weakfloat


def _scalar_dtype(x: Scalar) -> DType:
    return (
        dtypes.bool if isinstance(x, bool) else dtypes.default_int() if isinstance(x, int) else dtypes.default_float()
    )


def _np_for_py(d: DType) -> Any:
    from xgrad.dtype import to_np_dtype

    return to_np_dtype(d) if to_np_dtype(d) is not None else np.float32
