"""Host data as graph nodes: nested Python lists and numpy arrays in, a BUFFER UOp (reshaped to the data's shape, its
bytes copied in) out. Tensor's constructor and a constant given a buffer of its own (`requires_grad`) use it."""

from __future__ import annotations

from typing import Any

import numpy as np

from xgrad.device import multi_devices
from xgrad.dtype import DType, dtypes, float_to_bf16_bits, float_to_fp8_bits, from_np_dtype, to_np_dtype
from xgrad.engine.schedule import buffer_of, new_buffer_uop
from xgrad.errors import DTypeError, ShapeError
from xgrad.uop.ops import Ops, UOp


def list_to_np(data: list[Any] | tuple[Any, ...], dtype: DType | None) -> tuple[np.ndarray, DType]:
    """Nested Python lists as a numpy array and the dtype it stands for (`dtype`, default: what the values need); a
    ragged nesting is a ShapeError, an int too big for the dtype a DTypeError."""
    inferred = dtype or dtypes.from_py(data)
    try:
        return np.array(data, dtype=np_for_py(inferred)), inferred
    except OverflowError:
        raise DTypeError(
            f"a Python int in the data does not fit {inferred.name}; give dtype=dtypes.int64 (or float64) or "
            "smaller values"
        ) from None
    except ValueError as e:
        if "inhomogeneous" not in str(e):
            raise
        raise ShapeError(
            "the nested lists are ragged (rows of one depth have different lengths); pad them to one length"
        ) from None


def np_to_uop(arr: np.ndarray, device: str, dtype: DType | None) -> UOp:
    """A buffer on `device` holding `arr` as `dtype` (default: the array's own), reshaped to the array's shape; a
    multi-device name gives the buffer on its first device copied to all of them."""
    if (devices := multi_devices(device)) is not None:  # several devices: build on the first, replicate from there
        first = np_to_uop(arr, devices[0], dtype)
        return UOp(Ops.COPY, first.dtype, (first, UOp(Ops.DEVICE, arg=device)))
    src_dtype = from_np_dtype(arr.dtype)
    target = dtype or src_dtype
    raw: np.ndarray
    if target == dtypes.bfloat16:
        raw = float_to_bf16_bits(arr.astype(np.float32))
    elif dtypes.is_fp8(target):
        raw = float_to_fp8_bits(arr.astype(np.float32), target)
    else:
        np_dt = to_np_dtype(target)
        assert np_dt is not None
        raw = arr.astype(np_dt)
    raw = np.ascontiguousarray(raw)
    buf = new_buffer_uop(device, int(raw.size), target)
    if raw.size:
        buffer_of(buf).copyin(memoryview(raw.reshape(-1).view(np.uint8)))  # type: ignore[arg-type]
    return buf.reshape(tuple(int(s) for s in arr.shape))


def np_for_py(d: DType) -> Any:
    """The numpy dtype that holds values of `d` (float32 for the types numpy lacks: bfloat16, fp8)."""
    np_dt = to_np_dtype(d)
    return np_dt if np_dt is not None else np.float32
