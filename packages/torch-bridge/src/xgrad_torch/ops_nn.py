"""Aten kernels of neural-network layers and indexing: the matmul family, convolution, pooling, batch/layer/group
norm, softmax, losses, embedding, index/index_put/scatter/gather, sort/topk, cat/pad/flip, each with the backward
kernel torch's autograd calls.

In: aten calls on `xgrad`. Out: entries of `ops.TABLE`. A backward kernel is a closed form, or the gradient of the
same xgrad forward computed by xgrad's autograd (`ops_activation.vjp`), so the bridge runs the kernels native xgrad
would, or, where torch fixes the routing (max pooling's indices), a scatter of the gradient to torch's indices.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np
import torch

from xgrad import Tensor, UOp, dtypes

from . import storage
from .ops import Args, float_of, kernel, operand, register, tensor, x_of
from .ops_activation import vjp
from .registration import BridgeError
from .storage import to_xgrad_dtype, wrap


def _ints(v: Any, n: int) -> tuple[int, ...]:
    v = [v] if isinstance(v, int) else list(v)
    return tuple(int(e) for e in (v * n if len(v) == 1 else v))


# ---- matmul family ----
register(
    ["mm", "mm.out", "bmm", "bmm.out", "matmul"],
    "matmul",
    lambda a: x_of(a["self"]) @ x_of(a["mat2" if "mat2" in a else "other"]),
)
register(["dot", "mv"], "matmul", lambda a: x_of(a["self"]) @ x_of(a["tensor" if "tensor" in a else "vec"]))


def _addmm(a: Args) -> Tensor:
    product = x_of(a["mat1" if "mat1" in a else "batch1"]) @ x_of(a["mat2" if "mat2" in a else "batch2"])
    if a["alpha"] != 1:
        product = product * a["alpha"]
    if a["beta"] == 0:
        return product
    return product + (x_of(a["self"]) * a["beta"] if a["beta"] != 1 else x_of(a["self"]))


register(["addmm", "addmm.out", "addmm_", "baddbmm", "baddbmm_"], "matmul", _addmm)


# ---- convolution ----
def _conv(x: Tensor, w: Tensor, b: Tensor | None, a: Args) -> Tensor:
    n = w.ndim - 2
    stride, padding, dilation = _ints(a["stride"], n), _ints(a["padding"], n), _ints(a["dilation"], n)
    if a["transposed"]:
        return x.conv_transpose2d(w, b, a["groups"], stride, dilation, padding, _ints(a["output_padding"], n))
    return x.conv2d(w, b, a["groups"], stride, dilation, list(padding))


# The forward's convolution graph (without bias, over detached leaves), kept for its backward: convolution_backward
# differentiates it with xgrad's autograd, and rebuilding it there cost as much Python as the forward's own conv2d
# (hash-consing gives the same nodes either way). Kept only where torch records the op for backward, under the
# input's storage holder, so an entry goes with the input's storage (autograd saves the input until backward), and
# keyed by the conv (the weight's storage, the arguments, the input's layout), not by the values, so a forward that
# no backward follows (an evaluation without no_grad, into the same input buffer every time) replaces its entry
# instead of adding one. The backward takes its entry out and uses it when it holds the same input and weight
# values; otherwise (another value, retain_graph) it builds the graph again.
Saved = tuple[UOp, UOp, Tensor, Tensor, Tensor]  # (input node, weight node, detached input, detached weight, conv)
_saved_convs: weakref.WeakKeyDictionary[storage.Holder, dict[tuple[Any, ...], Saved]] = weakref.WeakKeyDictionary()


def _conv_key(inp: torch.Tensor, weight: torch.Tensor, a: Args) -> tuple[Any, ...]:
    args = (tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]), bool(a["transposed"]))
    layout = (tuple(inp.shape), tuple(inp.stride()), inp.storage_offset())
    owner = id(weight) if weight.is_cpu else id(storage.holder_of(weight))
    return (owner, *args, tuple(a["output_padding"]), int(a["groups"]), *layout)


def _conv_leaves(x: Tensor, w: Tensor, a: Args) -> tuple[Tensor, Tensor, Tensor]:
    xd, wd = x.detach(), w.detach()
    if wd.uop is xd.uop:  # conv2d(t, t): two leaves, each with its own gradient (one node would get their sum twice)
        wd = wd.detach()
    return xd.requires_grad_(True), wd.requires_grad_(True), _conv(xd, wd, None, a)


def _convolution(a: Args) -> Tensor:
    inp, weight = a["input"], a["weight"]
    x, w = x_of(inp), x_of(weight)
    bias = x_of(a["bias"]) if a["bias"] is not None else None
    if not (torch.is_grad_enabled() and (inp.requires_grad or weight.requires_grad)) or inp.is_cpu:
        return _conv(x, w, bias, a)
    xd, wd, y = _conv_leaves(x, w, a)
    _saved_convs.setdefault(storage.holder_of(inp), {})[_conv_key(inp, weight, a)] = (x.uop, w.uop, xd, wd, y)
    return y if bias is None else y + bias.reshape((1, y.shape[1]) + (1,) * (y.ndim - 2))  # as conv2d adds it


register(["convolution", "_convolution"], "nn", _convolution)


@kernel("convolution_backward", kind="nn")
def convolution_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: list[bool],
) -> tuple[torch.Tensor | None, ...]:
    """(grad_input, grad_weight, grad_bias) of `convolution`, those `output_mask` asks for."""
    a = {"stride": stride, "padding": padding, "dilation": dilation, "transposed": transposed}
    a |= {"output_padding": output_padding, "groups": groups}
    g = x_of(grad_output)
    x, w = x_of(input), x_of(weight)
    saved = None
    if not input.is_cpu and (convs := _saved_convs.get(storage.holder_of(input))) is not None:
        saved = convs.pop(_conv_key(input, weight, a), None)
    if saved is not None and saved[0] is x.uop and saved[1] is w.uop:
        xd, wd, y = saved[2:]
    else:
        xd, wd, y = _conv_leaves(x, w, a)
    # only what is asked for is differentiated (a first layer needs no input gradient)
    targets = [t for t, wanted in zip((xd, wd), output_mask[:2]) if wanted]
    grads = iter(y.gradient(*targets, gradient=g) if targets else [])
    gx = next(grads) if output_mask[0] else None
    gw = next(grads) if output_mask[1] else None
    gb = g.sum(tuple(i for i in range(g.ndim) if i != 1)) if output_mask[2] else None
    return (
        wrap(gx, input.dtype) if gx is not None else None,
        wrap(gw, weight.dtype) if gw is not None else None,
        wrap(gb, grad_output.dtype) if gb is not None else None,
    )


# ---- pooling ----
def _pool_args(a: Args, n: int = 2) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    k = _ints(a["kernel_size"], n)
    s = _ints(a["stride"], n) if a["stride"] else k
    return k, s, _ints(a["padding"], n)


def _max_pool(a: Args) -> tuple[Tensor, Tensor]:
    k, s, p = _pool_args(a)
    pooled = x_of(a["self"]).max_pool2d(k, s, _ints(a["dilation"], 2), p, a["ceil_mode"], return_indices=True)
    assert isinstance(pooled, tuple)
    out, idx = pooled
    return out, idx.cast(dtypes.int64)


def _max_pool_backward(a: Args) -> Tensor:
    x, g, idx = x_of(a["self"]), x_of(a["grad_output"]), x_of(a["indices"])
    lead, spatial = x.shape[:-2], x.shape[-2] * x.shape[-1]
    flat = Tensor.zeros(*lead, spatial, dtype=g.dtype)
    return flat.scatter_reduce(-1, idx.flatten(-2), g.flatten(-2), "sum").reshape(x.shape)


register(["max_pool2d_with_indices"], "nn", _max_pool)
register(["max_pool2d_with_indices_backward"], "nn", _max_pool_backward)


def _avg_pool(x: Tensor, a: Args) -> Tensor:
    k, s, p = _pool_args(a)
    if a.get("divisor_override"):
        total = x.avg_pool2d(k, s, 1, p, a["ceil_mode"], True) * math.prod(k)
        return tensor(total / a["divisor_override"])
    return x.avg_pool2d(k, s, 1, p, a["ceil_mode"], a["count_include_pad"])


register(["avg_pool2d"], "nn", lambda a: _avg_pool(x_of(a["self"]), a))
register(
    ["avg_pool2d_backward"],
    "nn",
    lambda a: vjp(lambda x: _avg_pool(x, a), [x_of(a["self"])], x_of(a["grad_output"]))[0],
)


def _adaptive_avg(x: Tensor, size: tuple[int, ...]) -> Tensor:
    h, w = x.shape[-2:]
    oh, ow = size
    if h % oh or w % ow:
        raise BridgeError(f"adaptive_avg_pool2d from {(h, w)} to {(oh, ow)}: xgrad_torch needs sizes that divide")
    return x.reshape(*x.shape[:-2], oh, h // oh, ow, w // ow).mean((-3, -1))


register(["_adaptive_avg_pool2d"], "nn", lambda a: _adaptive_avg(x_of(a["self"]), _ints(a["output_size"], 2)))
register(
    ["_adaptive_avg_pool2d_backward"],
    "nn",
    lambda a: vjp(
        lambda x: _adaptive_avg(x, tuple(a["grad_output"].shape[-2:])), [x_of(a["self"])], x_of(a["grad_output"])
    )[0],
)


# ---- normalisation ----
def _batch_norm(a: Args) -> tuple[Tensor, Tensor, Tensor]:
    x = x_of(a["input"])
    axes = tuple(i for i in range(x.ndim) if i != 1)
    w = x_of(a["weight"]) if a["weight"] is not None else None
    b = x_of(a["bias"]) if a["bias"] is not None else None
    if a["training"]:
        mean = x.mean(axes)
        var = ((x - mean.reshape(1, -1, *([1] * (x.ndim - 2)))) ** 2).mean(axes)
        invstd = (var + a["eps"]).rsqrt()
        n = x.numel() // x.shape[1]
        m = a["momentum"]
        if a["running_mean"] is not None:
            storage.write(a["running_mean"], x_of(a["running_mean"]) * (1 - m) + mean * m)
            storage.write(a["running_var"], x_of(a["running_var"]) * (1 - m) + var * (n / max(n - 1, 1)) * m)
    else:
        mean = x_of(a["running_mean"])
        invstd = (x_of(a["running_var"]) + a["eps"]).rsqrt()
    return x.batchnorm(w, b, mean, invstd), mean, invstd


register(["native_batch_norm"], "nn", _batch_norm)


@kernel("_native_batch_norm_legit", "_native_batch_norm_legit.no_stats", kind="nn")
def _native_batch_norm_legit(input: torch.Tensor, weight: Any, bias: Any, *rest: Any) -> Any:
    """torch's batch norm entry point with or without running statistics."""
    if len(rest) == 5:
        running_mean, running_var, training, momentum, eps = rest
    else:
        running_mean = running_var = None
        training, momentum, eps = rest
    a = {"input": input, "weight": weight, "bias": bias, "running_mean": running_mean, "running_var": running_var}
    out = _batch_norm(a | {"training": training, "momentum": momentum, "eps": eps})
    return tuple(wrap(t, input.dtype) for t in out)


