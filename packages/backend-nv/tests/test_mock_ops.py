"""The op conformance subset on the emulated GPU (MOCKGPU=1): every renderer's kernels run on the PTX interpreter
through the NV device and equal numpy; then the core op suite itself (packages/core/tests/test_ops.py) runs in a
child pytest with --xgrad-devices=NV[,NV:PTX], as CI runs it on PYTHON::sm_90, each of its kernels also compiled
to cubin for sm_80, sm_90 and sm_120 (nv_cubin_check.py).

Tensor cores are on: the float16/bfloat16 matmuls go through mma.sync (checked in the rendered source)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from nv_ops import OPS_BY_NAME, op_params

from xgrad import Device
from xgrad.helpers import Context
from xgrad.plugin import module_exists

DEVICES = ["NV:CUDA", *(["NV:PTX"] if module_exists("xgrad_nv.ptx") else [])]
HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]


@pytest.fixture(autouse=True)
def _mock(mockgpu: None) -> None:
    """Every test here runs on the mock GPU (conftest's `mockgpu`)."""


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", op_params())
def test_op_matches_numpy_on_the_emulated_gpu(op: Any, device: str) -> None:
    got = op.build(device).numpy()
    if op.expect is None:  # fp8: compare with the PYTHON reference device instead
        want = op.build("PYTHON").numpy()
    else:
        want = op.expect()
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=op.atol, rtol=op.rtol)


@pytest.mark.parametrize("device", DEVICES)
def test_half_matmuls_run_on_tensor_cores(device: str) -> None:
    for name in ("matmul_f16_tc", "matmul_bf16_tc"):
        test_op_matches_numpy_on_the_emulated_gpu(OPS_BY_NAME[name], device)
    sources = [p.info.src for p in Device[device]._programs.values()]
    assert sum("mma.sync.aligned.m16n8k16" in s for s in sources) >= 2


@pytest.mark.parametrize("device", DEVICES)
def test_core_op_suite_passes_on_the_emulated_gpu(device: str) -> None:
    """packages/core/tests/test_ops.py, the whole file, in a child pytest on the mock GPU; every kernel it builds is
    also compiled to cubin for sm_80, sm_90 and sm_120 (nv_cubin_check). test_reduce.py passes too (134 tests on
    NV and NV:PTX) but its ~500 kernels would add ~10 minutes of NVRTC to CI here."""
    name = device.replace("NV:CUDA", "NV")
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "nv_cubin_check"]
    cmd.append(f"--xgrad-devices={name}")
    res = subprocess.run(
        [*cmd, "packages/core/tests/test_ops.py"],
        cwd=ROOT,
        env={
            **os.environ,
            "MOCKGPU": "1",
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        },
        capture_output=True,
        text=True,
        check=False,
    )
    tail = "\n".join(res.stdout.splitlines()[-30:])
    assert res.returncode == 0, f"test_ops.py on {name} (MOCKGPU=1) failed:\n{tail}\n{res.stderr[-2000:]}"
    assert " passed" in tail
    built = re.search(r"nv_cubin_check: (\d+) kernels compiled to cubin for sm_80, sm_90, sm_120", res.stdout)
    assert built is not None and int(built.group(1)) > 200, tail


def test_beam_keeps_tensor_core_matmuls_correct() -> None:
    """BEAM on a bfloat16 matmul: it once picked TC then LOCAL, which mapped the new thread range ahead of the
    tensor core's lanes, so warps mixed tiles (wrong on PYTHON::sm_90 as on the mock GPU). LOCAL after TC is now
    refused; the search's pick is right."""
    from xgrad import Tensor, dtypes
    from xgrad_codegen.gpu_opt import apply_opts
    from xgrad_codegen.opt import Opt, OptError
    from xgrad_codegen.pipeline import before_optimize

    rng = np.random.default_rng(0)
    a_np, b_np = rng.standard_normal((32, 32), dtype=np.float32), rng.standard_normal((32, 32), dtype=np.float32)
    a = Tensor(a_np, device="NV:CUDA").cast(dtypes.bfloat16).realize()
    b = Tensor(b_np, device="NV:CUDA").cast(dtypes.bfloat16).realize()
    want = a.cast(dtypes.float32).numpy().astype(np.float64) @ b.cast(dtypes.float32).numpy().astype(np.float64)
    # the heuristic's kernel (tensor cores), then BEAM's pick: the mock times candidates by the interpreter's wall
    # time, so which one wins is not fixed; each must be right
    np.testing.assert_allclose(a.matmul(b, dtype=dtypes.float32).numpy(), want, rtol=1e-4, atol=1e-4)
    dev = Device["NV:CUDA"]
    matmuls = [k[0] for k, p in dev._programs.items() if "mma_m16n8k16_bfloat16" in p.info.src]
    assert matmuls
    with Context(BEAM=2, IGNORE_BEAM_CACHE=1):
        got = a.matmul(b, dtype=dtypes.float32).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(OptError, match="LOCAL after TC"):
        apply_opts(before_optimize(matmuls[-1]), [Opt("TC", 1), Opt("LOCAL", 1, 4)], dev.renderer)
