"""Movement ops: views of a tensor that become index math in kernels, never copies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from xgrad.dtype import dtypes
from xgrad.errors import ShapeError
from xgrad.helpers import argfix, prod
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import Scalar
from xgrad.uop.ops import UOp

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


class MovementMixin(TensorBase):
    __slots__ = ()

    # ---- movement ----
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
        return self._new(self.uop.reshape(tuple(int(s) for s in new)))

    def permute(self, order: Any, *args: int) -> Tensor:
        o = tuple(self._axis(a) for a in argfix(order, *args))
        if sorted(o) != list(range(self.ndim)):
            raise ShapeError(f"permute order {o} is not a permutation of the {self.ndim} axes of {self.shape}")
        return self._new(self.uop.permute(o))

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
        out = self._new(x.uop.pad(grow))
        if value != 0 and any(b or a for b, a in grow):
            mask = self._new(UOp.const(dtypes.bool, True, self.device, x.shape).pad(grow))
            out = mask.where(out, value)
        return out

    def shrink(self, arg: Sequence[tuple[int, int] | None]) -> Tensor:
        if len(arg) != self.ndim:
            raise ShapeError(f"shrink {tuple(arg)} has {len(arg)} entries for {self.ndim} dimensions")
        full = tuple((0, s) if a is None else (int(a[0]), int(a[1])) for a, s in zip(arg, self.shape))
        for (b, e), s in zip(full, self.shape):
            if not 0 <= b <= e <= s:
                raise ShapeError(f"shrink {full} is out of range for shape {self.shape}")
        return self._new(self.uop.shrink(full))

    def flip(self, axis: Any, *args: int) -> Tensor:
        axes = {self._axis(a) for a in argfix(axis, *args)}
        return self._new(self.uop.flip(tuple(i in axes for i in range(self.ndim))))

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
        return self._t() if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1 :])
