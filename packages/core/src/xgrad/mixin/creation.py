"""Creation of tensors: empty, full, zeros, ones, arange and the *_like forms."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from xgrad.dtype import DType, dtypes, least_upper_dtype, to_dtype
from xgrad.errors import ShapeError, XgradError
from xgrad.helpers import argfix, prod
from xgrad.mixin.common import Scalar, canonical_device, scalar_dtype
from xgrad.mixin.reduce import ReduceMixin
from xgrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


class CreationMixin(ReduceMixin):
    __slots__ = ()

    # ---- creation ----
    @classmethod
    def empty(cls, *shape: Any, device: str | None = None, dtype: DType | str | None = None) -> Tensor:
        from xgrad.engine.schedule import new_buffer_uop

        sh = tuple(int(s) for s in argfix(*shape))
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float()
        return cls._tensor_cls()(new_buffer_uop(canonical_device(device), prod(sh), dt).reshape(sh))

    @classmethod
    def full(
        cls, shape: Sequence[int] | int, fill_value: Scalar, device: str | None = None, dtype: DType | str | None = None
    ) -> Tensor:
        sh = (shape,) if isinstance(shape, int) else tuple(shape)
        if any(s < 0 for s in sh):
            raise ShapeError(f"negative dimension in shape {sh}")
        dt = to_dtype(dtype) if dtype is not None else scalar_dtype(fill_value)
        return cls._tensor_cls()(UOp.const(dt, fill_value, canonical_device(device), sh))

    @classmethod
    def zeros(cls, *shape: Any, **kwargs: Any) -> Tensor:
        return cls.full(argfix(*shape), 0.0 if "dtype" not in kwargs else 0, **kwargs)

    @classmethod
    def ones(cls, *shape: Any, **kwargs: Any) -> Tensor:
        return cls.full(argfix(*shape), 1.0 if "dtype" not in kwargs else 1, **kwargs)

    @classmethod
    def arange(
        cls,
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
            to_dtype(dtype) if dtype is not None else least_upper_dtype(*(scalar_dtype(x) for x in (start, stop, step)))
        )
        n = max(0, math.ceil((stop - start) / step))
        iota = cls._tensor_cls()(UOp(Ops.IOTA, dt, (UOp(Ops.DEVICE, arg=canonical_device(device)),), n))
        return iota * step + start if (step != 1 or start != 0) else iota

    def full_like(self, fill_value: Scalar, **kwargs: Any) -> Tensor:
        return self._tensor_cls().full(
            self.shape, fill_value, dtype=kwargs.get("dtype", self.dtype), device=kwargs.get("device", self.device)
        )

    def zeros_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs: Any) -> Tensor:
        return self.full_like(1, **kwargs)
