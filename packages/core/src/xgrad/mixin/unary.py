"""Unary math composed of the primitive ops (inverse trig, hyperbolic, erf) and the activation functions.

Each function is written so that its gradient, which autograd derives from the primitives, is finite and right
wherever torch's is: branches pick their inputs with `where` first (so the branch not taken never sees a value
that would make its gradient inf or nan), and odd functions keep the sign of x in a `where` rather than in `abs`
(whose gradient is 0 at 0). Narrow floats (half, bfloat16, fp8) compute in float32 and round once, as torch does.
Precision: float32 results are within a few ulp; float64 ones are as good for atan/asin/acos (longer series) and
about float32-accurate for erf.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from xgrad.dtype import dtypes
from xgrad.errors import ArgumentError
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import Scalar

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

# erfc(x) * exp(x*x) / t as a polynomial in t = 1 / (1 + x/2), a least-squares fit (relative error < 2e-8) over
# x >= 0.5, highest power first; the constant term is 1/(2*sqrt(pi)), the x -> inf limit
_ERFC_FIT = (
    -0.0660905885,
    0.214866569,
    -0.200819541,
    -0.0071196466,
    -0.0122408332,
    0.0838888125,
    0.176427206,
    0.246819747,
    0.282095203,
    0.28209479,
)
_LN2 = math.log(2)


def _poly(x: Tensor, coeffs: Sequence[float]) -> Tensor:
    """sum(c * x**k) by Horner's rule; `coeffs` highest power first."""
    acc = x * coeffs[0] + coeffs[1]
    for c in coeffs[2:]:
        acc = acc * x + c
    return acc


def _odd_series(x: Tensor, coeffs: Sequence[float]) -> Tensor:
    """x * sum(c_k * x**(2k)), with `coeffs` lowest power first: the Taylor series of an odd function."""
    return x * _poly(x * x, list(reversed(coeffs)))


def _wide(x: Tensor) -> bool:
    """float64 needs longer series (or narrower ranges for them) than float32."""
    return x.dtype == dtypes.float64


def _log1p(x: Tensor) -> Tensor:
    """log(1 + x), exact near 0: there it is 2*atanh(s) with s = x / (2 + x), a series in s (|s| < 0.15)."""
    small = x.abs() < 0.25
    xs = small.where(x, 0.0)
    s = xs / (xs + 2.0)
    series = 2.0 * _odd_series(s, [1 / (2 * k + 1) for k in range(10 if _wide(x) else 6)])
    xl = small.where(1.0, x)
    return small.where(series, (xl + 1.0).log())


def _expm1(x: Tensor) -> Tensor:
    """exp(x) - 1, exact near 0 (a Taylor series for |x| < 0.5)."""
    small = x.abs() < 0.5
    xs = small.where(x, 0.0)
    series = xs * _poly(xs, [1 / math.factorial(k) for k in range(18 if _wide(x) else 10, 0, -1)])
    return small.where(series, x.exp() - 1.0)


def _sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + exp(-x)) through exp(-|x|), which never overflows (nor does its gradient)."""
    pos = x >= 0
    e = pos.where(-x, x).exp()
    return pos.where(1.0, e) / (e + 1.0)


def _softplus(x: Tensor) -> Tensor:
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): no overflow, right gradient at 0."""
    pos = x >= 0
    return pos.where(x, 0.0) + _log1p(pos.where(-x, x).exp())


def _atan(x: Tensor) -> Tensor:
    """Two half-angle steps, atan(x) = 2*atan(x / (1 + sqrt(1 + x*x))), take any x into |u| < tan(pi/8),
    where the Taylor series converges fast."""
    y = x.clamp(-1e18, 1e18)  # keeps y*y finite; atan is pi/2 to float precision there
    for _ in range(2):
        y = y / ((y * y + 1.0).sqrt() + 1.0)
    terms = 22 if _wide(x) else 9
    return 4.0 * _odd_series(y, [(-1) ** k / (2 * k + 1) for k in range(terms)])


