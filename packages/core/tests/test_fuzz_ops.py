"""Differential fuzzing of op chains against numpy (issue 22) with hypothesis, on CPU and PYTHON.

Each example draws a dtype (float32 or int32), a small shape, inputs weighted towards the edges (NaN, +-inf, -0.0,
huge and tiny floats; 0, +-1 and the int32 extremes) and a chain of 1-5 ops: elementwise (arithmetic, comparisons,
where, maximum/minimum, relu, clamp, abs, sign, floor/ceil/trunc; int floor division and remainder, with zero
divisors), reductions (sum, mean, max, min, argmax, argmin over an axis or all) and movement (reshape, permute, flip,
pad, shrink, expand). The chain runs on xgrad and on numpy, and the results must agree: ints exactly, floats with NaN
and inf where numpy has them and the rest within float32 rounding (fma contraction, summation order). Integer edges
follow xgrad's definitions (core README): x // 0 is 0, x % 0 is x, int32 arithmetic wraps.

CI runs 15 derandomized examples per test and device. A longer, random run:
    XGRAD_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest -q -p no:cacheprovider -n 0 -s \\
        packages/core/tests/test_fuzz_ops.py --hypothesis-show-statistics
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from fuzzing import fuzz_settings

from xgrad.dtype import dtypes
from xgrad.tensor import Tensor

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

FUZZ = fuzz_settings(15)
RAN: dict[str, int] = {}  # examples run per test, printed at the end of each (pytest -s shows them)

I32 = np.iinfo(np.int32)
FLOAT_EDGES = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1e30, -1e30, 1e-30, 1e-45, 7.25]
INT_EDGES = [0, 1, -1, 2, -2, 3, -7, 7, 100, I32.max, I32.min, I32.min + 1, I32.max - 1]


@dataclass
class Pair:
    """The same value as an xgrad tensor and a numpy array."""

    x: Tensor
    a: np.ndarray


def _int_floordiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b).astype(a.dtype)
    with np.errstate(all="ignore"):
        return np.where(b == 0, 0, np.floor_divide(a, safe)).astype(a.dtype)


def _int_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b).astype(a.dtype)
    with np.errstate(all="ignore"):
        return np.where(b == 0, a, np.remainder(a, safe)).astype(a.dtype)


def _as(p: Pair, like: np.dtype) -> Pair:
    """Cast both sides back to the chain's dtype (after a comparison or an argmax)."""
    xd = dtypes.float32 if like == np.float32 else dtypes.int32
    return Pair(p.x.cast(xd), p.a.astype(like))


# elementwise ops: name -> (float?, int?, fn(pair, other pair) -> pair)
Binary = Callable[[Pair, Pair], Pair]


