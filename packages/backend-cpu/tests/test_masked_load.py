"""Gated loads of consecutive lanes (`xgrad_cpu.renderer.merge_gated_loads`): a VECTORIZE of float32 loads, each lane
with its own gate, is printed as one masked vector load, and so is a float32 vector load under one gate (never a
branch to a plain load: see `rule_c_load`); the results match numpy with AVX-512, with AVX and with the portable
fallback (each built by every C compiler installed, as the CPU device builds, warnings as errors), and convolutions
with padding match torch."""

from __future__ import annotations

import ctypes
import platform
import shutil
from typing import Any

import numpy as np
import pytest
import torch

from xgrad import Tensor
from xgrad.dtype import dtypes
from xgrad.helpers import Context, dedup
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad_cpu.compiler import CCompiler
from xgrad_cpu.plugin import COMPILER_CANDIDATES
from xgrad_cpu.program import load_library
from xgrad_cpu.renderer import CRenderer, merge_gated_loads

COMPILERS = dedup([path for cc in COMPILER_CANDIDATES if (path := shutil.which(cc))])
# what the helpers are built for: the host, as the CPU device builds; on x86-64 also the AVX2 baseline (x86-64-v3: an
# AVX-512 host checks what AVX2-only hosts compile, their 16-lane helpers falling back to lane loops) and plain x86-64
# (no AVX: every helper's lane loop)
TARGETS = ["native", *(["x86-64-v3", "x86-64"] if platform.machine() in ("x86_64", "AMD64") else [])]
IDX = dtypes.index


def idx(n: int) -> UOp:
    return UOp.const(IDX, n)


def one_loop_program(store: UOp, r: UOp) -> list[UOp]:
    """The linear program of `store` inside the loop `r`."""
    items: dict[UOp, None] = {}
    for item in (store, UOp(Ops.END, dtypes.void, (r,))):
        for u in item.toposort:
            items.setdefault(u, None)
    return [*items, UOp(Ops.SINK, dtypes.void, ())]


def shifted_window_program(n_in: int, blocks: int, lanes: int) -> list[UOp]:
    """out[8b + k] = in[8b + k - 1] where that is inside `in`, else 0; lane 3 is always off, lane 5 never gated."""
    out, src = UOp(Ops.PARAM, dtypes.float32, (), 0), UOp(Ops.PARAM, dtypes.float32, (), 1)
    r = UOp.range(idx(blocks), 0, AxisType.GLOBAL)
    loads = []
    for k in range(lanes):
        pos = r * idx(lanes) + idx(k - 1)
        gate = idx(-1).lt(pos).logical_and(pos.lt(n_in))
        if k == 3:
            gate = UOp.const(dtypes.bool, False)
        index = UOp(Ops.INDEX, dtypes.float32, (src, pos) if k == 5 else (src, pos, gate))
        loads.append(UOp(Ops.LOAD, dtypes.float32, (index,)))
    value = UOp(Ops.VECTORIZE, dtypes.float32.vec(lanes), tuple(loads))
    dest = UOp(Ops.INDEX, dtypes.float32.vec(lanes), (out, r * idx(lanes)))
    store = UOp(Ops.STORE, dtypes.void, (dest, value))
    return one_loop_program(store, r)


def compile_and_run(src: str, march: str, cc: str, bufs: list[np.ndarray], n: int) -> None:
    """Build `src` as the CPU device does for `-march=<march>` with `cc`, warnings as errors, and run `k` over n."""
    # clang 19's -march=native on some AVX10 Xeons warns that it promotes avx10.1-256 to -512: about the host, not `src`
    quiet = ("-Wno-invalid-feature-combination",) if "clang" in cc else ()
    with Context(CACHELEVEL=0):
        lib = CCompiler(cc, ("-Wall", "-Werror", *quiet), march).compile(src)
    fn: Any = load_library(lib).k
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
    ptrs = (ctypes.c_void_p * len(bufs))(*[b.ctypes.data for b in bufs])
    fn(ptrs, (ctypes.c_int * 1)(0), 0, n)


@pytest.mark.skipif(not COMPILERS, reason="no C compiler (gcc or clang) on PATH")
@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("march", TARGETS)
def test_gated_lanes_load_as_one_masked_vector_matching_numpy(lanes: int, march: str) -> None:
    n_in, blocks = 4 * lanes - 3, 4  # the last block reads past the end of `in`; the first reads before its start
    src_text = CRenderer().render("k", shifted_window_program(n_in, blocks, lanes))
    assert f"mload_float{lanes}(" in src_text
    data = np.random.default_rng(0).uniform(-1, 1, n_in).astype(np.float32)
    padded = np.concatenate([[0.0], data, np.zeros(lanes * blocks, np.float32)]).astype(np.float32)
    want = padded[: lanes * blocks].copy()
    want[3::lanes] = 0.0
    for cc in COMPILERS:
        out = np.full(lanes * blocks, np.nan, np.float32)
        compile_and_run(src_text, march, cc, [out, data], blocks)
        np.testing.assert_array_equal(out, want)


