"""Helpers shared by the Tensor mixins: scalar types, broadcasting, default devices and dtypes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xgrad.device import Device
from xgrad.dtype import DType, dtypes
from xgrad.errors import ShapeError
from xgrad.uop.symshape import same_symbolic_size

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

Scalar = int | float | bool


def canonical_device(device: str | None) -> str:
    return Device.canonicalize(device) if device is not None else Device.DEFAULT


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting of two shapes; ShapeError names both when they do not fit."""
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1 and not same_symbolic_size(x, y):
            raise ShapeError(f"shapes {a} and {b} cannot be broadcast together")
        out.append(y if x == 1 else x)  # of two equal symbolic sizes written differently (i+j, j+i), a's
    return tuple(out)


def weak_dtype(x: Scalar) -> DType:
    """The dtype a Python scalar has when it meets a tensor: weak, it takes the tensor's dtype."""
    return dtypes.bool if isinstance(x, bool) else dtypes.weakint if isinstance(x, int) else dtypes.weakfloat


def scalar_dtype(x: Scalar) -> DType:
    """The dtype of a tensor made from a Python scalar alone."""
    if isinstance(x, bool):
        return dtypes.bool
    return dtypes.default_int if isinstance(x, int) else dtypes.default_float


def with_requires_grad(t: Tensor, requires_grad: bool | None) -> Tensor:
    """`t` with its `requires_grad` set when one is given: the creation methods' `requires_grad=`."""
    if requires_grad is not None:
        t.requires_grad = requires_grad
    return t
