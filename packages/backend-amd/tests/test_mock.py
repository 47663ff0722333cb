"""`xgrad_amd.mock.MockHIP`, the MOCKGPU stand-in for libamdhip64: memory and copies on the emulator's memory, module
loading by target, and what a launch hands the emulator (here a recorder in place of `xgrad_amd.emulate.launch`): the
explicit argument bytes at the offsets clang's metadata gives, hidden arguments filled, the grid and block as given."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from xgrad_amd import mock
from xgrad_amd.compiler import HIPCompiler, toolchain_problem
from xgrad_amd.driver import HIPError
from xgrad_codegen.devmem import MemoryFaultError

_problem = toolchain_problem()

KERNEL = r"""
extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(1, 64)))
void scale(float* __restrict__ data0, const float* __restrict__ data1, const int n, const int m) {
  const int i = __builtin_amdgcn_workgroup_id_x() * 64 + __builtin_amdgcn_workitem_id_x();
  if (i < n) data0[i] = data1[i] * m;
}
"""


def test_memory_copies_round_trip_and_faults_name_the_address() -> None:
    hip = mock.MockHIP()
    assert (hip.device_count(), hip.device_arch(0)) == (1, "gfx1100")
    a, b = hip.malloc(64), hip.malloc(64)
    data = np.arange(16, dtype=np.float32)
    hip.memcpy_htod(a, memoryview(data.tobytes()))
    hip.memcpy_dtod(b, a, 64)
    out = np.zeros(16, np.float32)
    hip.memcpy_dtoh(memoryview(out.data), b)
    np.testing.assert_array_equal(out, data)
    hip.free(a)
    with pytest.raises(MemoryFaultError, match=f"{a:#x}"):
        hip.memcpy_dtoh(memoryview(out.data), a)
    with pytest.raises(HIPError, match="invalid device ordinal 1"):
        hip.set_device(1)


@pytest.mark.skipif(_problem is not None, reason=_problem or "")
def test_module_load_accepts_only_gfx1100_code_objects() -> None:
    hip = mock.MockHIP()
    module = hip.module_load(HIPCompiler("gfx1100").compile(KERNEL))
    assert hip.module_function(module, "scale").name == "scale"
    with pytest.raises(HIPError, match="no kernel 'nope'"):
        hip.module_function(module, "nope")
    with pytest.raises(HIPError, match="no kernel image for gfx1100"):
        hip.module_load(HIPCompiler("gfx942").compile(KERNEL))


@pytest.mark.skipif(_problem is not None, reason=_problem or "")
def test_launch_hands_the_emulator_the_full_kernarg_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(mock, "emulate", SimpleNamespace(launch=lambda co, name, **kw: calls.append(kw)))
    hip = mock.MockHIP()
    fn = hip.module_function(hip.module_load(HIPCompiler("gfx1100").compile(KERNEL)), "scale")
    kernel = fn.module.kernels["scale"]
    explicit = struct.pack("<QQii", 0x1000, 0x2000, 100, 3)
    hip.launch(fn, (2, 1, 1), (64, 1, 1), 0, explicit)
    (call,) = calls
    assert call["grid"] == (2, 1, 1) and call["block"] == (64, 1, 1) and call["mem"] is hip.mem
    full = call["kernarg"]
    assert len(full) == kernel.kernarg_size >= len(explicit)
    offsets = [off for off, _, kind in kernel.args if not kind.startswith("hidden_")]
    assert offsets == [0, 8, 16, 20]  # clang's layout is the one xgrad_amd.device packs
    assert full[: len(explicit)] == explicit
    with pytest.raises(Exception, match="explicit ones need 24"):
        hip.launch(fn, (1, 1, 1), (64, 1, 1), 0, explicit[:16])
    assert hip.launches == 1