def whole_vector_gated_program(blocks: int, lanes: int) -> list[UOp]:
    """out[b] = in[b] (a vector of `lanes`) for the blocks before the last; the last block's gate is off."""
    out, src = UOp(Ops.PARAM, dtypes.float32, (), 0), UOp(Ops.PARAM, dtypes.float32, (), 1)
    r = UOp.range(idx(blocks), 0, AxisType.GLOBAL)
    vec = dtypes.float32.vec(lanes)
    load = UOp(Ops.LOAD, vec, (UOp(Ops.INDEX, vec, (src, r * idx(lanes), r.lt(blocks - 1))),))
    store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, vec, (out, r * idx(lanes))), load))
    return one_loop_program(store, r)


@pytest.mark.skipif(not COMPILERS, reason="no C compiler (gcc or clang) on PATH")
@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("march", TARGETS)
def test_a_vector_load_under_one_gate_is_masked_without_a_branch(lanes: int, march: str) -> None:
    blocks = 3
    src_text = CRenderer().render("k", whole_vector_gated_program(blocks, lanes))
    body = src_text[src_text.index("void k(") :]
    assert f"mload_float{lanes}(" in body and "?" not in body
    data = np.random.default_rng(0).uniform(-1, 1, lanes * (blocks - 1)).astype(np.float32)  # no last block at all
    want = np.concatenate([data, np.zeros(lanes, np.float32)])
    for cc in COMPILERS:
        out = np.full(lanes * blocks, np.nan, np.float32)
        compile_and_run(src_text, march, cc, [out, data], blocks)
        np.testing.assert_array_equal(out, want)


def test_lanes_that_are_not_consecutive_stay_scalar() -> None:
    src = UOp(Ops.PARAM, dtypes.float32, (), 1)
    r = UOp.range(idx(4), 0, AxisType.GLOBAL)
    gate = r.lt(3)
    loads = [
        UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, dtypes.float32, (src, r * idx(8) + idx(2 * k), gate)),))
        for k in range(8)
    ]
    assert merge_gated_loads(UOp(Ops.VECTORIZE, dtypes.float32.vec(8), tuple(loads))) is None


@pytest.mark.parametrize("shape,kernel", [((2, 3, 6, 16), (4, 3, 3, 3)), ((1, 2, 5, 12), (3, 2, 3, 3))])
def test_conv2d_with_padding_matches_torch_on_cpu(shape: tuple[int, ...], kernel: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    x, w = rng.uniform(-1, 1, shape).astype(np.float32), rng.uniform(-1, 1, kernel).astype(np.float32)
    got = Tensor(x, device="CPU").conv2d(Tensor(w, device="CPU"), padding=1).numpy()
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv2d_reading_a_large_buffer_from_its_first_element_matches_torch_on_cpu() -> None:
    # 256 KiB of input: the CPU allocator maps it on its own pages, so the padding lanes of the first window point
    # before the mapping (a masked-off lane must not be read)
    x = np.random.default_rng(2).uniform(-1, 1, (1, 1, 256, 256)).astype(np.float32)
    w = np.random.default_rng(3).uniform(-1, 1, (2, 1, 3, 3)).astype(np.float32)
    got = Tensor(x, device="CPU").conv2d(Tensor(w, device="CPU"), padding=1).numpy()
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def lane_gated_store_program(blocks: int, lanes: int, n_valid: int, dtype: Any) -> list[UOp]:
    """out[b*lanes + k] = in[b*lanes + k] where b*lanes + k < n_valid: one vector store under a bool vector gate (a
    padded row's last vector, as codegen's vectorize groups it for renderers with `masked_stores`)."""
    out, src = UOp(Ops.PARAM, dtype, (), 0), UOp(Ops.PARAM, dtype, (), 1)
    r = UOp.range(idx(blocks), 0, AxisType.GLOBAL)
    vec = dtype.vec(lanes)
    gates = tuple((r * idx(lanes) + idx(k)).lt(n_valid) for k in range(lanes))
    load = UOp(Ops.LOAD, vec, (UOp(Ops.INDEX, vec, (src, r * idx(lanes))),))
    dest = UOp(Ops.INDEX, vec, (out, r * idx(lanes), UOp(Ops.VECTORIZE, dtypes.bool.vec(lanes), gates)))
    return one_loop_program(UOp(Ops.STORE, dtypes.void, (dest, load)), r)


@pytest.mark.skipif(not COMPILERS, reason="no C compiler (gcc or clang) on PATH")
@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32], ids=["float32", "int32"])
@pytest.mark.parametrize("march", TARGETS)
def test_a_vector_store_under_lane_gates_writes_only_the_set_lanes(lanes: int, dtype: Any, march: str) -> None:
    blocks, n_valid = 3, 3 * lanes - lanes // 2 - 1  # the last block writes its first half but one
    src_text = CRenderer().render("k", lane_gated_store_program(blocks, lanes, n_valid, dtype))
    assert f"mstore_{'float' if dtype == dtypes.float32 else 'int'}{lanes}(" in src_text
    np_dt = np.float32 if dtype == dtypes.float32 else np.int32
    data = np.arange(1, blocks * lanes + 1).astype(np_dt)
    for cc in COMPILERS:
        out = np.full(blocks * lanes, -7, np_dt)
        compile_and_run(src_text, march, cc, [out, data], blocks)
        np.testing.assert_array_equal(out, np.where(np.arange(blocks * lanes) < n_valid, data, -7))
