"""Creation of tensors: empty, full, zeros, ones, arange, linspace, eye and the *_like forms."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from xgrad.buffer import new_buffer_uop
from xgrad.dtype import DType, dtypes, least_upper_dtype, to_dtype
from xgrad.engine.indexing import buffer_view
from xgrad.errors import ArgumentError, DTypeError, ShapeError
from xgrad.helpers import argfix, prod
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import Scalar, canonical_device, scalar_dtype, with_requires_grad
from xgrad.uop.ops import Ops, UOp, ssimplify
from xgrad.uop.symshape import is_symbolic, shape_str, sint_max, sint_min, sym_prod

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


def _size(s: Any, shape: Any) -> int:
    """One size of a shape as an int: a Python or numpy integer; anything else (2.5, "3") is a ShapeError."""
    try:
        return operator.index(s)
    except TypeError:
        raise ShapeError(f"shape {shape} has the size {s!r}; sizes must be integers (e.g. int(n))") from None


def _shape_arg(*shape: Any) -> tuple[int, ...]:
    """A shape given as f(2, 3) or f((2, 3)); ShapeError for a negative size. A size may be symbolic (a UOp of bound
    Variables); it is kept as is, so the annotation's int stands for `sint`."""
    given = argfix(*shape)
    sh = tuple(s if isinstance(s, UOp) else _size(s, given) for s in given)
    if any(sint_min(s) < 0 for s in sh):
        raise ShapeError(f"negative dimension in shape {shape_str(sh)}; every size must be >= 0")
    return cast("tuple[int, ...]", sh)


class ArangeRangeError(ArgumentError, OverflowError):
    """`arange` values that the dtype cannot hold: an `OverflowError` as tinygrad's (and an `ArgumentError`)."""


class LinspaceDTypeError(DTypeError, ValueError):
    """`linspace` with dtype bool: a `ValueError` as tinygrad's (and a `DTypeError`)."""