def _tanh(x: Tensor) -> Tensor:
    small = x.abs() < (0.01 if _wide(x) else 0.25)  # where 2*sigmoid(2x) - 1 loses digits, a Taylor series
    xs = small.where(x, 0.0)
    series = _odd_series(xs, [1.0, -1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925])
    return small.where(series, 2.0 * _sigmoid(2.0 * x) - 1.0)


def _sinh(x: Tensor) -> Tensor:
    small = x.abs() < 0.5
    xs = small.where(x, 0.0)
    series = _odd_series(xs, [1 / math.factorial(2 * k + 1) for k in range(10 if _wide(x) else 5)])
    return small.where(series, (x.exp() - (-x).exp()) * 0.5)


def _asinh(x: Tensor) -> Tensor:
    """asinh(a) = log1p(a + a*a / (1 + sqrt(1 + a*a))) for a = |x|; log(2a) where a*a would overflow."""
    neg = x < 0
    a = neg.where(-x, x)
    huge = a > 1e18
    aa = huge.where(1.0, a)
    r = huge.where(huge.where(a, 1.0).log() + _LN2, _log1p(aa + aa * aa / ((aa * aa + 1.0).sqrt() + 1.0)))
    return neg.where(-r, r)


def _acosh(x: Tensor) -> Tensor:
    """acosh(x) = log1p((x - 1) + sqrt((x - 1)(x + 1))), exact near 1; log(2x) where x*x would overflow."""
    huge = x > 1e18
    xs = huge.where(2.0, x)
    d = xs - 1.0
    return huge.where(huge.where(x, 1.0).log() + _LN2, _log1p(d + (d * (xs + 1.0)).sqrt()))


def _logaddexp(a: Tensor, b: Tensor) -> Tensor:
    """max(a, b) + log1p(exp(-|a - b|)); where both are the same infinity, that infinity (a - b would be nan)."""
    m = a.maximum(b)
    same_inf = (a == b) & a.isinf()
    d = same_inf.where(0.0, a - b).abs()
    return same_inf.where(a, m + _log1p((-d).exp()))


def _erf(x: Tensor) -> Tensor:
    """A Taylor series for |x| < 0.5, else 1 - erfc(|x|) from a fitted erfc(x) * exp(x*x)."""
    small = x.abs() < 0.5
    xs = small.where(x, 0.0)
    series = (2 / math.sqrt(math.pi)) * _odd_series(
        xs, [(-1) ** k / (math.factorial(k) * (2 * k + 1)) for k in range(8)]
    )
    neg = x < 0
    a = small.where(1.0, neg.where(-x, x))
    a = (a > 10).where(10.0, a)  # erf is 1 there; keeps a*a (and its gradient) finite
    t = (a * 0.5 + 1.0).reciprocal()
    big = 1.0 - t * _poly(t, _ERFC_FIT) * (-(a * a)).exp()
    return small.where(series, neg.where(-big, big))