def _bin(fx: Callable[[Tensor, Tensor], Tensor], fa: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Binary:
    def run(p: Pair, q: Pair) -> Pair:
        with np.errstate(all="ignore"):
            return Pair(fx(p.x, q.x), fa(p.a, q.a))

    return run


def _cmp(fx: Callable[[Tensor, Tensor], Tensor], fa: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Binary:
    def run(p: Pair, q: Pair) -> Pair:
        return _as(Pair(fx(p.x, q.x), fa(p.a, q.a)), p.a.dtype)

    return run


BINARY: dict[str, tuple[bool, bool, Binary]] = {
    "add": (True, True, _bin(lambda x, y: x + y, np.add)),
    "sub": (True, True, _bin(lambda x, y: x - y, np.subtract)),
    "mul": (True, True, _bin(lambda x, y: x * y, np.multiply)),
    "div": (True, False, _bin(lambda x, y: x / y, np.divide)),
    "floordiv": (False, True, _bin(lambda x, y: x // y, _int_floordiv)),
    "mod": (False, True, _bin(lambda x, y: x % y, _int_mod)),
    "maximum": (True, True, _bin(lambda x, y: x.maximum(y), np.maximum)),
    "minimum": (True, True, _bin(lambda x, y: x.minimum(y), np.minimum)),
    "where_lt": (True, True, _bin(lambda x, y: (x < y).where(x, y), lambda a, b: np.where(a < b, a, b))),
    "lt": (True, True, _cmp(lambda x, y: x < y, np.less)),
    "le": (True, True, _cmp(lambda x, y: x <= y, np.less_equal)),
    "eq": (True, True, _cmp(lambda x, y: x == y, np.equal)),
    "ne": (True, True, _cmp(lambda x, y: x != y, np.not_equal)),
}

Unary = Callable[[Pair], Pair]


def _un(fx: Callable[[Tensor], Tensor], fa: Callable[[np.ndarray], np.ndarray]) -> Unary:
    def run(p: Pair) -> Pair:
        with np.errstate(all="ignore"):
            return Pair(fx(p.x), np.asarray(fa(p.a)).astype(p.a.dtype))

    return run


UNARY: dict[str, tuple[bool, bool, Unary]] = {
    "neg": (True, True, _un(lambda x: -x, np.negative)),
    "abs": (True, True, _un(lambda x: x.abs(), np.abs)),
    "relu": (True, True, _un(lambda x: x.relu(), lambda a: np.maximum(a, a.dtype.type(0)))),
    "clamp": (True, True, _un(lambda x: x.clamp(-2, 3), lambda a: np.clip(a, a.dtype.type(-2), a.dtype.type(3)))),
    "sign": (True, True, _un(lambda x: x.sign(), np.sign)),
    "square": (True, True, _un(lambda x: x.square(), np.square)),
    "floor": (True, False, _un(lambda x: x.floor(), np.floor)),
    "ceil": (True, False, _un(lambda x: x.ceil(), np.ceil)),
    "trunc": (True, False, _un(lambda x: x.trunc(), np.trunc)),
}

# reductions: name -> (float?, int?, exact?, fn(pair, axis) -> pair)
Reduce = Callable[[Pair, int | None], Pair]


def _sum(p: Pair, axis: int | None) -> Pair:
    with np.errstate(all="ignore"):
        return Pair(p.x.sum(axis), np.asarray(np.sum(p.a, axis, dtype=p.a.dtype)))


def _mean(p: Pair, axis: int | None) -> Pair:
    with np.errstate(all="ignore"):
        return Pair(p.x.mean(axis), np.asarray(np.mean(p.a, axis, dtype=np.float32)).astype(np.float32))


def _arg(name: str) -> Reduce:
    def run(p: Pair, axis: int | None) -> Pair:
        xa = getattr(p.x, name)(axis)
        na = np.asarray(getattr(np, name)(p.a, axis)).astype(np.int32)
        return _as(Pair(xa, na), p.a.dtype)

    return run


REDUCE: dict[str, tuple[bool, bool, bool, Reduce]] = {
    "sum": (True, True, False, _sum),
    "mean": (True, False, False, _mean),
    "max": (True, True, True, lambda p, ax: Pair(p.x.max(ax), np.asarray(np.max(p.a, ax)))),
    "min": (True, True, True, lambda p, ax: Pair(p.x.min(ax), np.asarray(np.min(p.a, ax)))),
    "argmax": (True, True, True, _arg("argmax")),
    "argmin": (True, True, True, _arg("argmin")),
}

MOVEMENT = ["reshape", "permute", "flip", "pad", "shrink", "expand"]


def _move(name: str, p: Pair) -> Pair:
    a = p.a
    if name == "reshape":
        return Pair(p.x.reshape(-1), a.reshape(-1))
    if name == "permute":
        order = tuple(reversed(range(a.ndim)))
        return Pair(p.x.permute(order), a.transpose(order))
    if name == "flip":
        return Pair(p.x.flip(0), np.flip(a, 0))
    if name == "pad":
        widths = ((1, 0),) + ((0, 0),) * (a.ndim - 1)
        return Pair(p.x.pad(widths), np.pad(a, widths))
    if name == "shrink":
        keep = ((1, a.shape[0]),) + tuple((0, s) for s in a.shape[1:])
        return Pair(p.x.shrink(keep), a[1:])
    return Pair(p.x.unsqueeze(0).expand(2, *a.shape), np.broadcast_to(a[None], (2, *a.shape)))


@st.composite
def chains(draw: Any) -> tuple[np.dtype, np.ndarray, list[tuple[Any, ...]]]:
    is_float = draw(st.booleans())
    dt = np.dtype(np.float32 if is_float else np.int32)
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    edges = FLOAT_EDGES if is_float else INT_EDGES
    plain = st.floats(-100, 100, width=32) if is_float else st.integers(-50, 50)
    value = st.one_of(st.sampled_from(edges), plain)
    n = int(np.prod(shape))
    a = np.array(draw(st.lists(value, min_size=n, max_size=n)), dt).reshape(shape)
    steps: list[tuple[Any, ...]] = []
    ndim = len(shape)
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "move"]))
        if kind == "unary":
            names = [k for k, (f, i, _) in UNARY.items() if (f if is_float else i)]
            steps.append(("unary", draw(st.sampled_from(names))))
        elif kind == "binary":
            names = [k for k, (f, i, _) in BINARY.items() if (f if is_float else i)]
            other = "const" if draw(st.booleans()) else "tensor"
            const = draw(value)
            steps.append(("binary", draw(st.sampled_from(names)), other, const, draw(st.integers(0, 2**31 - 1))))
        elif kind == "reduce" and ndim > 0:
            names = [k for k, (f, i, _, _) in REDUCE.items() if (f if is_float else i)]
            axis = draw(st.one_of(st.none(), st.integers(0, ndim - 1)))
            steps.append(("reduce", draw(st.sampled_from(names)), axis))
            ndim = 0 if axis is None else ndim - 1
        elif kind == "move" and ndim > 0:
            name = draw(st.sampled_from(MOVEMENT))
            steps.append(("move", name))
            ndim = 1 if name == "reshape" else ndim + 1 if name == "expand" else ndim
    return dt, a, steps


CONTRACTED = {"add", "sub", "sum", "mean"}  # what the CPU backend may fuse with a product before it into one fma


def _overflowed(before: np.ndarray, after: np.ndarray) -> bool:
    return bool(np.any(np.isinf(after) & np.isfinite(before)))


def _run_chain(device: str, dt: np.dtype, a: np.ndarray, steps: list[tuple[Any, ...]]) -> tuple[Pair, bool, bool]:
    """The chain on both sides; whether every step was exact (no float sum or mean); whether a product overflowed
    right before an add or a sum (fma contraction keeps the exact product there: x*x - inf is -inf, not NaN)."""
    xd = dtypes.float32 if dt == np.float32 else dtypes.int32
    p = Pair(Tensor(a, device=device, dtype=xd), a)
    exact = True
    fma_sensitive = product_overflowed = False
    for step in steps:
        fma_sensitive = fma_sensitive or (product_overflowed and step[1] in CONTRACTED)
        before = p.a
        product_overflowed = False
        if step[0] == "unary":
            p = UNARY[step[1]][2](p)
            product_overflowed = step[1] == "square" and dt == np.float32 and _overflowed(before, p.a)
        elif step[0] == "binary":
            _, name, other, const, seed = step
            if other == "const":
                c = dt.type(const)
                q = Pair(Tensor.full(p.a.shape, c, device=device, dtype=xd), np.full(p.a.shape, c, dt))
            else:
                edges = np.array(FLOAT_EDGES if dt == np.float32 else INT_EDGES, dt)
                b = np.random.default_rng(seed).choice(edges, size=p.a.shape).astype(dt)
                q = Pair(Tensor(b, device=device, dtype=xd), b)
            p = BINARY[name][2](p, q)
            product_overflowed = name == "mul" and dt == np.float32 and _overflowed(before, p.a)
        elif step[0] == "reduce":
            if p.a.ndim == 0:
                continue
            _, name, axis = step
            axis = None if axis is None else min(axis, p.a.ndim - 1)
            exact = exact and REDUCE[name][2]
            p = REDUCE[name][3](p, axis)
            if name == "mean":
                p = _as(p, dt)
        elif p.a.ndim > 0 and not (step[1] == "shrink" and p.a.shape[0] < 2):
            p = _move(step[1], p)
    return p, exact, fma_sensitive


def _compare(p: Pair, exact: bool, fma_sensitive: bool, dt: np.dtype) -> None:
    """Ints exactly. Floats: NaN and inf where numpy has them; the other values within float32 rounding, as the CPU
    backend contracts a*b+c into one fma (one rounding where numpy rounds twice: 1e30 * 2.5 + 1e-30 lands on the
    other side of a tie), and sums and means add in another order. After a product that overflowed went into an add
    (fma-sensitive), only the values finite on both sides are compared."""
    got, want = p.x.numpy(), np.asarray(p.a)
    assert got.shape == want.shape, f"shape {got.shape} != numpy {want.shape}"
    if dt != np.float32:
        np.testing.assert_array_equal(got, want)
        return
    if fma_sensitive:
        both = np.isfinite(got) & np.isfinite(want)
        got, want = got[both], want[both]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions")
    rtol = 1e-6 if exact else 1e-4
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-30, equal_nan=True)


DEVICES = ["CPU", "PYTHON"]


@pytest.mark.parametrize("device", DEVICES)
def test_op_chains_match_numpy(device: str) -> None:
    from xgrad.device import Device

    if device not in Device.get_available_devices(runs_kernels_only=True):
        pytest.skip(f"{device} is not available")
    RAN[device] = 0

    @FUZZ
    @hypothesis.given(chains())
    def run(case: tuple[np.dtype, np.ndarray, list[tuple[Any, ...]]]) -> None:
        dt, a, steps = case
        RAN[device] += 1
        p, exact, fma_sensitive = _run_chain(device, dt, a, steps)
        _compare(p, exact, fma_sensitive, dt)

    run()
    print(f"\ntest_op_chains_match_numpy[{device}]: {RAN[device]} examples")