@kernel("_native_batch_norm_legit_no_training", kind="nn")
def _native_batch_norm_legit_no_training(
    input: torch.Tensor, weight: Any, bias: Any, running_mean: Any, running_var: Any, momentum: float, eps: float
) -> Any:
    """Batch norm with the running statistics (eval mode)."""
    a = {"input": input, "weight": weight, "bias": bias, "running_mean": running_mean, "running_var": running_var}
    return tuple(wrap(t, input.dtype) for t in _batch_norm(a | {"training": False, "momentum": momentum, "eps": eps}))


def _batch_norm_backward(a: Args) -> tuple[Tensor | None, ...]:
    x, g = x_of(a["input"]), x_of(a["grad_out"])
    axes = tuple(i for i in range(x.ndim) if i != 1)
    shape = (1, -1, *([1] * (x.ndim - 2)))
    w = x_of(a["weight"]).reshape(shape) if a["weight"] is not None else 1.0
    if a["train"]:
        mean, invstd = x_of(a["save_mean"]), x_of(a["save_invstd"])
    else:
        mean, invstd = x_of(a["running_mean"]), (x_of(a["running_var"]) + a["eps"]).rsqrt()
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    gw, gb = (g * xhat).sum(axes), g.sum(axes)
    if a["train"]:
        n = x.numel() // x.shape[1]
        gx = (g - gb.reshape(shape) / n - xhat * gw.reshape(shape) / n) * invstd.reshape(shape) * w
    else:
        gx = g * invstd.reshape(shape) * w
    mask = a["output_mask"]
    return gx if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None


