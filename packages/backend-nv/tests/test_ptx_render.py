"""The PTX renderer's kernels run on the PTX interpreter (MOCKGPU=1, DEV=NV:PTX) and equal numpy or the PYTHON
reference device: the dtype corners the op suite touches lightly (8-bit wrapping in 16-bit registers, xgrad's total
integer division, every cast pair, NaN through max, bool logic, float64, half/bfloat16 rounding), plus symbolic
shapes (kernel variables) and group reductions through shared memory. The rendered text is checked too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from xgrad import Device, dtypes
from xgrad.helpers import Context
from xgrad.plugin import module_exists
from xgrad.tensor import Tensor
from xgrad.uop.ops import UOp

pytestmark = pytest.mark.skipif(not module_exists("xgrad_nv.ptx"), reason="xgrad_nv.ptx is not installed")
DEV = "NV:PTX"
INT_DTYPES = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64]
CAST_DTYPES = [dtypes.bool, *INT_DTYPES, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]


@pytest.fixture(autouse=True)
def mockgpu() -> Iterator[None]:
    with Context(MOCKGPU=1):
        yield


def both(fn: Any) -> tuple[np.ndarray, np.ndarray]:
    """`fn(device)` realized on NV:PTX and on the PYTHON reference device."""
    return fn(DEV).numpy(), fn("PYTHON").numpy()


def _ints(dt: Any, n: int = 64, seed: int = 0) -> np.ndarray:
    info = np.iinfo(dt.np) if hasattr(dt, "np") else np.iinfo(np.dtype(dt.name))
    rng = np.random.default_rng(seed)
    vals = rng.integers(info.min, info.max, n, endpoint=True, dtype=np.int64 if info.min < 0 else np.uint64)
    corners = np.array([info.min, info.max, 0, 1, info.max - 1], dtype=vals.dtype)
    return np.concatenate([corners, vals[: n - 5]]).astype(np.dtype(dt.name if dt.name != "char" else "int8"))


def npdt(dt: Any) -> np.dtype:
    return np.dtype({"bfloat16": "float32", "bool": "bool"}.get(dt.name, dt.name))


@pytest.mark.parametrize("dt", INT_DTYPES, ids=lambda d: d.name)
def test_integer_arithmetic_wraps_in_the_dtype(dt: Any) -> None:
    a, b = _ints(dt, seed=1), _ints(dt, seed=2)

    def f(dev: str) -> Tensor:
        x, y = Tensor(a, device=dev), Tensor(b, device=dev)
        return ((x * y + x - y) ^ (y >> 1)) & (x | 3)

    got, want = both(f)
    np.testing.assert_array_equal(got, want)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, ((a * b + a - b) ^ (b >> 1)) & (a | 3))


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint32], ids=lambda d: d.name)
def test_integer_division_is_total_as_on_the_reference_device(dt: Any) -> None:
    a = _ints(dt, seed=3)
    b = np.concatenate([np.zeros(8), np.full(8, -1 if np.iinfo(npdt(dt)).min < 0 else 1), _ints(dt, seed=4)[16:]])
    b = b.astype(npdt(dt))

    def f(dev: str) -> Tensor:
        x, y = Tensor(a, device=dev), Tensor(b, device=dev)
        return (x // y).cat(x % y)

    got, want = both(f)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("src", CAST_DTYPES, ids=lambda d: d.name)
def test_casts_to_every_dtype_equal_the_reference_device(src: Any) -> None:
    rng = np.random.default_rng(5)
    if dtypes.is_float(src):
        base = np.concatenate([rng.standard_normal(40) * 300, [0.5, 1.5, 2.5, -0.5, -2.5, 0.0, 65504.0, -1e5]])
        values = base.astype(np.float32)
    elif src == dtypes.bool:
        values = rng.integers(0, 2, 48).astype(bool)
    else:
        values = _ints(src, 48, seed=6)
    for dst in CAST_DTYPES:
        vals = values
        if dtypes.is_float(src) and not dtypes.is_float(dst) and dst != dtypes.bool:
            info = np.iinfo(npdt(dst))  # float -> int outside the range is undefined in C and xgrad: stay inside
            vals = np.clip(values, max(info.min, -60000) * 0.99, min(info.max, 60000) * 0.99)  # float16 is finite

        def f(dev: str, vals: np.ndarray = vals, dst: Any = dst) -> Tensor:
            return Tensor(vals, device=dev).cast(src).cast(dst).cast(dtypes.float64)

        got, want = both(f)
        np.testing.assert_array_equal(got, want, err_msg=f"{src} -> {dst}")


def test_max_propagates_nan_and_where_picks_bools() -> None:
    a = np.array([1.0, np.nan, -np.inf, 3.0, np.nan, 0.0], np.float32)
    b = np.array([np.nan, 2.0, 5.0, -1.0, np.nan, -0.0], np.float32)

    def f(dev: str) -> Tensor:
        x, y = Tensor(a, device=dev), Tensor(b, device=dev)
        m = x.maximum(y)
        c = (x < y).where(x != x, y == y)
        return m.cat(c.cast(dtypes.float32))

    got, want = both(f)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[:6], np.maximum(a, b))


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float64], ids=lambda d: d.name)
def test_float_dtypes_compute_like_the_reference_device(dt: Any) -> None:
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((16, 24)) * 4).astype(np.float32)
    b = (rng.standard_normal((16, 24)) * 4).astype(np.float32)

    def f(dev: str) -> Tensor:
        x, y = Tensor(a, device=dev).cast(dt), Tensor(b, device=dev).cast(dt)
        out = (x * y + x / (y.abs() + 1)).sqrt().maximum(x.trunc()) - x.reciprocal()
        return out.sum(axis=1).cast(dtypes.float64)

    got, want = both(f)
    np.testing.assert_allclose(got, want, rtol=1e-2 if dt != dtypes.float64 else 1e-12)


def test_symbolic_shape_becomes_a_kernel_parameter() -> None:
    a = np.arange(48, dtype=np.float32).reshape(3, 16)
    n = UOp.variable("n", 1, 16)
    t = Tensor(a, device=DEV)
    for k in (3, 11, 16):
        got = (t.shrink((None, (0, n.bind(k)))) * 2).sum(axis=1).numpy()
        np.testing.assert_array_equal(got, (a[:, :k] * 2).sum(axis=1))
    sources = [p.info.src for p in Device[DEV]._programs.values()]
    assert any(".param .s32 var0" in s or ".param .s32" in s for s in sources)


def test_group_reduction_uses_shared_memory_and_barriers() -> None:
    a = np.random.default_rng(8).standard_normal((4, 4096)).astype(np.float32)
    got = Tensor(a, device=DEV).sum(axis=1).numpy()
    np.testing.assert_allclose(got, a.sum(axis=1, dtype=np.float64), rtol=1e-5, atol=1e-3)
    sources = [p.info.src for p in Device[DEV]._programs.values()]
    assert any(".shared" in s and "bar.sync 0;" in s for s in sources), "no kernel used shared memory"


def test_rendered_ptx_is_a_kernel_with_virtual_registers() -> None:
    x = Tensor(np.ones(64, np.float16), device=DEV)
    (x * 2 + 1).realize()
    src = [p.info.src for p in Device[DEV]._programs.values()][-1]
    assert src.startswith(".version ") and ".target sm_90" in src and ".visible .entry " in src
    assert ".reg .b16 %rs<" in src and "ld.param.u64" in src and "cvta.to.global.u64" in src


def test_tf32_tensor_cores_on_request_compile_and_run() -> None:
    """PTXRenderer(tf32=True): a float32 matmul becomes mma.sync m16n8k8 .tf32, which ptxas accepts and which on the
    interpreter equals numpy's product of the tf32-truncated operands (not float32's); off by default."""
    from xgrad_nv.compiler import PTXCompiler, find_tool
    from xgrad_nv.ptx import PTXRenderer

    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((32, 16), dtype=np.float32), rng.standard_normal((16, 24), dtype=np.float32)
    dev = Device["NV:PTX:sm_90"]  # a registry entry of its own: its renderer is swapped for the tf32 one
    dev.renderer = PTXRenderer("sm_90", tf32=True)
    got = (Tensor(a, device=dev.name) @ Tensor(b, device=dev.name)).numpy()
    (src,) = [p.info.src for p in dev._programs.values() if "m16n8k8" in p.info.src]
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in src

    def tf32(v: np.ndarray) -> np.ndarray:
        return (v.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)

    np.testing.assert_allclose(got, tf32(a) @ tf32(b), rtol=1e-5, atol=1e-5)
    assert np.abs(got - a.astype(np.float64) @ b.astype(np.float64)).max() > 1e-5
    if find_tool("ptxas") is not None:
        assert PTXCompiler("sm_90").compile(src)[:4] == b"\x7fELF"
    assert not any(tc.dtype == dtypes.float32 for tc in PTXRenderer("sm_90").tensor_cores)
