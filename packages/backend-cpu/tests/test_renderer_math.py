"""The CPU backend's math gives the same bits for the same input on every lane of every kernel: float32 exp2 is one
polynomial in a scalar and a vector form (`exp2_helper`), log2, sin and sqrt are libm or the instruction per lane.
A value recomputed in two kernels, or on a vector lane of one kernel and a scalar lane of another, compares equal
to itself (a softmax compared with itself once ranked an element above itself: scalar lanes called libm's exp2f,
vector lanes the polynomial). Oracles: numpy (accuracy, ranking) and the same op computed with NOOPT=1 (plain loops:
every lane scalar)."""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable

import numpy as np
import pytest

from xgrad import Device, Tensor
from xgrad.dtype import dtypes
from xgrad.helpers import Context

# the CPU device's targets: the host, and on x86-64 also the AVX2 baseline (8 lanes where the host has 16)
TARGETS = ["native", *(["x86-64-v3"] if platform.machine() in ("x86_64", "AMD64") else [])]
# each target gets a CPU instance of its own, opened under CPU_MARCH (which a device reads when it opens)
DEVICE_INDEX = {"native": 6, "x86-64-v3": 7}


@functools.cache
def device_for(march: str) -> str:
    name = f"CPU:{DEVICE_INDEX[march]}"
    with Context(CPU_MARCH=march):
        dev = Device[name]
    assert dev.compiler.march == march, f"{name} was opened before under -march={dev.compiler.march}"
    return name


# the colleague's repro: numpy ranks these softmax values [4, 2, 0, 3, 6, 5, 7, 1]
LOGITS = np.array(
    [0.14189768, 1.0972812, 1.4616872, 0.29618508, -1.5146896, -0.8382494, -2.3335593, 1.1482496], np.float32
)


@pytest.mark.parametrize("march", TARGETS)
def test_softmax_compared_with_itself_ranks_like_numpy(march: str) -> None:
    device = device_for(march)
    p = np.exp(LOGITS.astype(np.float64) - LOGITS.max())
    p /= p.sum()
    want = (p[None, :] > p[:, None]).sum(-1)
    assert want.tolist() == [4, 2, 0, 3, 6, 5, 7, 1]
    t = Tensor(LOGITS, device=device).softmax(-1)
    values = t.numpy()
    np.testing.assert_allclose(values, p, rtol=1e-6)
    # one fused kernel computes t on both sides of the comparison, on different lanes
    greater = (t.unsqueeze(0) > t.unsqueeze(1)).numpy()
    equal = (t.unsqueeze(0) == t.unsqueeze(1)).numpy()
    assert not greater.diagonal().any() and equal.diagonal().all()
    assert (t.unsqueeze(0) > t.unsqueeze(1)).cast(dtypes.int32).sum(-1).tolist() == want.tolist()
    # and so does every fused comparison with the values another kernel stored
    assert np.array_equal((values[None, :] > values[:, None]).sum(-1), want)


# op, its numpy oracle in float64, the largest relative error allowed (1 ulp of float32 is at most 2**-23)
MathOp = tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], float]
MATH: dict[str, MathOp] = {
    "exp2": (lambda t: t.exp2(), np.exp2, 2.0**-23),
    "exp": (lambda t: t.exp(), np.exp, 2.0**-18),  # exp2(x * log2(e)): the product's rounding grows with x
    "log2": (lambda t: t.abs().log2(), lambda x: np.log2(np.abs(x)), 2.0**-23),
    "sin": (lambda t: t.sin(), np.sin, 2.0**-23),
    "sqrt": (lambda t: t.abs().sqrt(), lambda x: np.sqrt(np.abs(x)), 2.0**-24),
    "rsqrt": (lambda t: t.abs().rsqrt(), lambda x: 1 / np.sqrt(np.abs(x)), 2.0**-23),
}
# TRANSCENDENTAL=2: codegen's polynomials (xgrad_codegen.decompose) on every lane; their tolerance is 3 ulp
DECOMPOSED_RTOL = 3 * 2.0**-23


def stacked(t: Tensor) -> Tensor:
    """Every op of MATH on `t`, one row each, in one kernel."""
    return Tensor.stack(*(fn(t) for fn, _, _ in MATH.values()))


# TRANSCENDENTAL=2 (decomposed ops are plain arithmetic) on the host's target only
CASES = [*((march, 1) for march in TARGETS), ("native", 2)]


@pytest.mark.parametrize(("march", "transcendental"), CASES)
def test_math_gives_the_same_bits_on_vector_lanes_and_scalar_tails(march: str, transcendental: int) -> None:
    """Shapes 1..40 put an input on a scalar lane (a short row), a whole vector or a masked last vector; every one
    must give the bits the plain-loop (all scalar) kernel gives, and those must be close to numpy's."""
    device = device_for(march)
    rng = np.random.default_rng(7)
    x = rng.uniform(-30, 30, 40).astype(np.float32)
    x[:4] = [0.5, -1.25, 1e-3, 20.0]
    with Context(TRANSCENDENTAL=transcendental):
        with Context(NOOPT=1):
            scalar = stacked(Tensor(x, device=device)).numpy()
        for n in range(1, len(x) + 1):
            got = stacked(Tensor(x[:n], device=device)).numpy()
            assert np.array_equal(got.view(np.uint32), scalar[:, :n].view(np.uint32)), (
                f"n={n}: {[name for k, name in enumerate(MATH) if not np.array_equal(got[k], scalar[k, :n])]}"
            )
    for k, (name, (_, oracle, rtol)) in enumerate(MATH.items()):
        rtol = max(rtol, DECOMPOSED_RTOL) if transcendental == 2 else rtol
        np.testing.assert_allclose(scalar[k], oracle(x.astype(np.float64)), rtol=rtol, err_msg=name)