@kernel("native_batch_norm_backward", kind="nn")
def native_batch_norm_backward(*args: Any) -> Any:
    """(grad_input, grad_weight, grad_bias) of batch norm."""
    names = ["grad_out", "input", "weight", "running_mean", "running_var", "save_mean", "save_invstd", "train", "eps"]
    a = dict(zip([*names, "output_mask"], args))
    return tuple(wrap(t) if t is not None else None for t in _batch_norm_backward(a))


def _layer_norm(x: Tensor, shape: tuple[int, ...], w: Tensor | None, b: Tensor | None, eps: float) -> Tensor:
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    y = x.layernorm(axes, eps)
    y = y * w if w is not None else y
    return y + b if b is not None else y


def _native_layer_norm(a: Args) -> tuple[Tensor, Tensor, Tensor]:
    x, shape = x_of(a["input"]), tuple(a["normalized_shape"])
    w = x_of(a["weight"]) if a["weight"] is not None else None
    b = x_of(a["bias"]) if a["bias"] is not None else None
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = x.mean(axes, keepdim=True)
    rstd = ((x - mean) ** 2).mean(axes, keepdim=True).add(a["eps"]).rsqrt()
    return _layer_norm(x, shape, w, b, a["eps"]), mean, rstd


def _native_layer_norm_backward(a: Args) -> tuple[Tensor | None, ...]:
    x, shape = x_of(a["input"]), tuple(a["normalized_shape"])
    ins = [x] + [x_of(a[k]) for k in ("weight", "bias") if a[k] is not None]
    has_w, has_b = a["weight"] is not None, a["bias"] is not None

    def forward(x: Tensor, *params: Tensor) -> Tensor:
        w = params[0] if has_w else None
        b = params[-1] if has_b else None
        return _layer_norm(x, shape, w, b, 1e-5 if "eps" not in a else a["eps"])

    grads = vjp(forward, ins, x_of(a["grad_out"]))
    gw = grads[1] if has_w else None
    gb = grads[-1] if has_b else None
    mask = a["output_mask"]
    return grads[0] if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None