class UnaryMixin(TensorBase):
    __slots__ = ()

    # ---- inverse trig and hyperbolic ----
    def atan(self) -> Tensor:
        """The arctangent, in (-pi/2, pi/2).

        >>> [round(v, 6) for v in Tensor([0.0, 1.0]).atan().tolist()]
        [0.0, 0.785398]"""
        return self._t()._in_float32(_atan)

    def asin(self) -> Tensor:
        """asin(x) = 2*atan(x / (1 + sqrt(1 - x*x))); nan outside [-1, 1].

        >>> round(Tensor([1.0]).asin().item(), 6)
        1.570796"""
        return self._t()._in_float32(lambda x: 2.0 * _atan(x / (((1.0 - x) * (1.0 + x)).sqrt() + 1.0)))

    def acos(self) -> Tensor:
        """acos(x) = 2*atan(sqrt((1 - x) / (1 + x))); nan outside [-1, 1].

        >>> round(Tensor([-1.0]).acos().item(), 6)
        3.141593"""
        return self._t()._in_float32(lambda x: 2.0 * _atan(((1.0 - x) / (1.0 + x)).sqrt()))

    def tanh(self) -> Tensor:
        """The hyperbolic tangent.

        >>> round(Tensor([0.5]).tanh().item(), 6)
        0.462117"""
        return self._t()._in_float32(_tanh)

    def sinh(self) -> Tensor:
        """The hyperbolic sine.

        >>> round(Tensor([1.0]).sinh().item(), 6)
        1.175201"""
        return self._t()._in_float32(_sinh)

    def cosh(self) -> Tensor:
        """The hyperbolic cosine.

        >>> round(Tensor([1.0]).cosh().item(), 6)
        1.543081"""
        return self._t()._in_float32(lambda x: (x.exp() + (-x).exp()) * 0.5)

    def asinh(self) -> Tensor:
        """The inverse hyperbolic sine.

        >>> round(Tensor([1.0]).asinh().item(), 6)
        0.881374"""
        return self._t()._in_float32(_asinh)

    def acosh(self) -> Tensor:
        """nan below 1.

        >>> round(Tensor([2.0]).acosh().item(), 6)
        1.316958"""
        return self._t()._in_float32(_acosh)

    def atanh(self) -> Tensor:
        """atanh(x) = (log1p(x) - log1p(-x)) / 2; +-inf at +-1, nan outside [-1, 1].

        >>> round(Tensor([0.5]).atanh().item(), 6)
        0.549306"""
        return self._t()._in_float32(lambda x: (_log1p(x) - _log1p(-x)) * 0.5)

    def erf(self) -> Tensor:
        """The error function.

        >>> round(Tensor([1.0]).erf().item(), 6)
        0.842701"""
        return self._t()._in_float32(_erf)

    # ---- activations ----
    def sigmoid(self) -> Tensor:
        """1 / (1 + exp(-x)), computed without overflow for any x.

        >>> Tensor([0.0, -200.0]).sigmoid().tolist()
        [0.5, 0.0]"""
        return self._t()._in_float32(_sigmoid)

    def logsigmoid(self) -> Tensor:
        """log(sigmoid(x)) = -softplus(-x), without overflow.

        >>> round(Tensor([-200.0, 0.0]).logsigmoid().tolist()[0], 1)
        -200.0"""
        return self._t()._in_float32(lambda x: -_softplus(-x))

    def softplus(self, beta: float = 1.0) -> Tensor:
        """log(1 + exp(beta * x)) / beta, without overflow (torch switches to x above beta*x = 20; this is exact).

        >>> Tensor([100.0]).softplus().tolist()
        [100.0]"""
        return self._t()._in_float32(lambda x: _softplus(x * beta) * (1 / beta))

    def hardtanh(self, min_val: float = -1, max_val: float = 1) -> Tensor:
        """x clipped to [min_val, max_val]; as in torch, the gradient is 0 at the two ends.

        >>> Tensor([-2.0, 0.5, 2.0]).hardtanh().tolist()
        [-1.0, 0.5, 1.0]"""
        x = self._t()
        return (x <= min_val).where(min_val, (x >= max_val).where(max_val, x))

    def relu6(self) -> Tensor:
        """min(max(x, 0), 6).

        >>> Tensor([-1.0, 3.0, 7.0]).relu6().tolist()
        [0.0, 3.0, 6.0]"""
        return self.hardtanh(0, 6)

    def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
        """max(0, min(1, alpha * x + beta)).

        >>> Tensor([-4.0, 0.0, 4.0]).hardsigmoid().tolist()
        [0.0, 0.5, 1.0]"""
        return (self._t()._float() * alpha + beta).hardtanh(0, 1)

    def hardswish(self) -> Tensor:
        """x * relu6(x + 3) / 6 (gradient as torch's at -3 and 3).

        >>> Tensor([-4.0, 1.0, 4.0]).hardswish().tolist()
        [0.0, 0.6666666865348816, 4.0]"""
        x = self._t()._float()
        xs = ((x <= -3) | (x >= 3)).where(0.0, x)
        return (x <= -3).where(0.0, (x >= 3).where(x, xs * (xs + 3) * (1 / 6)))

    def elu(self, alpha: float = 1.0) -> Tensor:
        """x for x > 0, alpha * (exp(x) - 1) otherwise.

        >>> round(Tensor([-1.0, 2.0]).elu().tolist()[0], 6)
        -0.632121"""
        return self._t()._in_float32(lambda x: (x > 0).where(x, alpha * _expm1((x > 0).where(0.0, x))))

    def celu(self, alpha: float = 1.0) -> Tensor:
        """x for x > 0, alpha * (exp(x / alpha) - 1) otherwise.

        >>> round(Tensor([-1.0]).celu(2.0).item(), 6)
        -0.786939"""
        return self._t()._in_float32(lambda x: (x > 0).where(x, alpha * _expm1((x > 0).where(0.0, x) * (1 / alpha))))

    def selu(self, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
        """gamma * elu(x, alpha), with tinygrad's rounded defaults (torch: 1.6732632, 1.0507010).

        >>> Tensor([1.0]).selu().item()
        1.0506999492645264"""
        return self.elu(alpha) * gamma

    def silu(self) -> Tensor:
        """x * sigmoid(x).

        >>> round(Tensor([1.0]).silu().item(), 6)
        0.731059"""
        return self._t()._in_float32(lambda x: x * _sigmoid(x))

    def swish(self) -> Tensor:
        """The same as silu.

        >>> round(Tensor([1.0]).swish().item(), 6)
        0.731059"""
        return self.silu()

    def quick_gelu(self) -> Tensor:
        """x * sigmoid(1.702 * x).

        >>> round(Tensor([1.0]).quick_gelu().item(), 6)
        0.845796"""
        return self._t()._in_float32(lambda x: x * _sigmoid(x * 1.702))

    def gelu(self, approximate: str = "tanh") -> Tensor:
        """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))); `approximate='none'` uses erf instead.

        >>> round(Tensor([1.0]).gelu().item(), 6), round(Tensor([1.0]).gelu("none").item(), 6)
        (0.841192, 0.841345)"""
        if approximate == "tanh":
            return self._t()._in_float32(
                lambda x: 0.5 * x * (1.0 + _tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
            )
        if approximate == "none":
            return self._t()._in_float32(lambda x: 0.5 * x * (1.0 + _erf(x * (1 / math.sqrt(2)))))
        raise ArgumentError(f"gelu approximate={approximate!r}: use 'tanh' or 'none'")

    def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
        """x for x > 0, neg_slope * x otherwise.

        >>> Tensor([-2.0, 3.0]).leaky_relu(0.5).tolist()
        [-1.0, 3.0]"""
        x = self._t()
        return (x > 0).where(x, x * neg_slope)

    def mish(self) -> Tensor:
        """x * tanh(softplus(x)).

        >>> round(Tensor([1.0]).mish().item(), 6)
        0.865098"""
        return self._t()._in_float32(lambda x: x * _tanh(_softplus(x)))

    def softsign(self) -> Tensor:
        """x / (1 + |x|).

        >>> Tensor([-3.0, 1.0]).softsign().tolist()
        [-0.75, 0.5]"""
        x = self._t()._float()
        return x / (x.abs() + 1.0)

    # ---- binary ----
    def logaddexp(self, x: Tensor | Scalar) -> Tensor:
        """log(exp(self) + exp(x)) without overflow.

        >>> round(Tensor([1000.0]).logaddexp(1000.0).item(), 3)
        1000.693"""
        a, b = self._t()._broadcasted(x)
        return a._float()._in_float32(lambda af: _logaddexp(af, b.cast(af.dtype)))
