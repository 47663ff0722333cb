"""Shapes beyond the int32 kernel index math (issue 22): a dimension, an element count or an index through views
above 2**31 - 1 raises ShapeError naming the size and the limit, before anything compiles or is allocated. The
CPU backend rendered such a kernel with `int` indexes (a wrapped, wrong answer: argmax of 3.2e9 elements gave 0);
PYTHON follows the same GPU semantics. Codegen checks each kernel AST as the scheduler made it
(`xgrad_codegen.limits`, the first pass of the pipeline). Ops whose own int32 result cannot hold the size refuse
earlier, while the graph is built, naming the size and the limit too: an int32 arange (ArangeRangeError, an
OverflowError as tinygrad's) and argmax/argmin (ShapeError)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from xgrad import Device, Tensor, dtypes
from xgrad.engine.schedule import create_schedule
from xgrad.errors import ShapeError
from xgrad.mixin.creation import ArangeRangeError
from xgrad_codegen.limits import MAX_INDEX, check_index_bounds
from xgrad_codegen.pipeline import before_optimize

LIMIT = "2,147,483,647"
DEVICES = ["CPU", "PYTHON"]

BIG: dict[str, tuple[Callable[[str], Tensor], str]] = {
    # a dimension above the limit, reduced to one number
    "sum of a long expand": (
        lambda d: Tensor([1], dtype=dtypes.int8, device=d).expand(2**31 + 8).sum(dtype=dtypes.int64),
        "2,147,483,656",
    ),
    # an element count above the limit through a flatten of small dimensions (max walks it as one axis)
    "max of a flattened expand": (
        lambda d: (
            Tensor(np.array([1.0, 2.0, 3.0], np.float32), device=d).reshape(1, 3).expand(2**30 + 1, 3).flatten().max()
        ),
        "3,221,225,475",
    ),
    # a buffer with more elements than the limit (never allocated: the check runs first)
    "a big buffer": (lambda d: Tensor.zeros(2**31 + 1, dtype=dtypes.int8, device=d).contiguous(), "2,147,483,649"),
    # an index beyond the limit although the result is small (int64 values: int32 ones would not fit, see below)
    "the end of a long arange": (
        lambda d: Tensor.arange(2**31 + 8, device=d, dtype=dtypes.int64)[-1:],
        "2,147,483,655",
    ),
    "a 2-d output of too many elements": (
        lambda d: Tensor.ones(2**16, 1, device=d).expand(2**16, 2**15 + 1).contiguous(),
        "2,147,516,415",  # its largest index
    ),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(BIG))
def test_index_beyond_int32_raises_shape_error_naming_size_and_limit(device: str, case: str) -> None:
    if device not in Device.get_available_devices():
        pytest.skip(f"{device} is not available here")
    build, size = BIG[case]
    with pytest.raises(ShapeError) as e:
        build(device).realize()
    message = str(e.value)
    assert size in message and LIMIT in message and "int32" in message


# refused before codegen, by the op that cannot give its result: (build, error type, what the message names)
EARLY: dict[str, tuple[Callable[[str], Tensor], type[Exception], tuple[str, ...]]] = {
    # the default int dtype (int32) cannot hold the values: creation refuses (tinygrad's OverflowError)
    "a long int32 arange": (
        lambda d: Tensor.arange(2**31 + 8, device=d),
        ArangeRangeError,
        ("2,147,483,656 values", "2,147,483,655", LIMIT, "int32", "int64"),
    ),
    # argmax returns an int32 index, which cannot count past the limit
    "argmax of a flattened expand": (
        lambda d: (
            Tensor(np.array([1.0, 2.0, 3.0], np.float32), device=d)
            .reshape(1, 3)
            .expand(2**30 + 1, 3)
            .flatten()
            .argmax()
        ),
        ShapeError,
        ("3,221,225,475", LIMIT, "int32"),
    ),
    "argmin along a long axis": (
        lambda d: Tensor([1, 2], dtype=dtypes.int8, device=d).reshape(2, 1).expand(2, 2**31).argmin(1),
        ShapeError,
        ("2,147,483,648", LIMIT, "int32"),
    ),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(EARLY))
def test_an_op_whose_int32_result_cannot_hold_the_size_raises_naming_size_and_limit(device: str, case: str) -> None:
    if device not in Device.get_available_devices():
        pytest.skip(f"{device} is not available here")
    build, error, names = EARLY[case]
    with pytest.raises(error) as e:
        build(device)  # refused while the graph is built: nothing is scheduled
    message = str(e.value)
    assert all(name in message for name in names), message


def _check(t: Tensor) -> None:
    for item in create_schedule([t.uop])[0]:
        if not item.is_copy:
            check_index_bounds(before_optimize(item.ast))


def test_the_check_is_at_the_limit_not_below() -> None:
    """A dimension, an element count and an index of exactly 2**31 - 1 pass (checked, not run: on PYTHON that
    would take hours); one more is refused."""
    _check(Tensor([1], dtype=dtypes.int8, device="CPU").expand(MAX_INDEX).sum(dtype=dtypes.int64))
    _check(
        Tensor(np.arange(3, dtype=np.float32), device="CPU").reshape(1, 3).expand(MAX_INDEX // 3, 3).flatten().argmax()
    )
    _check(Tensor.arange(MAX_INDEX + 1, device="CPU", dtype=dtypes.int64)[-1:].contiguous())  # last index MAX_INDEX
    with pytest.raises(ShapeError, match="2,147,483,648"):
        _check(Tensor.arange(MAX_INDEX + 2, device="CPU", dtype=dtypes.int64)[-1:].contiguous())


@pytest.mark.parametrize("device", DEVICES)
def test_large_work_within_the_limit_still_matches_numpy(device: str) -> None:
    if device not in Device.get_available_devices():
        pytest.skip(f"{device} is not available here")
    a = np.array([1.0, -2.0, 3.0], np.float32)
    x = Tensor(a, device=device).reshape(3, 1).expand(3, 2**12).flatten()
    np.testing.assert_equal(x.argmax().item(), np.repeat(a, 2**12).argmax())
