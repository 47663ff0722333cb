"""Convolution, pooling and resampling, N-d over the trailing dimensions despite the `2d` in the names.

Every windowed op reads one view: `_pool` turns (..., i_1, ..., i_n) into (..., o_1, ..., o_n, k_1, ..., k_n) with
movement ops only (tile, flatten, reshape with a row length of i + dilation so each row starts one dilation step
further, keep every stride-th column). Convolution multiplies that view with the weight and sums; pools reduce it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from xgrad.dtype import DType, dtypes, least_upper_float
from xgrad.errors import ArgumentError, ShapeError
from xgrad.helpers import ceildiv, make_tuple, prod
from xgrad.mixin.base import TensorBase

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

IntOrTuple = int | Sequence[int]


def _pool_axis(x: Tensor, axis: int, k: int, s: int, d: int) -> tuple[Tensor, bool]:
    """Split `axis` (size i) into two axes holding the windows, out[j, m] = x[j * s + m * d], in place. Returns the
    tensor and whether the two new axes are (o, k) (True) or (k, o) (False)."""
    pre, i, post = x.shape[:axis], x.shape[axis], x.shape[axis + 1 :]
    o = (i - d * (k - 1) - 1) // s + 1

    def at_axis(*pair: tuple[int, int]) -> tuple[tuple[int, int], ...]:
        return tuple((0, n) for n in pre) + pair + tuple((0, n) for n in post)

    if d == 1 and s == k:  # windows tile the axis: one reshape
        return x.shrink(at_axis((0, o * k))).reshape(pre + (o, k) + post), True
    # tile the axis, then read it as k rows of length i + d: row m starts at m * (i + d), i.e. at x[m * d]
    tiles = ceildiv(k * (i + d), i)
    rows = x.reshape(pre + (1, i) + post).expand(pre + (tiles, i) + post).reshape(pre + (tiles * i,) + post)
    rows = rows.shrink(at_axis((0, k * (i + d)))).reshape(pre + (k, i + d) + post)
    if o * s != i + d:  # keep o * s columns (padding when the last stride step runs past the row)
        rows = rows.pad(tuple((0, 0) for _ in pre) + ((0, 0), (0, o * s - (i + d))) + tuple((0, 0) for _ in post))
    if s == 1:
        return rows, False
    rows = rows.reshape(pre + (k, o, s) + post).shrink(at_axis((0, k), (0, o), (0, 1)))
    return rows.reshape(pre + (k, o) + post), False


def _pool(x: Tensor, k: tuple[int, ...], s: tuple[int, ...], d: tuple[int, ...]) -> Tensor:
    """Sliding windows over the last len(k) axes: (..., i_1..i_n) -> (..., o_1..o_n, k_1..k_n)."""
    n = len(k)
    lead = x.ndim - n
    for j in range(n):
        i = x.shape[lead + j]
        if i < d[j] * (k[j] - 1) + 1:
            raise ShapeError(
                f"window of size {k[j]} with dilation {d[j]} does not fit in dimension {j} of size {i} "
                f"(input spatial shape {x.shape[lead : lead + n]}); pad the input or use a smaller kernel"
            )
    out_first = [False] * n
    for j in reversed(range(n)):  # last axis first, so the earlier axes keep their positions
        x, out_first[j] = _pool_axis(x, lead + j, k[j], s[j], d[j])
    pairs = [(lead + 2 * j, lead + 2 * j + 1) if out_first[j] else (lead + 2 * j + 1, lead + 2 * j) for j in range(n)]
    order = list(range(lead)) + [o for o, _ in pairs] + [w for _, w in pairs]
    return x if order == list(range(x.ndim)) else x.permute(order)


def _resolve_padding(padding: int | Sequence[int] | str, n: int) -> list[tuple[int, int]]:
    """(before, after) per spatial dim from an int, n ints (symmetric per dim) or 2n ints (flat, torch F.pad order:
    last dim first)."""
    if isinstance(padding, int):
        return [(padding, padding)] * n
    if isinstance(padding, str):
        raise ConvPaddingError(f"padding {padding!r}: only conv2d takes padding strings; give the padding as ints")
    pads = list(padding)
    if len(pads) == n:
        return [(p, p) for p in pads]
    if len(pads) == 2 * n:
        return [(pads[2 * j], pads[2 * j + 1]) for j in reversed(range(n))]
    raise ShapeError(f"padding {tuple(pads)} must be an int, {n} ints or {2 * n} ints for {n} spatial dimensions")


class ConvPaddingError(ShapeError, RuntimeError):
    """A padding string conv2d does not take (a RuntimeError too, as torch's, and a ValueError as every ShapeError)."""


def string_padding(padding: str, k: tuple[int, ...], s: tuple[int, ...], d: tuple[int, ...]) -> list[tuple[int, int]]:
    """torch's padding strings: "valid" pads nothing; "same" keeps the spatial sizes (stride 1 only), with the odd
    element of an even total after. Case does not matter ("SAME"), as in tinygrad's layers."""
    padding = padding.lower()
    if padding == "valid":
        return [(0, 0)] * len(k)
    if padding != "same":
        raise ConvPaddingError(f"padding {padding!r} is not a padding string; use 'same', 'valid' or ints")
    if any(x != 1 for x in s):
        raise ConvPaddingError(f"padding='same' needs stride 1, got stride {s}; give the padding as ints")
    totals = [di * (ki - 1) for ki, di in zip(k, d, strict=True)]
    return [(t // 2, t - t // 2) for t in totals]


def _tuple(x: IntOrTuple | str, n: int, what: str) -> tuple[int, ...]:
    if isinstance(x, str):
        raise ConvPaddingError(f"{what} {x!r}: only conv2d takes padding strings; give the {what} as ints")
    t = make_tuple(x, n)
    if len(t) != n:
        raise ShapeError(f"{what} {tuple(t)} must have {n} entries, one per spatial dimension")
    return t


def _spatial_dims(x: Tensor, weight: Tensor, op: str, weight_layout: str) -> int:
    """The number of spatial dims of a convolution; input and weight must agree on it."""
    n = weight.ndim - 2
    if x.ndim != weight.ndim or n < 1:
        raise ShapeError(
            f"{op} input {x.shape} and weight {weight.shape} must be (N, C_in, *spatial) and {weight_layout}"
        )
    return n


def _kernel_stride_dilation(
    weight: Tensor, stride: IntOrTuple, dilation: IntOrTuple, n: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    return weight.shape[2:], _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation")


def _ceil_extra(i: int, k: int, s: int, d: int, pads: tuple[int, int], ceil_mode: bool) -> int:
    """Extra right padding so ceil_mode gets torch's output size (the last window starts inside input or left pad)."""
    span = i + pads[0] + pads[1] - d * (k - 1) - 1
    if not ceil_mode or span < 0:
        return 0
    o = ceildiv(span, s) + 1
    if (o - 1) * s >= i + pads[0]:
        o -= 1
    return max(0, (o - 1) * s + d * (k - 1) + 1 - (i + pads[0] + pads[1]))


class ConvMixin(TensorBase):
    __slots__ = ()

    def _pool_args(
        self, kernel_size: IntOrTuple, stride: IntOrTuple | None, dilation: IntOrTuple, padding: IntOrTuple
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], list[tuple[int, int]]]:
        k = make_tuple(kernel_size, 2)
        n = len(k)
        if self.ndim < n:
            raise ShapeError(f"pooling with a {n}-d kernel {k} needs at least {n} dimensions, got shape {self.shape}")
        s = _tuple(stride if stride is not None else k, n, "stride")
        return k, s, _tuple(dilation, n, "dilation"), _resolve_padding(padding, n)

    # ---- convolution ----
    def conv2d(
        self,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride: IntOrTuple = 1,
        dilation: IntOrTuple = 1,
        padding: IntOrTuple | str = 0,
        dtype: DType | str | None = None,
    ) -> Tensor:
        """Cross-correlation of (N, C_in, *spatial) with weight (C_out, C_in / groups, *kernel), any number of spatial
        dims. `padding`: int, one int per dim, 2 per dim in torch F.pad order (last dim first), or "same"/"valid" (as
        torch's). `dtype` is the accumulation dtype.

        >>> Tensor([[[1.0, 2.0, 3.0, 4.0]]]).conv2d(Tensor([[[1.0, -1.0]]])).tolist()
        [[[-1.0, -1.0, -1.0]]]
        """
        n = _spatial_dims(
            self._t(), weight, "conv2d", "(C_out, C_in / groups, *kernel) with the same number of spatial dims"
        )
        batch, cin = self.shape[:2]
        cout, cin_g = weight.shape[:2]
        if groups < 1 or cin != cin_g * groups or cout % groups:
            raise ShapeError(
                f"conv2d input {self.shape} with weight {weight.shape} and groups={groups}: need C_in = "
                f"{cin} = weight.shape[1] * groups and C_out = {cout} divisible by groups"
            )
        k, s, d = _kernel_stride_dilation(weight, stride, dilation, n)
        pads = string_padding(padding, k, s, d) if isinstance(padding, str) else _resolve_padding(padding, n)
        x = self._t().pad(((0, 0), (0, 0), *pads)) if any(p != (0, 0) for p in pads) else self._t()
        windows = _pool(x, k, s, d)  # (N, C_in, *o, *k)
        o = windows.shape[2 : 2 + n]
        windows = windows.reshape((batch, groups, 1, cin_g) + o + k)
        w = weight.reshape((1, groups, cout // groups, cin_g) + (1,) * n + k)
        reduce_axes = (3,) + tuple(range(4 + n, 4 + 2 * n))
        out = (windows * w).sum(reduce_axes, dtype=dtype).reshape((batch, cout) + o)
        return out if bias is None else out + bias.reshape((1, cout) + (1,) * n)

    def conv_transpose2d(
        self,
        weight: Tensor,
        bias: Tensor | None = None,
        groups: int = 1,
        stride: IntOrTuple = 1,
        dilation: IntOrTuple = 1,
        padding: IntOrTuple = 0,
        output_padding: IntOrTuple = 0,
    ) -> Tensor:
        """Transposed convolution (the gradient of conv2d with respect to its input) of (N, C_in, *spatial) with
        weight (C_in, C_out / groups, *kernel); `padding` is one int or one per dim.

        >>> Tensor([[[1.0, 2.0]]]).conv_transpose2d(Tensor([[[1.0, 10.0]]])).tolist()
        [[[1.0, 12.0, 20.0]]]
        """
        n = _spatial_dims(self._t(), weight, "conv_transpose2d", "(C_in, C_out / groups, *kernel)")
        cin, cout_g = weight.shape[:2]
        if groups < 1 or cin % groups or self.shape[1] != cin:
            raise ShapeError(
                f"conv_transpose2d input {self.shape} with weight {weight.shape} and groups={groups}: need "
                f"C_in = weight.shape[0] = {cin}, divisible by groups"
            )
        k, s, d = _kernel_stride_dilation(weight, stride, dilation, n)
        p, op = _tuple(padding, n, "padding"), _tuple(output_padding, n, "output_padding")
        w = weight.reshape((groups, cin // groups, cout_g) + k).transpose(1, 2)
        w = w.reshape((groups * cout_g, cin // groups) + k).flip(tuple(range(2, 2 + n)))
        x = self._t()
        for j, sj in enumerate(s):  # put sj - 1 zeros between neighbours along each spatial dim
            if sj == 1:
                continue
            axis = 2 + j
            i = x.shape[axis]
            x = x.unsqueeze(axis + 1).pad(tuple((0, sj - 1) if a == axis + 1 else (0, 0) for a in range(x.ndim + 1)))
            x = x.reshape(x.shape[:axis] + (i * sj,) + x.shape[axis + 2 :])
            x = x.shrink(tuple((0, (i - 1) * sj + 1) if a == axis else (0, size) for a, size in enumerate(x.shape)))
        flat: list[int] = []
        for j in reversed(range(n)):
            edge = d[j] * (k[j] - 1) - p[j]
            flat += [edge, edge + op[j]]
        return x.conv2d(w, bias, groups, 1, d, flat)

    # ---- pooling ----
    def avg_pool2d(
        self,
        kernel_size: IntOrTuple = (2, 2),
        stride: IntOrTuple | None = None,
        dilation: IntOrTuple = 1,
        padding: IntOrTuple = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> Tensor:
        """Average over windows of the last len(kernel_size) dims (an int kernel means 2 dims); stride defaults to the
        kernel. With `count_include_pad=False` padded zeros are not counted.

        >>> Tensor([[1.0, 2.0, 3.0, 4.0]]).avg_pool2d((2,)).tolist()
        [[1.5, 3.5]]
        """
        k, s, d, pads = self._pool_args(kernel_size, stride, dilation, padding)
        n = len(k)
        spatial = self.shape[self.ndim - n :]
        extra = [_ceil_extra(i, kj, sj, dj, pj, ceil_mode) for i, kj, sj, dj, pj in zip(spatial, k, s, d, pads)]
        lead = [(0, 0)] * (self.ndim - n)
        grown = [(b, a + e) for (b, a), e in zip(pads, extra)]
        x = self._t()._float().pad(lead + grown)
        kernel_axes = tuple(range(x.ndim, x.ndim + n))
        total = _pool(x, k, s, d).sum(kernel_axes)
        if count_include_pad and not any(extra):
            return total / int(prod(k))
        ones = self._tensor_cls().ones(spatial, device=self.device, dtype=x.dtype)
        counted = ones.pad(pads, value=1.0 if count_include_pad else 0.0).pad([(0, e) for e in extra])
        return total / _pool(counted, k, s, d).sum(tuple(range(n, 2 * n)))

    def _pool_max_indices(
        self, k: tuple[int, ...], s: tuple[int, ...], d: tuple[int, ...], pads: list[tuple[int, int]], mx: Tensor
    ) -> Tensor:
        """Flat index (within the spatial dims) of the first maximum of each window, as torch returns."""
        n = len(k)
        spatial = self.shape[self.ndim - n :]
        big = prod(spatial)
        flat = self._tensor_cls().arange(big, device=self.device).reshape(spatial).pad(pads, value=big)
        windows = flat.reshape((1,) * (self.ndim - n) + flat.shape)
        kernel_axes = tuple(range(self.ndim, self.ndim + n))
        return mx.where(_pool(windows, k, s, d), big).min(kernel_axes)

    def max_pool2d(
        self,
        kernel_size: IntOrTuple = (2, 2),
        stride: IntOrTuple | None = None,
        dilation: IntOrTuple = 1,
        padding: IntOrTuple = 0,
        ceil_mode: bool = False,
        return_indices: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Maximum over windows of the last len(kernel_size) dims (an int kernel means 2 dims); stride defaults to the
        kernel. `return_indices=True` also gives the flat spatial index of each maximum (the first one on ties).

        >>> Tensor([[1.0, 3.0, 2.0, 0.0]]).max_pool2d((2,), return_indices=True)[1].tolist()
        [[1, 2]]
        """
        k, s, d, pads = self._pool_args(kernel_size, stride, dilation, padding)
        n = len(k)
        spatial = self.shape[self.ndim - n :]
        extra = [_ceil_extra(i, kj, sj, dj, pj, ceil_mode) for i, kj, sj, dj, pj in zip(spatial, k, s, d, pads)]
        low = -float("inf") if dtypes.is_float(self.dtype) else dtypes.min(self.dtype)
        grown = [(b, a + e) for (b, a), e in zip(pads, extra)]
        windows = _pool(self._t().pad([(0, 0)] * (self.ndim - n) + grown, value=low), k, s, d)
        kernel_axes = tuple(range(self.ndim, self.ndim + n))
        out = windows.max(kernel_axes)
        if not return_indices:
            return out
        hit = windows == out.reshape(out.shape + (1,) * n)
        return out, self._pool_max_indices(k, s, d, grown, hit)

    def max_unpool2d(
        self,
        indices: Tensor,
        kernel_size: IntOrTuple = (2, 2),
        stride: IntOrTuple | None = None,
        dilation: IntOrTuple = 1,
        padding: IntOrTuple = 0,
        output_size: Sequence[int] | None = None,
    ) -> Tensor:
        """Inverse of max_pool2d: each value goes to the flat spatial position `indices` names, zeros elsewhere.
        The output size is (i - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1 unless `output_size` (the
        full shape or just the spatial dims) is given.

        >>> Tensor([[3.0, 2.0]]).max_unpool2d(Tensor([[1, 2]]), (2,)).tolist()
        [[0.0, 3.0, 2.0, 0.0]]
        """
        k, s, d, pads = self._pool_args(kernel_size, stride, dilation, padding)
        n = len(k)
        if indices.shape != self.shape:
            raise ShapeError(f"max_unpool2d indices {indices.shape} must have the shape of the input {self.shape}")
        lead, spatial = self.shape[: self.ndim - n], self.shape[self.ndim - n :]
        if output_size is not None:
            out_spatial = tuple(output_size)[-n:]
        else:
            out_spatial = tuple(
                (i - 1) * sj - b - a + dj * (kj - 1) + 1 for i, kj, sj, dj, (b, a) in zip(spatial, k, s, d, pads)
            )
        positions = prod(out_spatial)
        ids = indices.reshape(lead + (prod(spatial), 1))
        target = ids == self._tensor_cls().arange(positions, device=self.device).cast(ids.dtype)
        values = self._t().reshape(lead + (prod(spatial), 1))
        scattered = target.where(values, values.zeros_like()).sum(-2, dtype=self.dtype)
        return scattered.reshape(lead + out_spatial)

    # ---- resampling ----
    def interpolate(self, size: int | Sequence[int], mode: str = "linear", align_corners: bool = False) -> Tensor:
        """Resize the last len(size) dims to `size`. `mode` is 'linear' (bi/trilinear on several dims), 'nearest'
        (torch's legacy floor(o * in / out)) or 'nearest-exact'; `align_corners` only applies to 'linear'.

        >>> Tensor([[1.0, 3.0]]).interpolate((4,)).tolist()
        [[1.0, 1.5, 2.5, 3.0]]
        """
        sizes = (size,) if isinstance(size, int) else tuple(size)
        if not 0 < len(sizes) <= self.ndim:
            raise ShapeError(f"interpolate size {sizes} must name between 1 and {self.ndim} trailing dims")
        if mode not in ("linear", "nearest", "nearest-exact"):
            raise ArgumentError(f"interpolate mode {mode!r} is not one of 'linear', 'nearest', 'nearest-exact'")
        x = self._t()._float() if mode == "linear" else self._t()
        coord = least_upper_float(x.dtype) if mode == "linear" else dtypes.float32
        coord = dtypes.float32 if coord.itemsize < 4 else coord
        for j, out_size in enumerate(sizes):
            axis = self.ndim - len(sizes) + j
            in_size = x.shape[axis]
            if out_size == in_size:  # every mode maps a same-size axis onto itself
                continue
            out_pos = self._tensor_cls().arange(out_size, device=self.device).cast(coord)
            if mode == "linear":
                if align_corners:
                    src = out_pos * ((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0)
                else:
                    src = ((out_pos + 0.5) * (in_size / out_size) - 0.5).maximum(0.0)
                i0 = src.floor()
                frac = (src - i0).cast(x.dtype)
                i0 = i0.cast(dtypes.int32).minimum(in_size - 1)
                i1 = (i0 + 1).minimum(in_size - 1)
                weight = frac.reshape((out_size,) + (1,) * (x.ndim - axis - 1))
                x = _gather_axis(x, axis, i0) * (1 - weight) + _gather_axis(x, axis, i1) * weight
            else:
                offset = 0.5 if mode == "nearest-exact" else 0.0
                idx = ((out_pos + offset) * (in_size / out_size)).floor().cast(dtypes.int32).minimum(in_size - 1)
                x = _gather_axis(x, axis, idx)
        return x


def _gather_axis(x: Tensor, axis: int, idx: Tensor) -> Tensor:
    """x with `axis` replaced by x[..., idx[o], ...] for a 1-d int `idx` (one-hot select and sum, so inf/nan in rows
    that are not picked stay out)."""
    n_in, n_out = x.shape[axis], idx.shape[0]
    pick = idx.reshape(n_out, 1) == x._tensor_cls().arange(n_in, device=x.device).cast(idx.dtype).reshape(1, n_in)
    pick = pick.reshape((n_out, n_in) + (1,) * (x.ndim - axis - 1))
    xe = x.unsqueeze(axis)
    return pick.where(xe, xe.zeros_like()).sum(axis + 1).cast(x.dtype)