register(["native_layer_norm"], "nn", _native_layer_norm)


@kernel("native_layer_norm_backward", kind="nn")
def native_layer_norm_backward(
    grad_out: Any, input: Any, normalized_shape: Any, mean: Any, rstd: Any, weight: Any, bias: Any, output_mask: Any
) -> Any:
    """(grad_input, grad_weight, grad_bias) of layer norm (the saved rstd gives eps back)."""
    rstd_x, mean_x = x_of(rstd), x_of(mean)
    x = x_of(input)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    var = ((x - mean_x) ** 2).mean(axes, keepdim=True)
    eps = (rstd_x**-2 - var).mean().item() if x.numel() else 1e-5  # saved rstd = 1/sqrt(var + eps)
    a = {"grad_out": grad_out, "input": input, "normalized_shape": normalized_shape, "weight": weight, "bias": bias}
    grads = _native_layer_norm_backward(a | {"output_mask": output_mask, "eps": max(eps, 0.0)})
    return tuple(wrap(t) if t is not None else None for t in grads)


def _group_norm(x: Tensor, groups: int, w: Tensor | None, b: Tensor | None, eps: float) -> Tensor:
    n, c = x.shape[:2]
    y = x.reshape(n, groups, -1).layernorm(-1, eps).reshape(x.shape)
    shape = (1, c, *([1] * (x.ndim - 2)))
    y = y * w.reshape(shape) if w is not None else y
    return y + b.reshape(shape) if b is not None else y


