"""tinygrad compatibility, indexing: numpy-style mixes of slices, ints, None, ... and integer lists (and index lists
that hold slices, numpy's older rule that tinygrad keeps), a zero step and float/str indexes raising tinygrad's error
types, and basic indexing returning views that assigns write through. Oracle: numpy (torch where tinygrad follows
torch rather than numpy)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from xgrad import Tensor

A = np.arange(60).reshape(3, 4, 5)

CASES: list[Any] = [
    (slice(None), [1, 3]),
    ([0, 2], slice(None), [1, 3]),
    (slice(None), [1, 3], [0, 4]),
    ([0, 1], [1, 3]),
    (Ellipsis, [0, 2]),
    (None, slice(None), [1]),
    ([[0], [2]], [1, 3]),
    (slice(None), [[1, 2], [0, 3]]),
    ([0, 2], slice(1, 3), [1, 3]),
    (-1, [-1, 0]),
    (slice(None, None, 2), [1], slice(None, None, -1)),
    ([True, False, True],),
    (1, [0, 2], slice(2, None)),
    ([0, 1], 1, [2, 3]),
    (np.array([0, 2]), slice(None), np.array([1, 1])),
    (slice(2, 0, -1),),
    (slice(None, None, -2), 1),
    (slice(10, None),),
    (slice(-100, 2),),
    (slice(None), slice(1, -1), slice(None, None, 3)),
    (Ellipsis, None, 1),
    ([2, 0, 2],),
]


@pytest.mark.parametrize("index", CASES, ids=[repr(c) for c in CASES])
def test_getitem_matches_numpy(index: Any) -> None:
    want = A[index]
    got = Tensor(A)[index].numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_index_lists_holding_slices_are_tuples() -> None:
    a = np.arange(20).reshape(4, 5)
    t = Tensor(a)
    np.testing.assert_array_equal(t[[slice(None), [0, 3, 4]]].numpy(), a[(slice(None), [0, 3, 4])])
    np.testing.assert_array_equal(t[[1, slice(1, 4)]].numpy(), a[1, 1:4])
    np.testing.assert_array_equal(t[[None, 2]].numpy(), a[None, 2])
    np.testing.assert_array_equal(t[[0, 2]].numpy(), a[[0, 2]])  # a list of ints stays an advanced index


def test_int_and_list_split_by_a_slice_keep_the_slice_axis_first_like_torch() -> None:
    # numpy moves the broadcast index axis to the front ((2, 4)); tinygrad and torch treat the int as basic: (4, 2)
    torch = pytest.importorskip("torch")
    for index in [(1, slice(None), [0, 2]), (slice(None), 1, [0, 2])]:
        want = torch.tensor(A)[index].numpy()
        np.testing.assert_array_equal(Tensor(A)[index].numpy(), want)


def test_zero_step_raises_value_error() -> None:
    t = Tensor(A)
    with pytest.raises(ValueError, match="step cannot be zero"):
        t[::0]
    with pytest.raises(ValueError, match="step cannot be zero"):
        t[:, 1:3:0]
    with pytest.raises(IndexError):  # also an IndexingError
        t[::0]


@pytest.mark.parametrize("bad", [1.5, "a", [1.5], [[0.0, 1.0]], np.array([0.5]), (0, 1.0)], ids=repr)
def test_float_and_string_indexes_raise_index_error(bad: Any) -> None:
    with pytest.raises(IndexError):
        A[bad]  # numpy agrees
    with pytest.raises(IndexError):
        Tensor(A)[bad]


def test_out_of_range_ints_and_too_many_indexes_raise_index_error() -> None:
    t = Tensor(A)
    for bad in [3, (0, 4), (0, 0, -6), (0, 0, 0, 0)]:
        with pytest.raises(IndexError):
            A[bad]
        with pytest.raises(IndexError):
            t[bad]


def test_basic_indexing_returns_views_that_assign_writes_through() -> None:
    want = np.zeros((4, 5), dtype=np.float32)
    x = Tensor(want.copy()).contiguous().realize()
    writes: list[tuple[Any, np.ndarray]] = [
        ((slice(1, 3),), np.ones((2, 5), dtype=np.float32)),
        ((1, slice(2, 4)), np.array([7.0, 8.0], dtype=np.float32)),
        ((slice(None, None, 2), 0), np.array([5.0, 6.0], dtype=np.float32)),
        ((Ellipsis, -1), np.arange(4, dtype=np.float32)),
    ]
    for index, value in writes:
        x[index].assign(Tensor(value))  # not realized: reading x runs it
        want[index] = value
        np.testing.assert_array_equal(x.numpy(), want)


def test_setitem_matches_numpy_for_mixed_indexes() -> None:
    want = np.arange(20, dtype=np.int32).reshape(4, 5)
    t = Tensor(want.copy())
    for index, value in [((slice(None), [1, 3]), -1), (([0, 2], slice(1, 3)), 9), ((slice(1, 3), 4), [70, 80])]:
        t[index] = value
        want[index] = value
    np.testing.assert_array_equal(t.numpy(), want)
