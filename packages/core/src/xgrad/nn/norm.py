"""Normalisation layers: `BatchNorm` (= `BatchNorm2d` = `BatchNorm3d`), `GroupNorm`, `InstanceNorm`, `LayerNorm`,
`LayerNorm2d`, `RMSNorm`. They hold the affine parameters and running statistics; `Tensor.layernorm` and
`Tensor.batchnorm` do the normalising.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xgrad.dtype import DType, dtypes
from xgrad.errors import ShapeError
from xgrad.helpers import TRAINING, prod
from xgrad.tensor import Tensor


# ---- helpers ----
def _batch_stats(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel (axis 1) mean and biased variance over every other axis."""
    axes = tuple(i for i in range(x.ndim) if i != 1)
    mean = x.mean(axes)
    # the mean's own gradient through the variance is zero (sum(x - mean) = 0): detaching it is exact and cheaper
    var = (x - mean.detach().reshape((1, -1) + (1,) * (x.ndim - 2))).square().mean(axes)
    return mean, var


def _filled(shape: int | tuple[int, ...], value: float, dtype: DType | None = None) -> Tensor:
    """A new buffer of its own holding `value`. (A lazy `Tensor.full(...).contiguous()` is hash-consed: two of them
    of the same shape are one node, and realizing one turns the other into the same buffer, so layers would share
    their running statistics or weights.)"""

    dt = dtype or dtypes.default_float
    return Tensor(np.full(shape, value, dtype=np.float32 if dtypes.is_float(dt) else np.int32), dtype=dt)


def _affine(n: int | tuple[int, ...]) -> tuple[Tensor, Tensor]:
    return _filled(n, 1.0).is_param_(), _filled(n, 0.0).is_param_()


def _check_channels(x: Tensor, channels: int, layer: str) -> None:
    if x.ndim < 2 or x.shape[1] != channels:
        raise ShapeError(f"{layer} was built for {channels} channels (axis 1), the input has shape {x.shape}")


# ---- layers ----
class BatchNorm:
    """Batch normalisation over every axis but 1 (channels), for inputs of any rank: (N, C), (N, C, L), (N, C, H, W).

    Under `Context(TRAINING=1)` it normalises with the batch's statistics and, with `track_running_stats`, moves the
    running statistics toward them (`momentum`; the variance unbiased, as torch does) with `assign`: realize them
    (an optimizer's `step()` does) to keep the update. Otherwise it uses the running statistics. `running_mean`,
    `running_var` and `num_batches_tracked` are not parameters (`is_param` False).

    >>> from xgrad import Tensor
    >>> bn = BatchNorm(3)
    >>> bn(Tensor.ones(2, 3, 4, 4)).shape
    (2, 3, 4, 4)
    """

    def __init__(
        self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True, momentum: float = 0.1
    ) -> None:
        self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        if affine:
            self.weight, self.bias = _affine(sz)
        self.running_mean = _filled(sz, 0.0).is_param_(False) if track_running_stats else None
        self.running_var = _filled(sz, 1.0).is_param_(False) if track_running_stats else None
        self.num_batches_tracked = _filled(1, 0, dtypes.int32).is_param_(False) if track_running_stats else None
        self.sz = sz

    def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(mean, 1/sqrt(var + eps)) per channel: the running ones in eval mode, else the batch's."""
        if self.running_mean is not None and self.running_var is not None and not TRAINING:
            return self.running_mean, self.running_var.add(self.eps).rsqrt()
        mean, var = _batch_stats(x)
        return mean, var.add(self.eps).rsqrt()

    def __call__(self, x: Tensor) -> Tensor:
        _check_channels(x, self.sz, "BatchNorm")
        mean, invstd = self.calc_stats(x)
        if TRAINING and self.running_mean is not None and self.running_var is not None:
            assert self.num_batches_tracked is not None
            n = prod(x.shape) // x.shape[1]
            var_unbiased = _batch_stats(x)[1].detach() * (n / max(n - 1, 1))  # the same nodes as in calc_stats
            m = self.momentum
            self.running_mean.assign(self.running_mean * (1 - m) + mean.detach().cast(self.running_mean.dtype) * m)
            self.running_var.assign(self.running_var * (1 - m) + var_unbiased.cast(self.running_var.dtype) * m)
            self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        return x.batchnorm(self.weight, self.bias, mean, invstd)