def _native_group_norm(a: Args) -> tuple[Tensor, Tensor, Tensor]:
    x = x_of(a["input"])
    w = x_of(a["weight"]) if a["weight"] is not None else None
    b = x_of(a["bias"]) if a["bias"] is not None else None
    g = x.reshape(a["N"], a["group"], -1)
    mean = g.mean(-1)
    rstd = g.var(-1, correction=0).add(a["eps"]).rsqrt()
    return _group_norm(x, a["group"], w, b, a["eps"]), mean, rstd


register(["native_group_norm"], "nn", _native_group_norm)


@kernel("native_group_norm_backward", kind="nn")
def native_group_norm_backward(
    grad_out: Any, input: Any, mean: Any, rstd: Any, weight: Any, n: int, c: int, hxw: int, group: int, output_mask: Any
) -> Any:
    """(grad_input, grad_weight, grad_bias) of group norm."""
    x = x_of(input)
    var = x.reshape(n, group, -1).var(-1, correction=0)
    eps = max((x_of(rstd) ** -2 - var).mean().item(), 0.0) if x.numel() else 1e-5
    ins = [x] + [x_of(p) for p in (weight,) if p is not None]
    has_w = weight is not None

    def forward(x: Tensor, *params: Tensor) -> Tensor:
        return _group_norm(x, group, params[0] if has_w else None, None, eps)

    grads = vjp(forward, ins, x_of(grad_out))
    g = x_of(grad_out)
    gb = g.sum(tuple(i for i in range(g.ndim) if i != 1))
    out = (grads[0], grads[1] if has_w else None, gb)
    return tuple(wrap(t) if t is not None and m else None for t, m in zip(out, output_mask))


# ---- softmax ----
def _softmax(log: bool) -> Any:
    def compute(a: Args) -> Tensor:
        x = x_of(a["self"], torch.float32 if a["half_to_float"] else None)
        return x.log_softmax(a["dim"]) if log else x.softmax(a["dim"])

    return compute


register(["_softmax", "_softmax.out"], "nn", _softmax(False))
register(["_log_softmax", "_log_softmax.out"], "nn", _softmax(True))


def _softmax_backward(a: Args) -> Tensor:
    g, y = x_of(a["grad_output"]), x_of(a["output"])
    return (y * (g - (g * y).sum(a["dim"], keepdim=True))).cast(to_xgrad_dtype(a["input_dtype"]))


def _log_softmax_backward(a: Args) -> Tensor:
    g, y = x_of(a["grad_output"]), x_of(a["output"])
    return (g - y.exp() * g.sum(a["dim"], keepdim=True)).cast(to_xgrad_dtype(a["input_dtype"]))


register(["_softmax_backward_data"], "nn", _softmax_backward)
register(["_log_softmax_backward_data"], "nn", _log_softmax_backward)


