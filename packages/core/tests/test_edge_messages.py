"""Bad creation inputs raise a typed error that names the problem (issue 22's edge messages); inputs numpy accepts
in another form (big-endian arrays, numpy integer sizes) give numpy's values."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Tensor
from xgrad.dtype import dtypes, from_np_dtype
from xgrad.errors import DeviceError, DTypeError, OutOfMemoryError, ShapeError, XgradError
from xgrad.helpers import GlobalCounters


@pytest.mark.parametrize("make", [Tensor.ones, Tensor.zeros, Tensor.empty, Tensor.rand, lambda *s: Tensor.full(s, 1)])
@pytest.mark.parametrize("shape", [(2.5,), (2, 3.0), ("3",)])
def test_a_non_integer_size_is_a_shape_error(make: object, shape: tuple[object, ...]) -> None:
    with pytest.raises(ShapeError, match="sizes must be integers"):
        make(*shape)  # type: ignore[operator]


def test_numpy_integer_sizes_are_sizes() -> None:
    assert Tensor.ones(np.int64(3), np.int32(2)).shape == (3, 2)


@pytest.mark.parametrize("data", [[[1, 2], [3]], [[1.0], [2.0, 3.0]], [[[1], [2]], [[3]]]])
def test_ragged_lists_are_a_shape_error(data: list[object]) -> None:
    with pytest.raises(ShapeError, match="ragged"):
        Tensor(data)


@pytest.mark.parametrize("data,dtype", [([2**70], None), ([1, -(2**63) - 1], dtypes.int64), ([300], dtypes.uint8)])
def test_a_python_int_that_does_not_fit_is_a_dtype_error(data: list[int], dtype: object) -> None:
    with pytest.raises(DTypeError, match="does not fit"):
        Tensor(data, dtype=dtype)  # type: ignore[arg-type]


@pytest.mark.parametrize("np_dtype", [">i4", ">f8", ">u2", ">f4", ">i8"])
def test_big_endian_arrays_give_their_values(np_dtype: str) -> None:
    arr = np.array([[1, -2, 3], [4, 5, 250]]).astype(np_dtype)
    got = Tensor(arr)
    np.testing.assert_array_equal(got.numpy(), arr.astype(arr.dtype.newbyteorder("=")))
    assert got.dtype == from_np_dtype(np.dtype(np_dtype).newbyteorder("="))


def test_an_allocation_the_device_cannot_make_is_out_of_memory_and_changes_nothing() -> None:
    # Tensor.empty needs no kernel (so no index math): its 4 TiB buffer is allocated when first read
    used = GlobalCounters.mem_used
    t = Tensor.empty(2**40)
    with pytest.raises(OutOfMemoryError, match=r"could not allocate 4,398,046,511,104 bytes") as info:
        t.numpy()
    assert isinstance(info.value, (DeviceError, MemoryError, XgradError))
    assert GlobalCounters.mem_used == used
    assert t.shape == (2**40,) and not t.uop.base.buffer.is_allocated  # nothing half-made is kept
    np.testing.assert_array_equal(Tensor.ones(4).numpy(), np.ones(4, np.float32))  # the device still works


def test_a_kernel_over_more_elements_than_int32_indexes_is_a_shape_error_before_any_allocation() -> None:
    # the same size computed by a kernel is refused at compile time, before its output is allocated
    used = GlobalCounters.mem_used
    with pytest.raises(ShapeError, match=r"1,099,511,627,776.*2,147,483,647 \(2\*\*31 - 1\)"):
        Tensor.zeros(2**40).realize()
    assert GlobalCounters.mem_used == used
    np.testing.assert_array_equal(Tensor.ones(4).numpy(), np.ones(4, np.float32))