BatchNorm2d = BatchNorm3d = BatchNorm


class GroupNorm:
    """Normalise each of `num_groups` channel groups of each sample; per-channel affine `weight`/`bias`.

    >>> from xgrad import Tensor
    >>> GroupNorm(2, 4)(Tensor.ones(1, 4, 3)).shape
    (1, 4, 3)
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        if num_channels % num_groups:
            raise ShapeError(f"num_channels={num_channels} must be a multiple of num_groups={num_groups}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        if affine:
            self.weight, self.bias = _affine(num_channels)

    def __call__(self, x: Tensor) -> Tensor:
        _check_channels(x, self.num_channels, "GroupNorm")
        y = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
        if self.weight is None or self.bias is None:
            return y
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return y * self.weight.reshape(shape) + self.bias.reshape(shape)


class InstanceNorm:
    """Normalise each channel of each sample over its spatial axes; per-channel affine `weight`/`bias`
    (on by default, as in tinygrad; torch's InstanceNorm2d defaults to affine=False).

    >>> from xgrad import Tensor
    >>> InstanceNorm(3)(Tensor.ones(2, 3, 4)).shape
    (2, 3, 4)
    """

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True) -> None:
        self.num_features, self.eps = num_features, eps
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        if affine:
            self.weight, self.bias = _affine(num_features)

    def __call__(self, x: Tensor) -> Tensor:
        _check_channels(x, self.num_features, "InstanceNorm")
        y = x.reshape(x.shape[0], x.shape[1], -1).layernorm(eps=self.eps).reshape(x.shape)
        if self.weight is None or self.bias is None:
            return y
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return y * self.weight.reshape(shape) + self.bias.reshape(shape)


class LayerNorm:
    """Normalise over the trailing `normalized_shape` axes; elementwise affine `weight`/`bias` of that shape.

    >>> from xgrad import Tensor
    >>> LayerNorm(4)(Tensor.ones(2, 4)).shape
    (2, 4)
    """

    def __init__(
        self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True
    ) -> None:
        self.normalized_shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(int(s) for s in normalized_shape)
        )
        self.axis = tuple(-1 - i for i in range(len(self.normalized_shape)))
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        if elementwise_affine:
            self.weight, self.bias = _affine(self.normalized_shape)

    def __call__(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        if x.shape[x.ndim - n :] != self.normalized_shape:
            raise ShapeError(f"LayerNorm was built for trailing shape {self.normalized_shape}, the input is {x.shape}")
        y = x.layernorm(self.axis, self.eps)
        if self.weight is None or self.bias is None:
            return y
        return y * self.weight + self.bias


class LayerNorm2d(LayerNorm):
    """`LayerNorm` over the channels of a channels-first (N, C, H, W) input.

    >>> from xgrad import Tensor
    >>> LayerNorm2d(3)(Tensor.ones(1, 3, 2, 2)).shape
    (1, 3, 2, 2)
    """

    def __call__(self, x: Tensor) -> Tensor:
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RMSNorm:
    """Scale the last axis to unit root-mean-square (computed in float32, cast back), then by `weight`.

    >>> from xgrad import Tensor
    >>> RMSNorm(2)(Tensor([[3.0, 4.0]])).shape
    (1, 2)
    """

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        self.eps = eps
        self.weight = _filled(dim, 1.0).is_param_() if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        xf = x.float()
        y = (xf * xf.square().mean(-1, keepdim=True).add(self.eps).rsqrt()).cast(x.dtype)
        return y if self.weight is None else y * self.weight