# ---- losses (reduction: 0 none, 1 mean, 2 sum) ----
def _nll_parts(a: Args) -> tuple[Tensor, Tensor]:
    """Per-element losses (class axis 1, or 0 for 1-d input) and weights, ignored targets weighted 0."""
    x, t = x_of(a["self"]), x_of(a["target"]).cast(dtypes.int32)
    axis = 1 if x.ndim > 1 else 0
    c = x.shape[axis]
    valid = t != a["ignore_index"]
    safe = valid.where(t, 0)
    picked = x.gather(axis, safe.unsqueeze(axis)).squeeze(axis)
    w = x_of(a["weight"])[safe] if a["weight"] is not None else Tensor.ones(*safe.shape, dtype=x.dtype)
    w = valid.where(w, 0).cast(x.dtype)
    del c
    return -picked * w, w


def _nll_forward(a: Args) -> tuple[Tensor, Tensor]:
    losses, w = _nll_parts(a)
    total = w.sum()
    if a["reduction"] == 0:
        return losses, total
    if a["reduction"] == 2:
        return losses.sum(), total
    return losses.sum() / total, total


def _nll_backward(a: Args) -> Tensor:
    x = x_of(a["self"])
    t = x_of(a["target"]).cast(dtypes.int32)
    axis = 1 if x.ndim > 1 else 0
    valid = t != a["ignore_index"]
    safe = valid.where(t, 0)
    w = x_of(a["weight"])[safe] if a["weight"] is not None else Tensor.ones(*safe.shape, dtype=x.dtype)
    w = valid.where(w, 0).cast(x.dtype)
    g = x_of(a["grad_output"])
    if a["reduction"] == 1:
        g = g / x_of(a["total_weight"])
    per = -(w * g)  # broadcast: scalar g for mean/sum, per element for none
    onehot = safe.unsqueeze(axis) == Tensor.arange(x.shape[axis]).reshape(
        *([1] * axis), x.shape[axis], *([1] * (x.ndim - axis - 1))
    )
    return tensor(onehot.where(per.unsqueeze(axis), 0).cast(x.dtype))


register(["nll_loss_forward", "nll_loss2d_forward"], "loss", _nll_forward)
register(["nll_loss_backward", "nll_loss2d_backward"], "loss", _nll_backward)


def _reduce_loss(x: Tensor, reduction: int) -> Tensor:
    return x if reduction == 0 else x.mean() if reduction == 1 else x.sum()


register(["mse_loss"], "loss", lambda a: _reduce_loss((x_of(a["self"]) - x_of(a["target"])) ** 2, a["reduction"]))


def _mse_backward(a: Args) -> Tensor:
    d = x_of(a["self"]) - x_of(a["target"])
    g = x_of(a["grad_output"]) * 2 * d
    return g / d.numel() if a["reduction"] == 1 else g


register(["mse_loss_backward"], "loss", _mse_backward)


def _bce(a: Args) -> Tensor:
    x, y = x_of(a["self"]), x_of(a["target"])
    loss = -(y * x.log().maximum(-100) + (1 - y) * (1 - x).log().maximum(-100))
    if a["weight"] is not None:
        loss = loss * x_of(a["weight"])
    return _reduce_loss(loss, a["reduction"])


register(["binary_cross_entropy"], "loss", _bce)


def _bce_backward(a: Args) -> Tensor:
    x, y, g = x_of(a["self"]), x_of(a["target"]), x_of(a["grad_output"])
    grad = g * (x - y) / ((1 - x) * x).maximum(1e-12)
    if a["weight"] is not None:
        grad = grad * x_of(a["weight"])
    return grad / x.numel() if a["reduction"] == 1 else grad


register(["binary_cross_entropy_backward"], "loss", _bce_backward)


# ---- embedding, indexing, scatter, gather ----
register(["embedding"], "index", lambda a: x_of(a["weight"])[x_of(a["indices"]).cast(dtypes.int32)])


def _embedding_backward(a: Args) -> Tensor:
    idx, g = x_of(a["indices"]).cast(dtypes.int32).reshape(-1), x_of(a["grad_output"])
    n = a["num_weights"]
    g = g.reshape(-1, g.shape[-1])
    keep = idx != a["padding_idx"]
    onehot = (idx.unsqueeze(1) == Tensor.arange(n).unsqueeze(0)) & keep.unsqueeze(1)
    return tensor(onehot.cast(g.dtype).transpose(0, 1) @ g)


