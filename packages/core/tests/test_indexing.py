"""Indexing (`xgrad.mixin.indexing`, `xgrad.mixin.gather`): getitem, setitem, gather, scatter, scatter_reduce,
masked_fill, masked_select, nonzero and one_hot, forward and backward against torch (numpy where torch has no
equivalent, e.g. negative slice steps), on every available device (fixture `xgrad_device`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch_compare import run_docstring

from xgrad.dtype import dtypes, to_np_dtype
from xgrad.errors import DTypeError, IndexingError, ShapeError, XgradError
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

rng = np.random.default_rng(0)
Fn = Callable[..., Any]
S = slice


def rand(shape: tuple[int, ...]) -> np.ndarray:
    return np.asarray(rng.uniform(-2.0, 2.0, size=shape), dtype=np.float32)


def to_xgrad(idx: Any, device: str) -> Any:
    """An index as xgrad takes it: np arrays become Tensors (lists stay lists)."""
    if isinstance(idx, tuple):
        return tuple(to_xgrad(i, device) for i in idx)
    return Tensor(idx, device=device) if isinstance(idx, np.ndarray) else idx


def to_torch(idx: Any) -> Any:
    if isinstance(idx, tuple):
        return tuple(to_torch(i) for i in idx)
    if isinstance(idx, np.ndarray):  # torch reads a uint8 array as a mask and refuses int8/int16 indices
        return torch.from_numpy(idx.astype(np.int64) if idx.dtype.kind in "iu" else idx)
    return torch.tensor(idx) if isinstance(idx, list) else idx


def check_grad(device: str, fn: Fn, torch_fn: Fn, *arrays: np.ndarray) -> None:
    """Forward and backward (random upstream gradient) of fn against torch_fn on float64 copies of `arrays`."""
    xs = [Tensor(a, device=device, requires_grad=True) for a in arrays]  # a 0-d one: a buffer, not a constant
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    out, want = fn(*xs), torch_fn(*ts)
    assert out.shape == tuple(want.shape), f"forward shape {out.shape} != torch {tuple(want.shape)}"
    up = rand(out.shape)
    grads = out.gradient(*xs, gradient=Tensor(up, device=device))  # built before reading: reads may realize `out`
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), atol=1e-6, rtol=1e-6)
    want_grads = torch.autograd.grad(want, ts, torch.tensor(up.astype(np.float64)), allow_unused=True)
    for i, (g, wg) in enumerate(zip(grads, want_grads)):
        expected = np.zeros(arrays[i].shape) if wg is None else wg.numpy()
        np.testing.assert_allclose(g.numpy(), expected, atol=1e-5, rtol=1e-5, err_msg=f"gradient of input {i}")


# ---- getitem ----
GETITEM = [
    ("int", 1),
    ("int_neg", -1),
    ("ints", (1, -2)),
    ("slice", S(1, 3)),
    ("slice_clipped", S(-10, 10)),
    ("slice_step", (S(None), S(None, None, 2), S(1, None, 3))),
    ("slice_empty", S(2, 1)),
    ("none_ellipsis", (None, ..., None, 0)),
    ("ellipsis_only", ...),
    ("empty_tuple", ()),
    ("list", [2, 0, 0]),
    ("list_neg", [-1, 1]),
    ("array_2d", np.array([[0, 1], [2, 0]], dtype=np.int32)),
    ("two_arrays", (np.array([0, 2], dtype=np.int32), np.array([1, 2], dtype=np.int32))),
    ("broadcast_arrays", (np.array([[0], [1]], dtype=np.int32), S(None), np.array([0, 3], dtype=np.int32))),
    ("array_after_slice", (S(1, None), np.array([2, 0], dtype=np.int16))),
    ("int_then_array", (0, S(None), np.array([0, 1], dtype=np.int32))),
    ("array_int_array", (np.array([0, 1], dtype=np.int32), 0, np.array([0, 1], dtype=np.int32))),
    ("array_none_array", (np.array([0, 1], dtype=np.int32), None, S(None), np.array([0, 1], dtype=np.int32))),
    ("array_0d", np.array(1, dtype=np.int32)),
    ("array_empty", np.array([], dtype=np.int32)),
    ("bool_mask_full", np.array(rng.random((3, 3, 4)) > 0.5)),
    ("bool_mask_part", (S(None), np.array([True, False, True]))),
    ("bool_list", [True, False, True]),
    ("python_true", (True, 0)),
    ("uint8_index", np.array([2, 1], dtype=np.uint8)),
]


@pytest.mark.parametrize("name,idx", GETITEM, ids=[g[0] for g in GETITEM])
def test_getitem_matches_torch_forward_and_backward(xgrad_device, name, idx):
    check_grad(xgrad_device, lambda x: x[to_xgrad(idx, xgrad_device)], lambda x: x[to_torch(idx)], rand((3, 3, 4)))


NEG_STEPS = [S(None, None, -1), (S(None), S(None, None, -2)), (S(2, 0, -1), S(None), S(-1, 0, -3)), S(0, 2, -1)]


@pytest.mark.parametrize("idx", NEG_STEPS, ids=[str(i) for i in range(len(NEG_STEPS))])
def test_getitem_negative_steps_match_numpy(xgrad_device, idx):
    a = rand((3, 3, 4))
    x = Tensor(a, device=xgrad_device)
    out = x[idx]
    up = rand(out.shape)
    grad = out.gradient(x, gradient=Tensor(up, device=xgrad_device))[0]
    np.testing.assert_array_equal(out.numpy(), a[idx])
    want = np.zeros_like(a)
    want[idx] = up
    np.testing.assert_array_equal(grad.numpy(), want)


def test_getitem_of_empty_and_0d_tensors(xgrad_device):
    e = Tensor.zeros(0, 3, device=xgrad_device)
    assert e[:, 1].shape == (0,) and e[[0, 2]].shape == (2, 3) and e[[0, 2]].tolist() == [[0.0] * 3] * 2
    s = Tensor(5.0, device=xgrad_device)
    assert s[None].tolist() == [5.0] and s[...].item() == 5.0 and s[()].shape == ()
    with pytest.raises(IndexingError):
        s[0]


def test_getitem_advanced_out_of_range_reads_zero(xgrad_device):
    x = Tensor([[1, 2], [3, 4]], device=xgrad_device)
    assert x[[0, 5, -1, -3]].tolist() == [[1, 2], [0, 0], [3, 4], [0, 0]]
    assert x[Tensor([1, 2], device=xgrad_device), Tensor([1, -2], device=xgrad_device)].tolist() == [4, 0]


GETITEM_DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.float64]


@pytest.mark.parametrize("dtype", GETITEM_DTYPES, ids=[d.name for d in GETITEM_DTYPES])
def test_getitem_keeps_every_dtype(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)
    np_dt = to_np_dtype(dtype)
    a = (rng.random((3, 4)) > 0.5) if dtype == dtypes.bool else rng.integers(-100, 100, size=(3, 4)).astype(np_dt)
    x = Tensor(a, device=xgrad_device, dtype=dtype)
    for idx in [(1, S(None, None, 2)), (S(None), [3, 0]), ([[2], [0]], [1, 2]), (a > 0,)]:
        out = x[to_xgrad(idx, xgrad_device)]
        assert out.dtype == dtype
        np.testing.assert_array_equal(out.numpy(), a[idx])


BAD_GETITEM: list[tuple[str, Any, type[Exception]]] = [
    ("int_range", 3, IndexingError),
    ("int_range_neg", (0, -5), IndexingError),
    ("too_many", (0, 0, 0), IndexingError),
    ("two_ellipsis", (..., ...), IndexingError),
    ("step_zero", S(None, None, 0), IndexingError),
    ("float", 1.5, IndexingError),
    ("float_tensor", Tensor([0.0]), IndexingError),
    ("ragged", [[0, 1], [0]], IndexingError),
    ("mask_shape", Tensor([True, False]), IndexingError),
    ("slice_float", S(0.5, 2), IndexingError),
    ("no_broadcast", ([0, 1], [0, 1, 2]), IndexingError),
]


@pytest.mark.parametrize("name,idx,err", BAD_GETITEM, ids=[b[0] for b in BAD_GETITEM])
def test_bad_getitem_raises_indexing_error(name, idx, err):
    with pytest.raises(err):
        Tensor.zeros(3, 4)[idx]


# ---- setitem ----
SETITEM = [
    ("int", 1, 5.0),
    ("slice", (S(None), S(1, 3)), 2.0),
    ("slice_step", (S(None), S(None, None, 3)), np.array([1.0, 2.0], dtype=np.float32)),
    ("slice_step_tail", (S(1, None, 2), S(None, None, -3)), 7.0),
    ("ellipsis_none", (..., None, -1), np.array([[1.0], [2.0], [3.0]], dtype=np.float32)),
    ("broadcast_row", 0, np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)),
    ("leading_ones", 2, np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)),
    ("list", [2, 0], np.array([[1.0], [2.0]], dtype=np.float32)),
    ("two_arrays", ([0, 2, 1], [3, 0, 0]), np.array([1.0, 2.0, 3.0], dtype=np.float32)),
    ("mask", "mask", 0.0),
    ("mask_values", "mask", "count"),
    ("slice_and_array", (S(1, None), [0, 3]), -1.0),
    ("empty", [], 3.0),
]


@pytest.mark.parametrize("name,idx,value", SETITEM, ids=[s[0] for s in SETITEM])
def test_setitem_matches_numpy(xgrad_device, name, idx, value):
    a = rand((3, 4))
    if isinstance(idx, str):
        idx = a > 0
    if isinstance(value, str):
        value = np.arange(int((a > 0).sum()), dtype=np.float32)
    want = a.copy()
    want[idx] = value
    x = Tensor(a, device=xgrad_device)
    xi = Tensor(idx, device=xgrad_device) if isinstance(idx, np.ndarray) else idx
    x[xi] = Tensor(value, device=xgrad_device) if isinstance(value, np.ndarray) else value
    np.testing.assert_array_equal(x.numpy(), want)


def test_setitem_on_lazy_and_constant_tensors_does_not_touch_equal_graphs(xgrad_device):
    a, b = Tensor.zeros(2, 3, device=xgrad_device), Tensor.zeros(2, 3, device=xgrad_device)
    a[0, 1] = 4.0
    assert a.tolist() == [[0.0, 4.0, 0.0], [0.0, 0.0, 0.0]] and b.tolist() == [[0.0] * 3] * 2
    base = Tensor([1.0, 2.0, 3.0], device=xgrad_device)
    c, d = base * 2, base * 2
    c[[1]] = 0.0
    assert c.tolist() == [2.0, 0.0, 6.0] and d.tolist() == [2.0, 4.0, 6.0] and base.tolist() == [1.0, 2.0, 3.0]


def test_setitem_keeps_old_values_in_lazy_readers(xgrad_device):
    x = Tensor([1.0, 2.0, 3.0], device=xgrad_device).realize()
    doubled = x * 2
    x[0] = 10.0
    x[[2]] = 30.0
    assert doubled.tolist() == [2.0, 4.0, 6.0] and x.tolist() == [10.0, 2.0, 30.0]


def test_setitem_with_overlapping_value_matches_numpy(xgrad_device):
    a = np.arange(6, dtype=np.float32)
    x = Tensor(a, device=xgrad_device)
    x[1:] = x[:-1]
    want = a.copy()
    want[1:] = a[:-1].copy()
    np.testing.assert_array_equal(x.numpy(), want)
    x[[0, 1]] = x[[4, 5]]
    want[[0, 1]] = want[[4, 5]]
    np.testing.assert_array_equal(x.numpy(), want)


def test_setitem_through_a_view_writes_the_base_like_torch(xgrad_device):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x, t = Tensor(a, device=xgrad_device), torch.from_numpy(a.copy())
    xv, tv = x.T, t.T
    xv[1] = -1.0
    tv[1] = -1.0
    np.testing.assert_array_equal(x.numpy(), t.numpy())
    padded = x.pad(((0, 1), (0, 0)))  # not a plain view: setitem works on its own copy
    padded[2] = 9.0
    assert padded[2].tolist() == [9.0] * 3 and x.shape == (2, 3)


def test_setitem_augmented_assignment_matches_numpy(xgrad_device):
    a = np.arange(6, dtype=np.float32)
    x = Tensor(a, device=xgrad_device)
    x[1:3] += 1
    x[[0, 5]] += 10
    x[x > 4] *= 2
    x[::2] -= 1
    a[1:3] += 1
    a[[0, 5]] += 10
    a[a > 4] *= 2
    a[::2] -= 1
    np.testing.assert_array_equal(x.numpy(), a)


def test_setitem_repeated_index_last_write_wins(xgrad_device):
    x = Tensor([0, 0, 0], device=xgrad_device)
    x[[1, 1, 2, 1]] = Tensor([5, 6, 7, 8], device=xgrad_device)
    assert x.tolist() == [0, 8, 7]


SETITEM_DTYPES = [dtypes.bool, dtypes.int8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.float64]


@pytest.mark.parametrize("dtype", SETITEM_DTYPES, ids=[d.name for d in SETITEM_DTYPES])
def test_setitem_keeps_every_dtype(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)
    np_dt = to_np_dtype(dtype)
    a = np.zeros((2, 3), dtype=np_dt)
    x = Tensor(a, device=xgrad_device, dtype=dtype)
    x[0, ::2] = 1
    x[[1], [1]] = Tensor([True], device=xgrad_device, dtype=dtype)
    a[0, ::2] = 1
    a[1, 1] = 1
    assert x.dtype == dtype
    np.testing.assert_array_equal(x.numpy(), a)


def test_bad_setitem_raises_clear_errors(xgrad_device):
    x = Tensor.zeros(2, 3, device=xgrad_device)
    with pytest.raises(DTypeError, match="int32"):
        x[0] = Tensor([1, 2, 3], device=xgrad_device)
    with pytest.raises(ShapeError, match=r"\(2,\)"):
        x[0] = Tensor([1.0, 2.0], device=xgrad_device)
    with pytest.raises(DTypeError):
        x[0] = "a"
    with pytest.raises(IndexingError):
        x[5] = 1.0
    with pytest.raises(IndexingError):
        del x[0]


# ---- gather / scatter ----
GATHER = [
    ("dim0", 0, (3, 4), np.array([[0, 2, 1, 0], [2, 2, 0, 1]])),
    ("dim1_smaller", 1, (3, 4), np.array([[3, 0], [1, 1]])),
    ("dim_neg_3d", -1, (2, 2, 3), np.array([[[2, 0, 1, 1]], [[0, 0, 2, 1]]])),
    ("empty", 0, (3, 2), np.zeros((0, 2), dtype=np.int64)),
]


@pytest.mark.parametrize("name,dim,shape,index", GATHER, ids=[g[0] for g in GATHER])
def test_gather_matches_torch(xgrad_device, name, dim, shape, index):
    check_grad(
        xgrad_device,
        lambda x: x.gather(dim, Tensor(index.astype(np.int32), device=xgrad_device)),
        lambda x: x.gather(dim, torch.from_numpy(index.astype(np.int64))),
        rand(shape),
    )


def test_gather_out_of_range_reads_zero_and_checks_shapes(xgrad_device):
    x = Tensor([[1, 2], [3, 4]], device=xgrad_device)
    assert x.gather(1, Tensor([[1, 2], [-1, 0]], device=xgrad_device)).tolist() == [[2, 0], [0, 3]]
    assert Tensor(7, device=xgrad_device).gather(0, Tensor(0, device=xgrad_device)).item() == 7
    with pytest.raises(ShapeError):
        x.gather(0, Tensor([[0, 1, 0]], device=xgrad_device))
    with pytest.raises(DTypeError):
        x.gather(0, Tensor([[0.0]], device=xgrad_device))


SCATTER_INDEX = np.array([[0, 2, 1], [2, 0, 0]])  # no repeats along dim 0 in a column, rows 0..2


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("reduce", [None, "add"])
def test_scatter_matches_torch(xgrad_device, reduce):
    idx = Tensor(SCATTER_INDEX.astype(np.int32), device=xgrad_device)
    kw = {} if reduce is None else {"reduce": reduce}
    check_grad(
        xgrad_device,
        lambda x, s: x.scatter(0, idx, s, **kw),
        lambda x, s: (x.scatter_add if reduce else x.scatter)(0, torch.from_numpy(SCATTER_INDEX), s),
        rand((3, 4)),
        rand((2, 3)),  # torch's backward needs src shaped like index
    )


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter_multiply_scalar_and_repeats_match_torch(xgrad_device):
    a, src = rand((3, 4)), rand((2, 3))
    x, s = Tensor(a, device=xgrad_device), Tensor(src, device=xgrad_device)
    t, ts = torch.from_numpy(a), torch.from_numpy(src)
    rep = np.array([[0, 1, 2], [0, 1, 2]])  # both rows land on the same places: the last one wins
    i, ti = Tensor(rep.astype(np.int32), device=xgrad_device), torch.from_numpy(rep)
    np.testing.assert_allclose(x.scatter(1, i, s, reduce="multiply").numpy(), t.scatter(1, ti, ts, reduce="multiply"))
    np.testing.assert_allclose(x.scatter(0, i, s).numpy(), t.scatter(0, ti, ts).numpy())
    np.testing.assert_allclose(x.scatter(1, i, 2.5).numpy(), t.scatter(1, ti, 2.5).numpy())
    empty = Tensor.zeros(0, 3, device=xgrad_device, dtype=dtypes.int32)
    np.testing.assert_array_equal(x.scatter(0, empty, s).numpy(), a)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_matches_torch(xgrad_device, reduce, include_self):
    index = np.array([[0, 2, 1, 0], [0, 0, 2, 1], [2, 0, 0, 0]])  # repeats, and row 1 of column 3 is never hit
    idx = Tensor(index.astype(np.int32), device=xgrad_device)
    ti = torch.from_numpy(index)

    def fn(x: Tensor, s: Tensor) -> Tensor:
        return x.scatter_reduce(0, idx, s, reduce, include_self=include_self)

    def torch_fn(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x.scatter_reduce(0, ti, s, reduce, include_self=include_self)

    if reduce == "prod":  # forward only: a product reduction has no gradient rule
        a, s = rand((3, 4)), rand((3, 4))
        out = fn(Tensor(a, device=xgrad_device), Tensor(s, device=xgrad_device)).numpy()
        np.testing.assert_allclose(out, torch_fn(torch.from_numpy(a), torch.from_numpy(s)).numpy(), rtol=1e-6)
        return
    check_grad(xgrad_device, fn, torch_fn, rand((3, 4)), rand((3, 4)))  # torch needs src shaped like index


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int8, dtypes.int64], ids=["int32", "int8", "int64"])
def test_scatter_reduce_ints_match_torch(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)
    np_dt = to_np_dtype(dtype)
    a, s = rng.integers(-9, 9, size=(3, 2)).astype(np_dt), rng.integers(-9, 9, size=(3, 2)).astype(np_dt)
    index = np.array([[0, 1], [0, 1], [2, 1]])
    x, xs = Tensor(a, device=xgrad_device, dtype=dtype), Tensor(s, device=xgrad_device, dtype=dtype)
    idx = Tensor(index.astype(np.int32), device=xgrad_device)
    for reduce in ["sum", "prod", "mean", "amax", "amin"]:
        for inc in [True, False]:
            got = x.scatter_reduce(0, idx, xs, reduce, include_self=inc)
            want = torch.from_numpy(a).scatter_reduce(
                0, torch.from_numpy(index), torch.from_numpy(s), reduce, include_self=inc
            )
            assert got.dtype == dtype
            np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"{reduce} include_self={inc}")


def test_bad_scatter_raises_clear_errors(xgrad_device):
    x = Tensor.zeros(2, 3, device=xgrad_device)
    idx = Tensor([[0, 1]], device=xgrad_device)
    with pytest.raises(XgradError):
        x.scatter(0, idx, 1.0, reduce="max")
    with pytest.raises(XgradError):
        x.scatter_reduce(0, idx, Tensor.ones(1, 2, device=xgrad_device), "median")
    with pytest.raises(DTypeError):
        x.scatter(0, idx, Tensor.ones(1, 2, device=xgrad_device, dtype=dtypes.int32))
    with pytest.raises(ShapeError):
        x.scatter(0, Tensor([[0, 1, 1, 0]], device=xgrad_device), Tensor.ones(1, 4, device=xgrad_device))
    with pytest.raises(ShapeError):
        x.scatter(0, idx, Tensor.ones(2, device=xgrad_device))


# ---- masks ----
def test_masked_fill_matches_torch(xgrad_device):
    a, m = rand((3, 4)), rng.random((4,)) > 0.5
    mask = Tensor(m, device=xgrad_device)
    check_grad(xgrad_device, lambda x: x.masked_fill(mask, -1.5), lambda x: x.masked_fill(torch.from_numpy(m), -1.5), a)
    ints = Tensor([1, 2, 3], device=xgrad_device)
    filled = ints.masked_fill(Tensor([True, False, False], device=xgrad_device), 7.9)
    assert filled.dtype == ints.dtype and filled.tolist() == [7, 2, 3]
    assert ints.masked_fill(ints > 1, Tensor(0, device=xgrad_device)).tolist() == [1, 0, 0]


def test_masked_select_matches_torch(xgrad_device):
    a, m = rand((3, 4)), rng.random((3, 1)) > 0.3
    mask = Tensor(m, device=xgrad_device)
    check_grad(xgrad_device, lambda x: x.masked_select(mask), lambda x: x.masked_select(torch.from_numpy(m)), a)
    x = Tensor([1, 2, 3, 4], device=xgrad_device)
    mk = Tensor([False, True, False, True], device=xgrad_device)
    assert x.masked_select(mk, size=3, fill_value=-1).tolist() == [2, 4, -1]
    assert x.masked_select(mk, size=1).tolist() == [2]
    assert x.masked_select(x > 9).shape == (0,)
    with pytest.raises(DTypeError):
        x.masked_select(x)


NONZERO = [
    ("1d", np.array([0.0, 1.5, 0.0, -2.0], dtype=np.float32)),
    ("2d", np.array([[1, 0, 3], [0, 0, 7]], dtype=np.int32)),
    ("3d_bool", rng.random((2, 3, 2)) > 0.5),
    ("0d", np.array(3.0, dtype=np.float32)),
    ("all_zero", np.zeros((2, 2), dtype=np.float32)),
    ("empty", np.zeros((0, 3), dtype=np.int32)),
]


@pytest.mark.parametrize("name,arr", NONZERO, ids=[n[0] for n in NONZERO])
def test_nonzero_matches_torch(xgrad_device, name, arr):
    x = Tensor(arr, device=xgrad_device)
    t = torch.from_numpy(arr)
    got = x.nonzero()
    assert got.shape == tuple(torch.nonzero(t).shape)
    np.testing.assert_array_equal(got.numpy(), torch.nonzero(t).numpy())
    for size in [0, 2, 5]:
        want = torch.nonzero_static(t, size=size, fill_value=-1)
        np.testing.assert_array_equal(x.nonzero(size=size, fill_value=-1).numpy(), want.numpy())


ONE_HOT_DTYPES = [dtypes.int32, dtypes.uint8, dtypes.int64]


@pytest.mark.parametrize("dtype", ONE_HOT_DTYPES, ids=[d.name for d in ONE_HOT_DTYPES])
def test_one_hot_matches_torch(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)
    arr = np.array([[0, 3], [2, 2]], dtype=to_np_dtype(dtype))
    x = Tensor(arr, device=xgrad_device, dtype=dtype)
    t = torch.from_numpy(arr.astype(np.int64))
    np.testing.assert_array_equal(x.one_hot().numpy(), torch.nn.functional.one_hot(t).numpy())
    np.testing.assert_array_equal(x.one_hot(6).numpy(), torch.nn.functional.one_hot(t, 6).numpy())
    assert x.one_hot(4).dtype == dtypes.default_int
    with pytest.raises(DTypeError):
        Tensor([0.0]).one_hot(2)


SELECT_DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.float64]


@pytest.mark.parametrize("dtype", SELECT_DTYPES, ids=[d.name for d in SELECT_DTYPES])
def test_selection_ops_keep_every_dtype(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)
    np_dt = to_np_dtype(dtype)
    a = (rng.random((3, 4)) > 0.5) if dtype == dtypes.bool else rng.integers(-9, 9, size=(3, 4)).astype(np_dt)
    m = rng.random((3, 4)) > 0.5
    x, t = Tensor(a, device=xgrad_device, dtype=dtype), torch.from_numpy(a)
    mask, tm = Tensor(m, device=xgrad_device), torch.from_numpy(m)
    index = np.array([[2, 0, 1, 1], [0, 0, 2, 1]])
    idx, ti = Tensor(index.astype(np.int32), device=xgrad_device), torch.from_numpy(index)
    src, tsrc = x.flip(0), t.flip(0)
    cases = [
        ("gather", x.gather(0, idx), t.gather(0, ti)),
        ("scatter", x.scatter(1, idx[:, :3], src), t.scatter(1, ti[:, :3], tsrc)),
        ("masked_fill", x.masked_fill(mask, 1), t.masked_fill(tm, 1)),
        ("masked_select", x.masked_select(mask), t.masked_select(tm)),
        ("getitem_mask", x[mask], t[tm]),
    ]
    for name, got, want in cases:
        assert got.dtype == dtype, f"{name}: {got.dtype} != {dtype}"
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=name)
    np.testing.assert_array_equal(x.nonzero().numpy(), t.nonzero().numpy())


def test_selection_ops_on_0d_tensors_match_torch(xgrad_device):
    x, t = Tensor(1.5, device=xgrad_device), torch.tensor(1.5)
    i, ti = Tensor(0, device=xgrad_device), torch.tensor(0)
    assert x.scatter(0, i, Tensor(4.0, device=xgrad_device)).item() == t.scatter(0, ti, torch.tensor(4.0)).item()
    assert x.scatter_reduce(0, i, Tensor(4.0, device=xgrad_device), "sum").item() == 5.5
    assert x.masked_fill(Tensor(True, device=xgrad_device), 2.0).item() == 2.0
    assert x.masked_select(Tensor(True, device=xgrad_device)).tolist() == [1.5]
    assert Tensor(2, device=xgrad_device).one_hot(3).tolist() == [0, 0, 1]


# ---- docstrings ----
METHODS = [
    "__getitem__",
    "__setitem__",
    "gather",
    "scatter",
    "scatter_reduce",
    "masked_fill",
    "masked_select",
    "nonzero",
    "one_hot",
]


@pytest.mark.parametrize("name", METHODS)
def test_docstring_example_runs_for_method(name: str) -> None:
    run_docstring(name)
