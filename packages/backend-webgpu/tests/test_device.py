"""Real runs on the adapter (lavapipe in CI): packed narrow dtypes, large dispatches, variables, errors."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad.device import Device
from xgrad.dtype import dtypes
from xgrad.errors import CompileError, DeviceError
from xgrad.tensor import Tensor


def test_elementwise_and_reduce_match_numpy(webgpu: str) -> None:
    x = np.random.default_rng(0).normal(size=(5, 33)).astype(np.float32)
    t = Tensor(x, device=webgpu)
    np.testing.assert_allclose(((t * 2).exp().sum(1)).numpy(), np.exp(x * 2).sum(1), rtol=1e-5)
    np.testing.assert_allclose((t @ t.permute(1, 0)).numpy(), x @ x.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.bool])
def test_packed_lanes_keep_their_neighbours(webgpu: str, dtype: object) -> None:
    # 13 elements: the last word is partly used; every invocation writes one lane of a shared word
    a = np.arange(13) % 7 - (0 if dtype in (dtypes.uint8, dtypes.uint16, dtypes.bool) else 3)
    t = Tensor(a.tolist(), device=webgpu, dtype=dtype)  # type: ignore[arg-type]
    np_dt = t.numpy().dtype
    want = a.astype(np_dt)
    np.testing.assert_array_equal(t.numpy(), want)
    if dtype == dtypes.bool:
        np.testing.assert_array_equal((t != True).numpy(), ~want)  # noqa: E712
    else:
        np.testing.assert_array_equal((t * 37 + 1).numpy(), (want * np_dt.type(37) + np_dt.type(1)).astype(np_dt))
        np.testing.assert_array_equal(t.flip(0).numpy(), want[::-1])


def test_launch_larger_than_one_dispatch_dimension(webgpu: str) -> None:
    n = 65535 * 64 + 130  # more workgroups than one dimension allows: spills into y
    t = Tensor.arange(n, device=webgpu) + 1
    out = t.numpy()
    assert out[0] == 1 and out[-1] == n and int(out[65535 * 64]) == 65535 * 64 + 1


def test_empty_and_scalar_kernels(webgpu: str) -> None:
    assert (Tensor.zeros(0, device=webgpu) + 1).tolist() == []
    assert (Tensor(2.5, device=webgpu) * 2).item() == 5.0


def test_rejected_shader_raises_compile_error_with_source_and_log(webgpu: str) -> None:
    dev = Device[webgpu]
    with pytest.raises(CompileError, match="rejected kernel broken") as info:
        dev.build("broken", [], "fn main( {")
    assert info.value.source == "fn main( {"
    assert "error" in info.value.log.lower()


def test_unaligned_views_are_refused(webgpu: str) -> None:
    alloc = Device[webgpu].allocator
    base = alloc.alloc(256)
    assert alloc.offset(base, 0, 16).offset == 0
    with pytest.raises(DeviceError, match="multiples of"):
        alloc.offset(base, 4, 16)


def test_copies_of_odd_sizes_round_trip(webgpu: str) -> None:
    alloc = Device[webgpu].allocator
    buf = alloc.alloc(7)
    alloc.copyin(buf, memoryview(b"abcdefg"))
    out = bytearray(7)
    alloc.copyout(memoryview(out), buf)
    assert bytes(out) == b"abcdefg"