class CreationMixin(TensorBase):
    __slots__ = ()

    # ---- creation ----
    @classmethod
    def empty(
        cls,
        *shape: Any,
        device: str | None = None,
        dtype: DType | str | None = None,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """A new, uninitialized buffer of `shape` (its values are whatever the memory held).

        >>> Tensor.empty(2, 3).shape
        (2, 3)
        """
        sh = _shape_arg(*shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if is_symbolic(sh):  # memory for the largest value; the tensor is a view of its first numel elements
            buf = new_buffer_uop(canonical_device(device), sint_max(sym_prod(sh)), dt)
            return cls._tensor_cls()(buffer_view(buf, sh), requires_grad=requires_grad)
        return cls._tensor_cls()(
            new_buffer_uop(canonical_device(device), prod(sh), dt).reshape(sh), requires_grad=requires_grad
        )

    @classmethod
    def invalids(cls, *shape: Any, device: str | None = None, dtype: DType | str | None = None) -> Tensor:
        """Write-only scratch memory of `shape`: write it (with `assign`) before reading it. Here the same as `empty`.

        >>> Tensor.invalids(3, dtype="int32").shape
        (3,)
        """
        return cls.empty(*shape, device=device, dtype=dtype)

    @classmethod
    def full(
        cls,
        shape: Sequence[int] | int,
        fill_value: Scalar,
        device: str | None = None,
        dtype: DType | str | None = None,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """A tensor of `shape` holding `fill_value` everywhere; dtype from the value unless given. It is a broadcast
        constant (no memory) until it is realized.

        >>> Tensor.full((2, 2), 7).tolist()
        [[7, 7], [7, 7]]
        """
        sh = _shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else scalar_dtype(fill_value)
        return cls._tensor_cls()(UOp.const(dt, fill_value, canonical_device(device), sh), requires_grad=requires_grad)

    @classmethod
    def zeros(cls, *shape: Any, **kwargs: Any) -> Tensor:
        """A tensor of zeros (default float dtype).

        >>> Tensor.zeros(2, 3).tolist()
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
        """
        return cls.full(argfix(*shape), 0.0 if "dtype" not in kwargs else 0, **kwargs)

    @classmethod
    def ones(cls, *shape: Any, **kwargs: Any) -> Tensor:
        """A tensor of ones (default float dtype).

        >>> Tensor.ones(2, dtype="int32").tolist()
        [1, 1]
        """
        return cls.full(argfix(*shape), 1.0 if "dtype" not in kwargs else 1, **kwargs)

    @classmethod
    def arange(
        cls,
        start: Scalar | UOp,
        stop: Scalar | UOp | None = None,
        step: Scalar = 1,
        device: str | None = None,
        dtype: DType | str | None = None,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """`start, start + step, ...` up to (not including) `stop`; `arange(n)` counts from 0. `stop` (and, with step
        1, `start`) may be symbolic: a bound Variable or an int expression of bound Variables.

        >>> Tensor.arange(5).tolist()
        [0, 1, 2, 3, 4]
        """
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ArgumentError("arange step must not be 0")
        if isinstance(start, UOp) or isinstance(stop, UOp):
            return with_requires_grad(cls._arange_symbolic(start, stop, step, device, dtype), requires_grad)
        dt = (
            to_dtype(dtype) if dtype is not None else least_upper_dtype(*(scalar_dtype(x) for x in (start, stop, step)))
        )
        n = max(0, math.ceil((stop - start) / step))
        if (
            n
            and dtypes.is_int(dt)
            and not dt.min <= min(start, last := start + (n - 1) * step) <= max(start, last) <= dt.max
        ):
            raise ArangeRangeError(
                f"arange of {n:,} values from {start:,} to {last:,} (step {step:,}) does not fit {dt.name} "
                f"({dt.min:,}..{dt.max:,}); use a wider dtype (dtype=dtypes.int64)"
            )
        iota = cls._tensor_cls()(UOp(Ops.IOTA, dt, (UOp(Ops.DEVICE, arg=canonical_device(device)),), n))
        return with_requires_grad(iota * step + start if (step != 1 or start != 0) else iota, requires_grad)

    @classmethod
    def _arange_symbolic(
        cls, start: Any, stop: Any, step: Any, device: str | None, dtype: DType | str | None
    ) -> Tensor:
        """A symbolic length: an IOTA of symbolic size (scaled); a symbolic start shrinks an IOTA that counts from 0."""
        if not all(isinstance(x, (int, UOp)) for x in (start, stop, step)):
            raise ShapeError("arange with a symbolic start or stop needs int start, stop and step")
        if isinstance(start, UOp) and step != 1:
            raise ShapeError("arange with a symbolic start needs step 1; scale the result instead")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
        dev = (UOp(Ops.DEVICE, arg=canonical_device(device)),)
        if isinstance(start, UOp):  # element i of the shrunk count is start + i
            _shape_arg(ssimplify(stop - start))
            return cls._tensor_cls()(UOp(Ops.IOTA, dt, dev, stop)).shrink(((start, stop),))
        span = stop - start if step > 0 else start - stop
        n = ssimplify(span if abs(step) == 1 else (span + (abs(step) - 1)) // abs(step))
        _shape_arg(n)
        iota = cls._tensor_cls()(UOp(Ops.IOTA, dt, dev, n))
        return iota * step + start if (step != 1 or start != 0) else iota

    @classmethod
    def _sint_tensor(cls, s: Any, device: str | None = None, dtype: DType | str | None = None) -> Tensor:
        """A 0-d tensor holding a size: an int, or the value of an expression of bound Variables (computed in the
        kernel from the variable, so one kernel serves every value). For ops with a symbolic count (a mean).

        >>> from xgrad import Variable
        >>> Tensor._sint_tensor(Variable("n", 1, 9).bind(4) * 2, dtype="float32").item()
        8.0
        """
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
        if not isinstance(s, UOp):
            return cls.full((), int(s), device=device, dtype=dt)
        return cls.arange(s, s + 1, device=device, dtype=dtypes.int32).reshape(()).cast(dt)

    @classmethod
    def linspace(
        cls,
        start: int | float,
        stop: int | float,
        steps: int,
        device: str | None = None,
        dtype: DType | str | None = None,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """`steps` evenly spaced values from `start` to `stop`, both included (default float dtype).

        As torch, the first half counts up from `start` and the second half down from `stop`, so both ends are exact.
        Integer dtypes truncate the float values.

        >>> Tensor.linspace(0, 1, 5).tolist()
        [0.0, 0.25, 0.5, 0.75, 1.0]
        """
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if dt == dtypes.bool:
            raise LinspaceDTypeError("linspace does not support dtype bool; use a numeric dtype")
        if steps < 0:
            raise ShapeError(f"linspace needs steps >= 0, got {steps}")
        compute = dtypes.float64 if dt == dtypes.float64 else dtypes.float32
        if steps <= 1:
            return with_requires_grad(cls.full((steps,), start, device=device, dtype=compute).cast(dt), requires_grad)
        step = (stop - start) / (steps - 1)
        i = cls.arange(steps, device=device, dtype=compute)
        up = i * step + start
        down = (steps - 1 - i) * -step + stop
        return with_requires_grad((i < steps // 2).where(up, down).cast(dt), requires_grad)

    @classmethod
    def eye(
        cls,
        n: int,
        m: int | None = None,
        device: str | None = None,
        dtype: DType | str | None = None,
        requires_grad: bool | None = None,
    ) -> Tensor:
        """An `n` x `m` matrix (`m` defaults to `n`) with ones on the diagonal and zeros elsewhere.

        >>> Tensor.eye(2, 3).tolist()
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
        """
        cols = n if m is None else m
        if n < 0 or cols < 0:
            raise ShapeError(f"eye needs sizes >= 0, got n={n}, m={cols}")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        rows = cls.arange(n, device=device, dtype=dtypes.int32).reshape(n, 1)
        diagonal = rows == cls.arange(cols, device=device, dtype=dtypes.int32).reshape(1, cols)
        return with_requires_grad(diagonal.cast(dt), requires_grad)

    # ---- *_like: same shape (and by default dtype and device) as self ----
    def full_like(self, fill_value: Scalar, **kwargs: Any) -> Tensor:
        """A tensor like self (shape, dtype, device unless given) holding `fill_value`; the other keywords go to
        `full` (`requires_grad=`).

        >>> Tensor([1.0, 2.0]).full_like(3).tolist()
        [3.0, 3.0]
        """
        kwargs.setdefault("dtype", self.dtype)
        kwargs.setdefault("device", self.device)
        return self._tensor_cls().full(self.shape, fill_value, **kwargs)

    def zeros_like(self, **kwargs: Any) -> Tensor:
        """Zeros shaped like self (its dtype and device unless `dtype=` / `device=` are given).

        >>> Tensor([[1, 2]]).zeros_like().tolist()
        [[0, 0]]
        """
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs: Any) -> Tensor:
        """Ones shaped like self (its dtype and device unless `dtype=` / `device=` are given).

        >>> Tensor([1.5, 2.5]).ones_like(dtype="int32").tolist()
        [1, 1]
        """
        return self.full_like(1, **kwargs)

    def empty_like(
        self, dtype: DType | str | None = None, device: str | None = None, requires_grad: bool | None = None
    ) -> Tensor:
        """A new uninitialized buffer shaped like self (its dtype and device unless given).

        >>> Tensor([[1, 2, 3]]).empty_like().shape
        (1, 3)
        """
        return self._tensor_cls().empty(
            self.shape,
            device=device if device is not None else self.device,
            dtype=dtype or self.dtype,
            requires_grad=requires_grad,
        )

    @classmethod
    def const(cls, b: Scalar | UOp, dtype: DType | str | None = None, device: str | None = None) -> Tensor:
        """tinygrad's `Tensor.const`: a 0-d tensor holding `b`, a Python number (dtype from it unless given) or a
        bound Variable (its value, read when the kernel runs: one kernel serves every value).

        >>> from xgrad import Variable
        >>> Tensor.const(2.5).tolist(), Tensor.const(3, dtypes.int8).dtype
        (2.5, dtypes.int8)
        >>> Tensor.const(Variable("i", 0, 9).bind(5), dtypes.int32).item()
        5
        """
        tc = cls._tensor_cls()
        if not isinstance(b, UOp):
            dt = to_dtype(dtype) if dtype is not None else scalar_dtype(b)
            return tc(b, device=device, dtype=dt)
        if sint_min(b) < 0:
            raise ShapeError(f"Tensor.const of {b!r}: a Variable's range must start at 0 or more")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
        values = tc.arange(sint_max(b) + 1, device=device, dtype=dt)  # values[b] reads the value at run time
        view = values._symbolic_index(b)
        assert view is not None
        return view

    def const_like(self, b: Scalar, dtype: DType | str | None = None) -> Tensor:
        """The constant `b` broadcast to self's shape, on self's device, in self's dtype unless `dtype` is given.

        >>> Tensor([1, 2, 3]).const_like(5).tolist()
        [5, 5, 5]
        """
        return self._new(UOp.const(to_dtype(dtype) if dtype is not None else self.dtype, b, self.device, self.shape))