register(["embedding_dense_backward"], "index", _embedding_backward)


def _index_key(self: torch.Tensor, indices: list[Any]) -> tuple[Any, ...]:
    key: list[Any] = []
    for i in indices:
        if i is None:
            key.append(slice(None))
        elif i.dtype == torch.bool:  # a mask: its positions (data-dependent shape: read on the host)
            mask = storage.to_numpy(i) if i.device.type == "xgrad" else i.numpy()
            for axis_positions in np.nonzero(mask):
                key.append(Tensor(axis_positions.astype(np.int32)))
        else:
            key.append(x_of(i).cast(dtypes.int32))
    return tuple(key)


register(["index.Tensor"], "index", lambda a: x_of(a["self"])[_index_key(a["self"], a["indices"])])


def _index_put(a: Args) -> Tensor:
    self = a["self"]
    x = x_of(self)
    positions = Tensor.arange(x.numel()).reshape(x.shape)[_index_key(self, a["indices"])]
    values = operand(a["values"], self.dtype)
    values = values.expand(positions.shape) if isinstance(values, Tensor) else Tensor.full(positions.shape, values)
    flat = x.reshape(-1)
    if a["accumulate"]:
        out = flat.scatter_reduce(0, positions.reshape(-1), values.reshape(-1).cast(flat.dtype), "sum")
    else:
        out = flat.scatter(0, positions.reshape(-1), values.reshape(-1).cast(flat.dtype))
    return out.reshape(x.shape)


register(["index_put", "index_put_", "_index_put_impl_"], "index", _index_put)
register(
    ["gather", "gather.out"], "index", lambda a: x_of(a["self"]).gather(a["dim"], x_of(a["index"]).cast(dtypes.int32))
)


def _index_select(a: Args) -> Tensor:
    x = x_of(a["self"])
    key = (slice(None),) * (a["dim"] % max(x.ndim, 1)) + (x_of(a["index"]).cast(dtypes.int32),)
    return x[key]


register(["index_select"], "index", _index_select)


def _index_add(a: Args) -> Tensor:
    x, src = x_of(a["self"]), x_of(a["source"], a["self"].dtype)
    dim = a["dim"] % max(x.ndim, 1)
    idx = x_of(a["index"]).cast(dtypes.int32).reshape(*([1] * dim), -1, *([1] * (x.ndim - dim - 1))).expand(src.shape)
    return x.scatter_reduce(dim, idx, src * a["alpha"] if a["alpha"] != 1 else src, "sum")


register(["index_add", "index_add_", "index_add.out"], "index", _index_add)


def _unfold_backward(a: Args) -> Tensor:
    sizes, dim, size, step = tuple(a["input_sizes"]), a["dim"], a["size"], a["step"]
    dim %= max(len(sizes), 1)
    stride = storage._contiguous(sizes)
    windows = (sizes[dim] - size) // step + 1
    shape = (*sizes[:dim], windows, *sizes[dim + 1 :], size)
    strides = (*stride[:dim], stride[dim] * step, *stride[dim + 1 :], stride[dim])
    idx = Tensor(storage._indices(shape, strides, 0).reshape(-1).astype(np.int32))
    flat = Tensor.zeros(math.prod(sizes), dtype=to_xgrad_dtype(a["grad_in"].dtype))
    return flat.scatter_reduce(0, idx, x_of(a["grad_in"]).reshape(-1), "sum").reshape(sizes)


register(["unfold_backward"], "index", _unfold_backward)


def _scatter(a: Args) -> Tensor:
    x, idx = x_of(a["self"]), x_of(a["index"]).cast(dtypes.int32)
    src = operand(a["src"] if "src" in a else a["value"], a["self"].dtype)
    reduce = a.get("reduce")
    if reduce is None:
        return x.scatter(a["dim"], idx, src)
    mode = {
        "add": "sum",
        "multiply": "prod",
        "sum": "sum",
        "prod": "prod",
        "mean": "mean",
        "amax": "amax",
        "amin": "amin",
    }[reduce]
    return x.scatter_reduce(a["dim"], idx, src, mode, include_self=a.get("include_self", True))


