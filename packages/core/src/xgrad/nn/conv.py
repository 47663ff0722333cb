"""Convolution layers: `Conv2d` (any number of spatial dims despite the name), `Conv1d`, `ConvTranspose2d`,
`ConvTranspose1d`. They hold the weights; `Tensor.conv2d` / `Tensor.conv_transpose2d` do the math."""

from __future__ import annotations

import math
from collections.abc import Sequence

from xgrad.errors import ShapeError
from xgrad.helpers import make_tuple, prod
from xgrad.mixin.conv import string_padding
from xgrad.tensor import Tensor

IntOrTuple = int | Sequence[int]
Padding = int | Sequence[int] | str


def _layer_padding(
    padding: Padding, kernel: tuple[int, ...], stride: IntOrTuple, dilation: IntOrTuple
) -> int | Sequence[int]:
    """The layer's padding as numbers: 'valid' is 0, 'same' (stride 1) pads d*(k-1) per dim, one more after when
    that is odd (as torch does), in the flat form `Tensor.conv2d` takes (before, after per dim, last dim first).
    A bad string raises `ConvPaddingError` (a ValueError, as tinygrad's layer) when the layer is built."""
    if not isinstance(padding, str):
        return padding
    n = len(kernel)
    pads = string_padding(padding, kernel, make_tuple(stride, n), make_tuple(dilation, n))
    return [p for pair in reversed(pads) for p in pair]


def _init_params(
    channels: tuple[int, int], kernel: tuple[int, ...], groups: int, bias: bool, n_bias: int | None = None
) -> tuple[Tensor, Tensor | None]:
    """Weight (channels[0], channels[1]/groups, *kernel) and bias (n_bias, default channels[0]), uniform in
    +-1/sqrt(channels[1]/groups * prod(kernel)): torch's init, whose fan_in reads the weight's second dim."""

    lead, grouped = channels
    if lead % groups or grouped % groups:
        raise ShapeError(f"in_channels and out_channels {channels} must both be multiples of groups={groups}")
    bound = 1 / math.sqrt(grouped // groups * prod(kernel))
    weight = Tensor.uniform(lead, grouped // groups, *kernel, low=-bound, high=bound).is_param_()
    n = lead if n_bias is None else n_bias
    return weight, Tensor.uniform(n, low=-bound, high=bound).is_param_() if bias else None


# ---- layers ----
class Conv2d:
    """An N-d convolution layer (the kernel's length sets N): weight (out, in/groups, *kernel) and bias (out,),
    both uniform in +-1/sqrt(in/groups * prod(kernel)) as torch initialises them. `padding` may be an int, one int
    per dim, 2 ints per dim (last dim first), 'same' (stride 1) or 'valid'.

    >>> from xgrad import Tensor
    >>> conv = Conv2d(1, 4, 3, padding=1)
    >>> conv(Tensor.ones(2, 1, 5, 5)).shape
    (2, 4, 5, 5)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOrTuple,
        stride: IntOrTuple = 1,
        padding: Padding = 0,
        dilation: IntOrTuple = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        self.kernel_size = make_tuple(kernel_size, 2)
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.padding = _layer_padding(padding, self.kernel_size, stride, dilation)
        self.weight, self.bias = _init_params((out_channels, in_channels), self.kernel_size, groups, bias)

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)


def Conv1d(  # noqa: N802 (a factory that reads like a class, as in tinygrad)
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride: int = 1,
    padding: int | str = 0,
    dilation: int = 1,
    groups: int = 1,
    bias: bool = True,
) -> Conv2d:
    """A `Conv2d` with a 1-d kernel: input (N, C, L).

    >>> from xgrad import Tensor
    >>> Conv1d(2, 3, 3)(Tensor.ones(1, 2, 8)).shape
    (1, 3, 6)
    """
    return Conv2d(in_channels, out_channels, (kernel_size,), stride, padding, dilation, groups, bias)


class ConvTranspose2d(Conv2d):
    """An N-d transposed convolution layer: weight (in, out/groups, *kernel), bias (out,), torch's init.
    Output size per dim: (i - 1)*stride - 2*padding + dilation*(k - 1) + output_padding + 1.

    >>> from xgrad import Tensor
    >>> ConvTranspose2d(4, 2, 2, stride=2)(Tensor.ones(1, 4, 3, 3)).shape
    (1, 2, 6, 6)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOrTuple,
        stride: IntOrTuple = 1,
        padding: int | Sequence[int] = 0,
        output_padding: IntOrTuple = 0,
        dilation: IntOrTuple = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        self.kernel_size = make_tuple(kernel_size, 2)
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.padding: int | Sequence[int] = padding
        self.output_padding = output_padding
        self.weight, self.bias = _init_params((in_channels, out_channels), self.kernel_size, groups, bias, out_channels)

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(
            self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding, self.output_padding
        )


def ConvTranspose1d(  # noqa: N802 (a factory that reads like a class, as in tinygrad)
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride: int = 1,
    padding: int = 0,
    output_padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
    bias: bool = True,
) -> ConvTranspose2d:
    """A `ConvTranspose2d` with a 1-d kernel: input (N, C, L).

    >>> from xgrad import Tensor
    >>> ConvTranspose1d(2, 3, 3, stride=2)(Tensor.ones(1, 2, 4)).shape
    (1, 3, 9)
    """
    return ConvTranspose2d(
        in_channels, out_channels, (kernel_size,), stride, padding, output_padding, dilation, groups, bias
    )
