"""Neural-network functions: sequential, normalization, attention and the losses.

Losses take `reduction` 'mean' | 'sum' | 'none'. Class indices are compared with an arange of the classes (a
one-hot mask made on the fly), so no gather is needed and out-of-range labels simply pick nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from xgrad.dtype import dtypes, least_upper_dtype, sum_acc_dtype
from xgrad.errors import ArgumentError, DTypeError, ShapeError
from xgrad.mixin.base import TensorBase
from xgrad.mixin.unary import _softplus

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


def _class_mask(y: Tensor, num_classes: int, class_axis: int) -> Tensor:
    """Bool one-hot of the int labels `y`, with a class axis of `num_classes` inserted at `class_axis`."""
    if dtypes.is_float(y.dtype) or y.dtype == dtypes.bool:
        raise DTypeError(f"class labels must be an int tensor, got {y.dtype.name}; cast them with .int()")
    classes = y._tensor_cls().arange(num_classes, device=y.device, dtype=dtypes.int32)
    ndim = y.ndim + 1
    classes = classes.reshape(tuple(num_classes if i == class_axis else 1 for i in range(ndim)))
    return y.unsqueeze(class_axis) == classes


def _mean_over(total: Tensor, count: Tensor) -> Tensor:
    """total / count; nan (with a zero gradient, as torch) when every label was ignored."""
    empty = count == 0
    return empty.where(math.nan, total / empty.where(1, count))


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ArgumentError(f"reduction={reduction!r}: use 'mean', 'sum' or 'none'")


class NNMixin(TensorBase):
    __slots__ = ()

    def _do_reduction(self, reduction: str = "mean") -> Tensor:
        _check_reduction(reduction)
        return self._t().mean() if reduction == "mean" else self._t().sum() if reduction == "sum" else self._t()

    def sequential(self, ll: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
        """Apply each function (or layer) of `ll` in turn.

        >>> Tensor([1.0, -2.0]).sequential([lambda x: x * 2, Tensor.relu]).tolist()
        [2.0, 0.0]"""
        return functools.reduce(lambda x, f: f(x), ll, self._t())

    # ---- normalization ----
    def layernorm(self, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Tensor:
        """(x - mean) / sqrt(var + eps) over `axis` (biased variance), without scale or shift. 16-bit floats are
        computed in float32 (as torch) and rounded once at the end.

        >>> [round(v, 4) for v in Tensor([1.0, 3.0]).layernorm().tolist()]
        [-1.0, 1.0]"""
        x = self._t()._float()
        xa = x.cast(sum_acc_dtype(x.dtype))
        y = xa - xa.mean(axis, keepdim=True)
        return (y * (y * y).mean(axis, keepdim=True).add(eps).rsqrt()).cast(x.dtype)

    def batchnorm(
        self,
        weight: Tensor | None,
        bias: Tensor | None,
        mean: Tensor,
        invstd: Tensor,
        axis: int | Sequence[int] = 1,
    ) -> Tensor:
        """(x - mean) * invstd * weight + bias, the 1-d parameters laid along `axis` (the channel axis).

        >>> Tensor([[1.0, 2.0]]).batchnorm(None, None, Tensor([1.0, 0.0]), Tensor([1.0, 0.5])).tolist()
        [[0.0, 1.0]]"""
        axes = {self._axis(a) for a in ((axis,) if isinstance(axis, int) else axis)}
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))

        def laid(p: Tensor, what: str) -> Tensor:
            if p.numel() != math.prod(shape):
                raise ShapeError(f"batchnorm {what} of shape {p.shape} does not fit axis {axis} of {self.shape}")
            return p.reshape(shape)

        x = self._t() - laid(mean, "mean")
        if weight is not None:
            x = x * laid(weight, "weight")
        x = x * laid(invstd, "invstd")
        return x + laid(bias, "bias") if bias is not None else x

    # ---- attention ----
    def scaled_dot_product_attention(
        self,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        enable_gqa: bool = False,
    ) -> Tensor:
        """softmax(q @ k^T / sqrt(E) + mask) @ v for q (..., L, E), k (..., S, E), v (..., S, Ev). A bool
        `attn_mask` keeps where True; a float one is added. `is_causal` lets query i see keys j <= i. With
        `enable_gqa`, k and v may have fewer heads (axis -3) than q, each shared by a group of query heads. Scores
        and softmax are computed in at least float32.

        >>> q = Tensor([[1.0, 0.0]])
        >>> q.scaled_dot_product_attention(Tensor([[1.0, 0.0]]), Tensor([[2.0, 3.0]])).tolist()
        [[2.0, 3.0]]"""
        q = self._t()
        if q.ndim < 2 or key.ndim < 2 or value.ndim < 2:
            raise ShapeError(f"attention needs q, k, v of at least 2 dims, got {q.shape}, {key.shape}, {value.shape}")
        if enable_gqa and q.ndim >= 3 and key.ndim >= 3 and key.shape[-3] != q.shape[-3]:
            key, value = _repeat_heads(key, q.shape[-3]), _repeat_heads(value, q.shape[-3])
        score_dtype = least_upper_dtype(q.dtype, key.dtype, dtypes.float32)
        qk = (q.cast(score_dtype) @ key.cast(score_dtype).transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]))
        if is_causal:
            if attn_mask is not None:
                raise ArgumentError(
                    "attention takes is_causal or attn_mask, not both: fold the causal mask in attn_mask"
                )
            rows = q._tensor_cls().arange(q.shape[-2], device=q.device, dtype=dtypes.int32)
            cols = q._tensor_cls().arange(key.shape[-2], device=q.device, dtype=dtypes.int32)
            attn_mask = rows.reshape(-1, 1) >= cols.reshape(1, -1)
        if attn_mask is not None:
            qk = attn_mask.where(qk, -math.inf) if attn_mask.dtype == dtypes.bool else qk + attn_mask
        weights = qk.softmax(-1)
        if dropout_p > 0:
            weights = weights.dropout(dropout_p)
        return weights.cast(least_upper_dtype(value.dtype, q.dtype)) @ value

    # ---- losses ----
    def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:  # noqa: N803
        """-(Y log p + (1 - Y) log(1 - p)) for probabilities p = self; each log is clamped at -100, as torch.

        >>> round(Tensor([0.5]).binary_crossentropy(Tensor([1.0])).item(), 6)
        0.693147"""
        _check_reduction(reduction)
        p = self._t()._float()
        loss = -(Y * p.log().clamp(min_=-100) + (1 - Y) * (1 - p).log().clamp(min_=-100))
        return loss._do_reduction(reduction)

    def binary_crossentropy_logits(
        self,
        Y: Tensor,  # noqa: N803
        reduction: str = "mean",
        pos_weight: Tensor | None = None,
    ) -> Tensor:
        """binary_crossentropy of sigmoid(self), computed stably from the logits; `pos_weight` scales the positive
        term, as torch's BCEWithLogitsLoss.

        >>> round(Tensor([100.0]).binary_crossentropy_logits(Tensor([0.0])).item(), 4)
        100.0"""
        _check_reduction(reduction)
        x = self._t()._float()
        log_weight = 1 if pos_weight is None else (pos_weight - 1) * Y + 1
        loss = (1 - Y) * x + log_weight * x._in_float32(lambda z: _softplus(-z))
        return loss._do_reduction(reduction)

    def sparse_categorical_crossentropy(
        self,
        Y: Tensor,  # noqa: N803
        ignore_index: int = -1,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
    ) -> Tensor:
        """Cross entropy of logits (..., C) (classes on the LAST axis) with int labels Y (...). Labels equal to
        `ignore_index` add nothing and are not counted by 'mean'; `label_smoothing` mixes in the uniform target.

        >>> round(Tensor([[0.0, 0.0]]).sparse_categorical_crossentropy(Tensor([1])).item(), 6)
        0.693147"""
        _check_reduction(reduction)
        if Y.shape != self.shape[:-1]:
            raise ShapeError(f"labels of shape {Y.shape} do not fit logits of shape {self.shape} (classes last)")
        logp = self._t().log_softmax(-1)
        nll = -_class_mask(Y, self.shape[-1], Y.ndim).where(logp, 0.0).sum(-1)
        loss = nll * (1 - label_smoothing) - logp.mean(-1) * label_smoothing
        counted = Y != ignore_index
        loss = counted.where(loss, 0.0)
        if reduction == "mean":
            return _mean_over(loss.sum(), counted.sum())
        return loss.sum() if reduction == "sum" else loss

    def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:  # noqa: N803
        """Cross entropy of logits (N, C, ...) (classes on axis 1; axis 0 for a 1-d input) with Y either int class
        indices (N, ...) or float class probabilities of the logits' shape.

        >>> round(Tensor([[0.0, 0.0]]).cross_entropy(Tensor([0])).item(), 6)
        0.693147"""
        _check_reduction(reduction)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ArgumentError(f"label_smoothing={label_smoothing} must be in [0, 1]")
        class_axis = 1 if self.ndim >= 2 else 0
        if self.ndim == 0:
            raise ShapeError("cross_entropy needs logits with a class axis, got a 0-d tensor")
        num_classes = self.shape[class_axis]
        if dtypes.is_float(Y.dtype):
            if Y.shape != self.shape:
                raise ShapeError(f"class probabilities of shape {Y.shape} must match the logits' shape {self.shape}")
            target = Y
        else:
            want = self.shape[:class_axis] + self.shape[class_axis + 1 :]
            if Y.shape != want:
                raise ShapeError(f"class indices of shape {Y.shape} do not fit logits {self.shape}: expected {want}")
            target = _class_mask(Y, num_classes, class_axis).where(1.0, 0.0)
        target = target * (1 - label_smoothing) + label_smoothing / num_classes
        loss = -(self._t().log_softmax(class_axis) * target).sum(class_axis)
        return loss._do_reduction(reduction)

    def nll_loss(
        self,
        Y: Tensor,  # noqa: N803
        weight: Tensor | None = None,
        ignore_index: int | None = None,
        reduction: str = "mean",
    ) -> Tensor:
        """Negative log likelihood of log-probabilities (N, C, ...) (classes on axis 1; axis 0 for a 1-d input)
        at int labels Y (N, ...). `weight` (C,) scales each class; 'mean' divides by the summed weights of the
        labels that are not `ignore_index`.

        >>> Tensor([[-1.0, -2.0]]).nll_loss(Tensor([1])).item()
        2.0"""
        _check_reduction(reduction)
        if self.ndim == 0:
            raise ShapeError("nll_loss needs log-probabilities with a class axis, got a 0-d tensor")
        class_axis = 1 if self.ndim >= 2 else 0
        hit = _class_mask(Y, self.shape[class_axis], class_axis)
        picked = hit.where(self._t()._float(), 0.0).sum(class_axis)
        if weight is None:
            w = picked.ones_like()
        else:
            laid = weight.reshape(tuple(-1 if i == class_axis else 1 for i in range(self.ndim)))
            w = hit.where(laid._float(), 0.0).sum(class_axis)
        if ignore_index is not None:
            w = (Y != ignore_index).where(w, 0.0)
        nll = -picked * w
        if reduction == "mean":
            return _mean_over(nll.sum(), w.sum())
        return nll.sum() if reduction == "sum" else nll


def _repeat_heads(x: Tensor, heads: int) -> Tensor:
    """x (..., H, S, D) with each of its H heads repeated heads // H times in place: (..., heads, S, D)."""
    h = x.shape[-3]
    if heads % h:
        raise ShapeError(f"enable_gqa: {heads} query heads are not a multiple of {h} key/value heads")
    grouped = x.unsqueeze(-3).expand(*x.shape[:-3], h, heads // h, *x.shape[-2:])
    return grouped.reshape(*x.shape[:-3], heads, *x.shape[-2:])