register(
    ["scatter.src", "scatter.value", "scatter_.src", "scatter_.value", "scatter.reduce", "scatter_.reduce"],
    "index",
    _scatter,
)
register(
    ["scatter_add", "scatter_add_"],
    "index",
    lambda a: x_of(a["self"]).scatter_reduce(a["dim"], x_of(a["index"]).cast(dtypes.int32), x_of(a["src"]), "sum"),
)
register(["scatter_reduce.two", "scatter_reduce_.two"], "index", _scatter)


# ---- sort, topk ----
def _sort(a: Args) -> tuple[Tensor, Tensor]:
    x = x_of(a["self"])
    if x.ndim == 0:
        return x, Tensor(0, dtype=dtypes.int64)
    values, indices = x.sort(a["dim"], a["descending"])
    return values, indices.cast(dtypes.int64)


def _topk(a: Args) -> tuple[Tensor, Tensor]:
    values, indices = x_of(a["self"]).topk(a["k"], a["dim"], a["largest"], a["sorted"])
    return values, indices.cast(dtypes.int64)


register(["sort", "sort.stable"], "sort", _sort)
register(["topk"], "sort", _topk)


# ---- joining, padding, flipping ----
def _cat(a: Args) -> Tensor:
    tensors = [t for t in a["tensors"] if t.numel() or t.dim() != 1]
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    xs = [x_of(t, dtype) for t in tensors]
    return xs[0].cat(*xs[1:], dim=a["dim"]) if len(xs) > 1 else xs[0]


register(["cat", "cat.out"], "joining", _cat)


def _pad(a: Args) -> Tensor:
    x, pad = x_of(a["self"]), list(a["pad"])
    pairs = [(pad[i], pad[i + 1]) for i in range(0, len(pad), 2)]  # last dim first
    full = [(0, 0)] * (x.ndim - len(pairs)) + pairs[::-1]
    if any(lo < 0 or hi < 0 for lo, hi in full):
        x = x.shrink(tuple((max(-lo, 0), s - max(-hi, 0)) for (lo, hi), s in zip(full, x.shape)))
        full = [(max(lo, 0), max(hi, 0)) for lo, hi in full]
    return x.pad(full, value=a["value"])


register(["constant_pad_nd"], "joining", _pad)
register(["flip"], "joining", lambda a: x_of(a["self"]).flip(tuple(a["dims"])))
register(["roll"], "joining", lambda a: x_of(a["self"]).roll(tuple(a["shifts"]), tuple(a["dims"])))
register(["tril", "tril_"], "joining", lambda a: x_of(a["self"]).tril(a["diagonal"]))
register(["triu", "triu_"], "joining", lambda a: x_of(a["self"]).triu(a["diagonal"]))


# ---- data-dependent shapes: the host decides the size ----
@kernel("nonzero", kind="index")
def nonzero(self: torch.Tensor) -> torch.Tensor:
    """Indices of the non-zero elements (their count needs the values: realized on the host)."""
    positions = np.argwhere(storage.to_numpy(self)).astype(np.int64)
    return wrap(Tensor(positions) if positions.size else Tensor.zeros(0, self.dim(), dtype=dtypes.int64), torch.int64)


@kernel("masked_select", kind="index")
def masked_select(self: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The elements where `mask` is true, flattened (the count needs the mask: realized on the host)."""
    values, m = np.broadcast_arrays(
        storage.to_numpy(self), x_of(mask).numpy() if mask.device.type == "xgrad" else mask.numpy()
    )
    picked = values[m.astype(bool)]
    return wrap(Tensor(picked.copy()) if picked.size else Tensor.zeros(0, dtype=to_xgrad_dtype(self.dtype)), self.dtype)


__all__ = ["float_of"]
