"""Aten kernels of activations and their backward kernels (what torch's autograd calls for them).

In: aten calls on `xgrad`. Out: entries of `ops.TABLE`. A backward kernel with no closed form here is the gradient
of the same xgrad forward, computed by xgrad's autograd (`vjp`), so the bridge runs the kernels native xgrad would.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from xgrad import Tensor

from .ops import Args, Compute, overloads_of, register, tensor, x_of
from .storage import to_xgrad_dtype


def _threshold_backward(a: Args) -> Tensor:
    return tensor((x_of(a["self"]) > a["threshold"]).where(x_of(a["grad_output"]), 0))


def _activation(fn: Callable[[Tensor, Args], Tensor]) -> Compute:
    return lambda a: fn(x_of(a["self"]), a).cast(to_xgrad_dtype(a["self"].dtype))


register(overloads_of("threshold_backward"), "nn", _threshold_backward)
register(overloads_of("gelu"), "unary", _activation(lambda x, a: _gelu(x, a["approximate"])))
register(overloads_of("leaky_relu"), "unary", _activation(lambda x, a: x.leaky_relu(a["negative_slope"])))
register(overloads_of("hardtanh"), "unary", _activation(lambda x, a: x.clamp(a["min_val"], a["max_val"])))
register(overloads_of("elu"), "unary", _activation(lambda x, a: _elu(x, a)))
register(overloads_of("softplus"), "unary", _activation(lambda x, a: x.softplus(a["beta"])))
register(overloads_of("hardsigmoid"), "unary", _activation(lambda x, a: x.hardsigmoid()))
register(overloads_of("hardswish"), "unary", _activation(lambda x, a: x.hardswish()))


def _gelu(x: Tensor, approximate: str) -> Tensor:
    return x.gelu() if approximate == "tanh" else x * 0.5 * (1 + (x * (1 / math.sqrt(2))).erf())


def _elu(x: Tensor, a: Args) -> Tensor:
    alpha, scale, in_scale = a["alpha"], a["scale"], a["input_scale"]
    return tensor(scale * (x > 0).where(x, alpha * ((x * in_scale).exp() - 1)))


def _gelu_backward(a: Args) -> Tensor:
    x, g = x_of(a["self"]), x_of(a["grad_output"])
    return vjp(lambda t: _gelu(t, a["approximate"]), [x], g)[0]


def vjp(fn: Callable[..., Tensor], inputs: list[Tensor], grad: Tensor) -> list[Tensor]:
    """The gradients of `fn(*inputs)` with respect to each input, given the output's gradient (xgrad's autograd on
    fresh leaves of the same values, so the backward kernels are the ones native xgrad runs)."""
    leaves = [x.detach().requires_grad_(True) for x in inputs]
    return fn(*leaves).gradient(*leaves, gradient=grad)


register(overloads_of("gelu_backward"), "nn", _gelu_backward)


def _grad_of(fn: Callable[[Tensor, Args], Tensor], input_name: str = "self") -> Compute:
    """The backward kernel `<op>_backward(grad_output, <input>, ...)` of an activation, by xgrad's autograd."""

    def compute(a: Args) -> Tensor:
        x, g = x_of(a[input_name]), x_of(a["grad_output"])
        return vjp(lambda t: fn(t, a), [x], g)[0]

    return compute


register(["hardtanh_backward"], "nn", _grad_of(lambda x, a: x.clamp(a["min_val"], a["max_val"])))
register(["leaky_relu_backward"], "nn", _grad_of(lambda x, a: x.leaky_relu(a["negative_slope"])))
register(["silu_backward"], "nn", _grad_of(lambda x, a: x.silu()))
register(["softplus_backward"], "nn", _grad_of(lambda x, a: x.softplus(a["beta"])))
register(["hardsigmoid_backward"], "nn", _grad_of(lambda x, a: x.hardsigmoid()))
register(["hardswish_backward"], "nn", _grad_of(lambda x, a: x.hardswish()))
register(["mish_backward"], "nn", _grad_of(lambda x, a: x.mish()))
register(["sigmoid_backward"], "nn", lambda a: x_of(a["grad_output"]) * x_of(a["output"]) * (1 - x_of(a["output"])))
register(["tanh_backward"], "nn", lambda a: x_of(a["grad_output"]) * (1 - x_of(a["output"]) * x_of(a["output"])))


def _elu_backward(a: Args) -> Tensor:
    g, v = x_of(a["grad_output"]), x_of(a["self_or_result"])
    alpha, scale, in_scale = a["alpha"], a["scale"], a["input_scale"]
    if a["is_result"]:  # v = scale * alpha * (exp(x * in_scale) - 1) where x <= 0
        neg = g * in_scale * (v + alpha * scale)
    else:
        neg = g * in_scale * scale * alpha * (v * in_scale).exp()
    return (v > 0).where(g * scale, neg)


register(["elu_backward"], "nn", _elu_backward)


# ---- the fused LSTM cell torch uses on devices other than CPU (gates in the order i, f, g, o) ----
def _lstm_cell(a: Args) -> tuple[Tensor, Tensor, Tensor]:
    gates = x_of(a["input_gates"]) + x_of(a["hidden_gates"])
    if a["input_bias"] is not None:
        gates = gates + x_of(a["input_bias"]) + x_of(a["hidden_bias"])
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * x_of(a["cx"]) + i * g
    return o * cy.tanh(), cy, i.cat(f, g, o, dim=1)


def _lstm_cell_backward(a: Args) -> tuple[Tensor, Tensor, Tensor | None]:
    cx, cy = x_of(a["cx"]), x_of(a["cy"])
    i, f, g, o = x_of(a["workspace"]).chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_hy = x_of(a["grad_hy"]) if a["grad_hy"] is not None else cy.zeros_like()
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy)
    if a["grad_cy"] is not None:
        grad_c = grad_c + x_of(a["grad_cy"])
    gi, gf = grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f)
    gg, go = grad_c * i * (1 - g * g), grad_hy * tanh_cy * o * (1 - o)
    grad_gates = gi.cat(gf, gg, go, dim=1)
    return grad_gates, grad_c * f, grad_gates.sum(0) if a["has_bias"] else None


register(["_thnn_fused_lstm_cell"], "nn", _lstm_cell)
register(["_thnn_fused_lstm_cell_backward_impl"], "nn", _lstm_cell_backward)
