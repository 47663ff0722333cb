"""Op conformance: every basic Tensor op against numpy, on every available device (fixture `xgrad_device`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from xgrad.dtype import dtypes, to_np_dtype
from xgrad.errors import DTypeError, ShapeError, XgradError
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

rng = np.random.default_rng(0)

# (device type, dtype) pairs a device cannot compute in, with the reason: tests of that dtype skip there
TOL = {dtypes.float32: 1e-5, dtypes.float16: 2e-3, dtypes.float64: 1e-12, dtypes.bfloat16: 1e-2}


def make(shape: tuple[int, ...], dtype: Any, low: float = -3, high: float = 3) -> np.ndarray:
    if dtype == dtypes.bool:
        return rng.random(shape) > 0.5
    np_dt = to_np_dtype(dtype) or np.float32
    if dtypes.is_int(dtype):
        lo = 0 if dtypes.is_unsigned(dtype) else int(low)
        return rng.integers(lo, int(high) + 1, size=shape).astype(np_dt)
    return rng.uniform(low, high, size=shape).astype(np_dt)


def check(
    device: str,
    fn: Callable[..., Any],
    np_fn: Callable[..., Any],
    *arrays: np.ndarray,
    dtype: Any = None,
    atol: float | None = None,
) -> None:
    tensors = [Tensor(a, device=device, dtype=dtype) for a in arrays]
    got = fn(*tensors).numpy()
    want = np.asarray(np_fn(*arrays))
    assert got.shape == want.shape, f"shape {got.shape} != numpy {want.shape}"
    tol = atol if atol is not None else TOL.get(dtype, 1e-5)
    if got.dtype.kind in "biu" and want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want.astype(np.float64), rtol=tol, atol=tol)


UNARY = [
    ("neg", lambda t: -t, np.negative, (-3, 3)),
    ("exp", lambda t: t.exp(), np.exp, (-3, 3)),
    ("exp2", lambda t: t.exp2(), np.exp2, (-3, 3)),
    ("log", lambda t: t.log(), np.log, (0.1, 5)),
    ("log2", lambda t: t.log2(), np.log2, (0.1, 5)),
    ("sqrt", lambda t: t.sqrt(), np.sqrt, (0, 5)),
    ("rsqrt", lambda t: t.rsqrt(), lambda x: 1 / np.sqrt(x), (0.1, 5)),
    ("reciprocal", lambda t: t.reciprocal(), np.reciprocal, (0.5, 5)),
    ("sin", lambda t: t.sin(), np.sin, (-6, 6)),
    ("cos", lambda t: t.cos(), np.cos, (-6, 6)),
    ("relu", lambda t: t.relu(), lambda x: np.maximum(x, 0), (-3, 3)),
    ("sigmoid", lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x)), (-3, 3)),
    ("tanh", lambda t: t.tanh(), np.tanh, (-3, 3)),
    ("abs", lambda t: t.abs(), np.abs, (-3, 3)),
    ("trunc", lambda t: t.trunc(), np.trunc, (-3, 3)),
    ("floor", lambda t: t.floor(), np.floor, (-3, 3)),
    ("ceil", lambda t: t.ceil(), np.ceil, (-3, 3)),
    ("square", lambda t: t.square(), np.square, (-3, 3)),
    ("sign", lambda t: t.sign(), np.sign, (-3, 3)),
]


@pytest.mark.parametrize("name,fn,np_fn,bounds", UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 17)])
def test_unary_matches_numpy_float32(xgrad_device, name, fn, np_fn, bounds, shape):
    check(xgrad_device, fn, np_fn, make(shape, dtypes.float32, *bounds), atol=1e-5 if name != "tanh" else 2e-5)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.float64])
@pytest.mark.parametrize("name", ["neg", "exp", "log", "sqrt", "sin", "relu"])
def test_unary_matches_numpy_other_floats(xgrad_device, dtype, name):
    skip_unsupported(xgrad_device, dtype)
    _, fn, np_fn, bounds = next(u for u in UNARY if u[0] == name)
    arr = make((33,), dtype, *bounds)
    check(
        xgrad_device,
        fn,
        lambda a: np_fn(a.astype(np.float64)).astype(to_np_dtype(dtype)),
        arr,
        dtype=dtype,
        atol=TOL[dtype] * 4,
    )


BINARY = [
    ("add", lambda a, b: a + b, np.add),
    ("sub", lambda a, b: a - b, np.subtract),
    ("mul", lambda a, b: a * b, np.multiply),
    ("maximum", lambda a, b: a.maximum(b), np.maximum),
    ("minimum", lambda a, b: a.minimum(b), np.minimum),
    ("lt", lambda a, b: a < b, np.less),
    ("gt", lambda a, b: a > b, np.greater),
    ("le", lambda a, b: a <= b, np.less_equal),
    ("eq", lambda a, b: a == b, np.equal),
    ("ne", lambda a, b: a != b, np.not_equal),
]


@pytest.mark.parametrize("name,fn,np_fn", BINARY, ids=[b[0] for b in BINARY])
@pytest.mark.parametrize(
    "dtype", [dtypes.float32, dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.float16]
)
def test_binary_matches_numpy(xgrad_device, name, fn, np_fn, dtype):
    skip_unsupported(xgrad_device, dtype)
    a, b = make((5, 7), dtype), make((5, 7), dtype)
    check(xgrad_device, fn, np_fn, a, b, dtype=dtype)


@pytest.mark.parametrize("shapes", [((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((5, 1, 3), (2, 1)), ((), (3,))])
def test_binary_broadcasts_like_numpy(xgrad_device, shapes):
    a, b = make(shapes[0], dtypes.float32), make(shapes[1], dtypes.float32)
    check(xgrad_device, lambda x, y: x * y + x, lambda x, y: x * y + x, a, b)


def test_division_matches_numpy(xgrad_device):
    a, b = make((6, 6), dtypes.float32), make((6, 6), dtypes.float32, 0.5, 3)
    check(xgrad_device, lambda x, y: x / y, np.divide, a, b)
    ia, ib = np.array([7, -7, 7, -7, 0, 9]), np.array([2, 2, -2, -2, 3, 4])
    check(xgrad_device, lambda x, y: x // y, np.floor_divide, ia.astype(np.int32), ib.astype(np.int32))
    check(xgrad_device, lambda x, y: x % y, np.mod, ia.astype(np.int32), ib.astype(np.int32))
    check(xgrad_device, lambda x, y: x / y, np.true_divide, ia.astype(np.int32), ib.astype(np.int32))


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint8, dtypes.int64, dtypes.bool])
def test_bitwise_ops_match_numpy(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)
    a, b = make((9,), dtype, 0, 100), make((9,), dtype, 0, 100)
    check(xgrad_device, lambda x, y: x & y, np.bitwise_and, a, b, dtype=dtype)
    check(xgrad_device, lambda x, y: x | y, np.bitwise_or, a, b, dtype=dtype)
    check(xgrad_device, lambda x, y: x ^ y, np.bitwise_xor, a, b, dtype=dtype)
    check(xgrad_device, lambda x: ~x, np.invert, a, dtype=dtype)


def test_shifts_match_numpy(xgrad_device):
    a = make((8,), dtypes.int32, 0, 1000)
    check(xgrad_device, lambda x: x << 3, lambda x: x << 3, a)
    check(xgrad_device, lambda x: x >> 2, lambda x: x >> 2, a)


def test_python_scalars_are_weak(xgrad_device):
    h = Tensor([1.0, 2.0], device=xgrad_device, dtype=dtypes.float16)
    assert (h + 1).dtype == dtypes.float16
    assert (h * 2.5).dtype == dtypes.float16
    i8 = Tensor([1, 2], device=xgrad_device, dtype=dtypes.int8)
    assert (i8 + 1).dtype == dtypes.int8
    assert (i8 + 1.5).dtype == dtypes.default_float
    assert (i8 + 1.5).tolist() == [2.5, 3.5]


def test_promotion_follows_lattice(xgrad_device):
    a = Tensor([1, 2], device=xgrad_device, dtype=dtypes.int8)
    b = Tensor([1, 2], device=xgrad_device, dtype=dtypes.uint8)
    assert (a + b).dtype == dtypes.int16
    f = Tensor([1.0], device=xgrad_device, dtype=dtypes.float16)
    assert (f + Tensor([1.0], device=xgrad_device)).dtype == dtypes.float32


def test_where_matches_numpy(xgrad_device):
    c, a, b = make((4, 5), dtypes.bool), make((4, 5), dtypes.float32), make((5,), dtypes.float32)
    check(xgrad_device, lambda x, y, z: x.where(y, z), np.where, c, a, b)


def test_pow_matches_numpy(xgrad_device):
    a, b = make((10,), dtypes.float32, 0.5, 3), make((10,), dtypes.float32, -2, 2)
    check(xgrad_device, lambda x, y: x**y, np.power, a, b, atol=1e-4)
    neg = np.array([-2.0, -3.0, 2.0], dtype=np.float32)
    check(xgrad_device, lambda x: x**3, lambda x: x**3, neg, atol=1e-4)


@pytest.mark.parametrize(
    "src,dst",
    [
        (dtypes.float32, dtypes.int32),
        (dtypes.int32, dtypes.float32),
        (dtypes.float32, dtypes.float16),
        (dtypes.int32, dtypes.int8),
        (dtypes.float32, dtypes.bool),
        (dtypes.uint8, dtypes.float32),
        (dtypes.int64, dtypes.int32),
        (dtypes.float64, dtypes.float32),
    ],
)
def test_cast_matches_numpy(xgrad_device, src, dst):
    skip_unsupported(xgrad_device, src, dst)
    arr = make((13,), src, -100, 100)
    np_dst = to_np_dtype(dst)
    check(xgrad_device, lambda t: t.cast(dst), lambda a: a.astype(np_dst), arr, dtype=src, atol=1e-3)


def test_bitcast_matches_numpy(xgrad_device):
    arr = make((6,), dtypes.float32)
    check(xgrad_device, lambda t: t.bitcast(dtypes.int32), lambda a: a.view(np.int32), arr)
    # another item size scales the last axis (tinygrad's rule), as numpy's view does
    check(xgrad_device, lambda t: t.bitcast(dtypes.int16), lambda a: a.view(np.int16), arr)
    with pytest.raises(ShapeError):
        Tensor(arr, device=xgrad_device).reshape(6, 1).bitcast(dtypes.float64)


MOVEMENT = [
    ("reshape", lambda t: t.reshape(6, 4), lambda a: a.reshape(6, 4)),
    ("reshape_neg", lambda t: t.reshape(-1, 3), lambda a: a.reshape(-1, 3)),
    ("permute", lambda t: t.permute(1, 0), lambda a: a.transpose(1, 0)),
    ("expand", lambda t: t.reshape(4, 1, 6).expand(4, 3, 6), lambda a: np.broadcast_to(a.reshape(4, 1, 6), (4, 3, 6))),
    ("pad", lambda t: t.pad(((1, 2), (0, 3))), lambda a: np.pad(a, ((1, 2), (0, 3)))),
    (
        "pad_value",
        lambda t: t.pad(((1, 0), (2, 1)), value=7.0),
        lambda a: np.pad(a, ((1, 0), (2, 1)), constant_values=7.0),
    ),
    ("pad_negative", lambda t: t.pad(((-1, 1), (0, -2))), lambda a: np.pad(a[1:, :-2], ((0, 1), (0, 0)))),
    ("shrink", lambda t: t.shrink(((1, 3), (2, 5))), lambda a: a[1:3, 2:5]),
    ("flip", lambda t: t.flip(0), lambda a: a[::-1]),
    ("flip_both", lambda t: t.flip(0, 1), lambda a: a[::-1, ::-1]),
    (
        "chain",
        lambda t: (
            t.permute(1, 0).reshape(3, 2, 4).flip(1).pad(((0, 0), (1, 1), (2, 0))).shrink(((1, 3), (0, 4), (1, 6)))
        ),
        lambda a: np.pad(a.T.reshape(3, 2, 4)[:, ::-1], ((0, 0), (1, 1), (2, 0)))[1:3, 0:4, 1:6],
    ),
    ("pad_then_exp", lambda t: t.pad(((1, 1), (1, 1))).exp(), lambda a: np.exp(np.pad(a, ((1, 1), (1, 1))))),
]


@pytest.mark.parametrize("name,fn,np_fn", MOVEMENT, ids=[m[0] for m in MOVEMENT])
def test_movement_matches_numpy(xgrad_device, name, fn, np_fn):
    check(xgrad_device, fn, np_fn, make((4, 6), dtypes.float32))


REDUCE = [
    ("sum_all", lambda t: t.sum(), lambda a: a.sum()),
    ("sum_0", lambda t: t.sum(0), lambda a: a.sum(0)),
    ("sum_1_keep", lambda t: t.sum(1, keepdim=True), lambda a: a.sum(1, keepdims=True)),
    ("sum_axes", lambda t: t.sum((0, 2)), lambda a: a.sum((0, 2))),
    ("max_all", lambda t: t.max(), lambda a: a.max()),
    ("max_1", lambda t: t.max(1), lambda a: a.max(1)),
    ("min_2", lambda t: t.min(2), lambda a: a.min(2)),
    ("mean_1", lambda t: t.mean(1), lambda a: a.mean(1)),
    (
        "softmax",
        lambda t: t.softmax(-1),
        lambda a: np.exp(a - a.max(-1, keepdims=True)) / np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True),
    ),
    ("sum_of_permuted", lambda t: t.permute(2, 0, 1).sum(2), lambda a: a.transpose(2, 0, 1).sum(2)),
    ("matmul", lambda t: t.reshape(12, 10) @ t.reshape(10, 12), lambda a: a.reshape(12, 10) @ a.reshape(10, 12)),
]


@pytest.mark.parametrize("name,fn,np_fn", REDUCE, ids=[r[0] for r in REDUCE])
def test_reduce_matches_numpy(xgrad_device, name, fn, np_fn):
    check(xgrad_device, fn, np_fn, make((3, 5, 8), dtypes.float32), atol=1e-4)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.bool, dtypes.float16])
def test_sum_accumulates_wide(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)  # float16 on a WebGPU adapter without shader-f16 (OpenGL)
    arr = make((40, 9), dtype, 0, 100)
    t = Tensor(arr, device=xgrad_device, dtype=dtype)
    got = t.sum(0).numpy()
    want = arr.astype(np.float64).sum(0)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3 if dtype == dtypes.float16 else 0)


def test_reduce_of_empty_axis_gives_identity(xgrad_device):
    t = Tensor.zeros(0, 3, device=xgrad_device)
    assert t.sum(0).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ShapeError):
        t.max(0)


def test_creation_matches_numpy(xgrad_device):
    assert Tensor.zeros(2, 3, device=xgrad_device).tolist() == np.zeros((2, 3)).tolist()
    assert Tensor.ones(4, device=xgrad_device, dtype=dtypes.int32).tolist() == [1, 1, 1, 1]
    assert Tensor.full((2, 2), 7, device=xgrad_device).tolist() == [[7, 7], [7, 7]]
    assert Tensor.arange(5, device=xgrad_device).tolist() == list(range(5))
    np.testing.assert_allclose(Tensor.arange(1.0, 2.0, 0.25, device=xgrad_device).numpy(), np.arange(1.0, 2.0, 0.25))
    assert Tensor.arange(10, 0, -3, device=xgrad_device).tolist() == list(range(10, 0, -3))
    assert Tensor(b"\x01\x02", device=xgrad_device).tolist() == [1, 2]
    assert Tensor([[True, False]], device=xgrad_device).dtype == dtypes.bool
    assert Tensor(3.5, device=xgrad_device).item() == 3.5
    assert Tensor.empty(3, device=xgrad_device).shape == (3,)


def test_assign_writes_in_place(xgrad_device):
    t = Tensor([1.0, 2.0, 3.0], device=xgrad_device).realize()
    t.assign(t * 2 + 1).realize()
    assert t.tolist() == [3.0, 5.0, 7.0]
    t += 1
    assert t.tolist() == [4.0, 6.0, 8.0]
    with pytest.raises(DTypeError):
        t.assign(Tensor([1, 2, 3], device=xgrad_device))


def test_realized_results_are_reused(xgrad_device):
    a = Tensor(make((8, 8), dtypes.float32), device=xgrad_device)
    s = (a * 2).sum(1)
    s.realize()
    assert np.allclose((s + 1).numpy(), s.numpy() + 1)


def test_bad_input_raises_clear_errors(xgrad_device):
    a = Tensor.ones(2, 3, device=xgrad_device)
    with pytest.raises(ShapeError, match=r"\(2, 3\).*\(4,\)"):
        a + Tensor.ones(4, device=xgrad_device)
    with pytest.raises(ShapeError):
        a.reshape(5)
    with pytest.raises(ShapeError):
        a.pad(((-3, 0), (0, 0)))
    with pytest.raises(DTypeError):
        Tensor([1], dtype="float17")
    with pytest.raises(XgradError, match="NOPE"):
        Tensor([1.0], device="NOPE").numpy()
    with pytest.raises(ShapeError):
        a @ Tensor.ones(2, 3, device=xgrad_device)


def test_pending_tensors_see_assigned_values(xgrad_device):
    t = Tensor([1.0, 2.0], device=xgrad_device).realize()
    before = (t + 1).numpy()
    t.assign(Tensor([10.0, 20.0], device=xgrad_device)).realize()
    assert before.tolist() == [2.0, 3.0]
    assert (t + 1).tolist() == [11.0, 21.0]  # not a stale result of the identical graph before the assign


def test_lazy_tensor_reads_result_realized_through_another(xgrad_device):
    a = Tensor([[1.0, 2.0], [3.0, 4.0]], device=xgrad_device)
    s = a.sum(1)
    y = s * 2  # built before s is realized
    s.realize()
    assert y.uop.toposort.keys().isdisjoint({u for u in a.uop.toposort if u.op.name == "REDUCE_AXIS"})
    assert y.tolist() == [6.0, 14.0]


def test_same_graph_structure_reuses_the_schedule(xgrad_device):
    from xgrad.engine.schedule_cache import schedule_cache_size

    def step(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        x, y = Tensor(a, device=xgrad_device), Tensor(b, device=xgrad_device)
        return ((x * y).sum(1).softmax() + 1).numpy()

    a, b = make((5, 6), dtypes.float32, -0.5, 0.5), make((5, 6), dtypes.float32, -0.5, 0.5)  # softmax not saturated
    first = step(a, b)
    size = schedule_cache_size()
    second = step(a * 2, b)  # same structure, other buffers and data
    assert schedule_cache_size() == size
    ref = np.exp((a * 2 * b).sum(1) - (a * 2 * b).sum(1).max())
    np.testing.assert_allclose(second, ref / ref.sum() + 1, rtol=1e-5)
    assert not np.allclose(first, second)


def test_disk_file_is_a_uint8_tensor_with_lazy_slices(tmp_path, xgrad_device):
    import pathlib

    data = bytes(range(256)) * 4
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    t = Tensor(pathlib.Path(path))
    assert t.dtype == dtypes.uint8 and t.shape == (1024,) and t.device.startswith("DISK:")
    assert t.to(xgrad_device).numpy().tobytes() == data
    part = t.shrink(((260, 300),)).to(xgrad_device)  # a byte range: copied through a view, no DISK kernel
    assert part.numpy().tobytes() == data[260:300]
    assert (t.reshape(4, 256).shrink(((2, 3), (0, 256))).to(xgrad_device).numpy() == np.arange(256)).all()


def test_reduce_whose_value_ignores_a_loop(xgrad_device):
    # the reduced value does not depend on the reduce loop (or on an output loop): the accumulator must still be
    # reset per output element and updated in every iteration
    assert Tensor.ones(8, 3, device=xgrad_device).sum(0).tolist() == [8.0, 8.0, 8.0]
    assert Tensor.full((5, 2), 3.0, device=xgrad_device).max(0).tolist() == [3.0, 3.0]
    w = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=xgrad_device)
    np.testing.assert_allclose(
        (Tensor.ones(8, 3, device=xgrad_device) @ w.T).numpy(), np.ones((8, 3)) @ np.arange(6).reshape(2, 3).T
    )
    x = make((4, 5), dtypes.float32)
    t = Tensor(x, device=xgrad_device)
    nested = (t.sum(1, keepdim=True) * Tensor.ones(4, 7, device=xgrad_device)).sum(1)  # a reduce inside a reduce
    np.testing.assert_allclose(nested.numpy(), x.sum(1) * 7, rtol=1e-5)


def test_bool_arithmetic_is_logical(xgrad_device):
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    check(xgrad_device, lambda x, y: x + y, np.add, a, b)
    check(xgrad_device, lambda x, y: x * y, np.multiply, a, b)


@pytest.mark.parametrize("shape", [(3, 1001), (37,), (2, 65)])
def test_sizes_that_need_padding_to_vectorize(xgrad_device, shape):
    # the contiguous axis is padded to a multiple of the vector width; padded lanes must load and store nothing
    a, b = make(shape, dtypes.float32), make(shape, dtypes.float32)
    check(xgrad_device, lambda x, y: (x * 2 + y).exp2(), lambda x, y: np.exp2(x * 2 + y), a, b)
    check(xgrad_device, lambda x: x.sum(0), lambda x: x.sum(0), a, atol=1e-4)


def test_split_reductions_match_numpy(xgrad_device):
    x = make((1 << 16,), dtypes.float32, 0, 1)
    check(xgrad_device, lambda t: t.sum(), lambda a: a.astype(np.float64).sum(), x, atol=2e-3)
    check(xgrad_device, lambda t: t.max(), lambda a: a.max(), x)
    y = make((4, 1 << 14), dtypes.float32, 0, 1)
    check(xgrad_device, lambda t: t.sum(), lambda a: a.astype(np.float64).sum(), y, atol=2e-3)


def test_data_of_lazy_tensors_stays_valid(xgrad_device):
    a = Tensor([1.0, 2.0], device=xgrad_device)
    b = Tensor([5.0, 7.0], device=xgrad_device)
    ma, mb = (a * 2).data(), (b * 2).data()  # the first buffer must not be reused for the second result
    assert ma.tolist() == [2.0, 4.0] and mb.tolist() == [10.0, 14.0]


def test_disk_file_replaced_at_the_same_path_is_read_anew(tmp_path):
    import os
    import pathlib

    path = tmp_path / "f.bin"
    path.write_bytes(b"\x01\x02\x03")
    assert Tensor(pathlib.Path(path)).to("CPU").tolist() == [1, 2, 3]
    other = tmp_path / "g.bin"
    other.write_bytes(b"\x09\x08\x07")
    os.replace(other, path)
    assert Tensor(pathlib.Path(path)).to("CPU").tolist() == [9, 8, 7]


def test_lazy_reader_keeps_the_value_from_before_an_assign(xgrad_device):
    w = Tensor([1.0, 2.0], device=xgrad_device).realize()
    old_double = w * 2  # lazy: reads w as it is now
    w.assign(w + 10).realize()
    assert w.tolist() == [11.0, 12.0]
    assert old_double.tolist() == [2.0, 4.0]  # computed with the value from before the assign
    both = w * 3
    w.assign(w * 0)
    Tensor.realize(both, w)  # realized together: the reader still sees the value before the assign
    assert both.tolist() == [33.0, 36.0] and w.tolist() == [0.0, 0.0]


def test_lazy_reader_with_a_symbolic_shape_keeps_the_value_from_before_an_assign(xgrad_device):
    from xgrad.uop.ops import UOp

    x = Tensor(np.arange(8, dtype=np.float32), device=xgrad_device).realize()
    n = UOp.variable("n", 1, 8).bind(5)
    head = x.shrink(((0, n),)) * 2  # lazy, symbolic: the assign's realize computes it first (and unbinds n)
    x.assign(x + 1).realize()
    np.testing.assert_array_equal(head.numpy(), np.arange(5, dtype=np.float32) * 2)
    np.testing.assert_array_equal(x.numpy(), np.arange(8, dtype=np.float32) + 1)


def test_identical_lazy_tensors_get_their_own_buffers(xgrad_device):
    a = Tensor.zeros(3, device=xgrad_device).contiguous()
    b = Tensor.zeros(3, device=xgrad_device).contiguous()  # the same graph node as a
    a.realize()
    b.realize()
    a.assign(Tensor([1.0, 2.0, 3.0], device=xgrad_device)).realize()
    assert a.tolist() == [1.0, 2.0, 3.0] and b.tolist() == [0.0, 0.0, 0.0]


def test_data_of_float16_is_raw_bytes(xgrad_device):
    # memoryview has no half format: float16 data comes back as its bytes
    mv = Tensor([1.0, 2.0], device=xgrad_device, dtype=dtypes.float16).data()
    assert np.frombuffer(mv, dtype=np.float16).tolist() == [1.0, 2.0]
