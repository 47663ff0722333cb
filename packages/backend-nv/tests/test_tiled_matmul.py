"""Tensor-core matmuls tiled through shared memory (xgrad_codegen.tc_tile) on the NV backend: the kernels NVRTC and
ptxas build run on the PTX interpreter (MOCKGPU=1) and equal numpy; the SASS of the bfloat16 4096^3 kernel for sm_90
has HMMA, shared loads and stores, no spills, and far fewer global loads per HMMA than the untiled tensor cores."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from xgrad import Device, Tensor, dtypes
from xgrad.helpers import Context
from xgrad.plugin import module_exists
from xgrad.uop.ops import UOp
from xgrad_codegen import gpu_opt, tc_tile
from xgrad_codegen.opt import Opt, OptError
from xgrad_codegen.pipeline import full_rewrite
from xgrad_nv.compiler import CUDACompiler, PTXCompiler, disassemble, find_tool, ptxas_resources

DEVICES = ["NV:CUDA", *(["NV:PTX"] if module_exists("xgrad_nv.ptx") else [])]
RENDERERS = [d.split(":")[1] for d in DEVICES]


def checked_matmul(device: str, m: int, k: int, n: int, dtype: Any, seed: int) -> tuple[UOp, Any]:
    """A random (m x k) @ (k x n) in `dtype` with float32 results on `device` (disk caches off), checked against numpy
    in float64; the matmul kernel's AST and program."""
    rng = np.random.default_rng(seed)
    with Context(CACHELEVEL=0):
        a = Tensor(rng.standard_normal((m, k), dtype=np.float32), device=device).cast(dtype).realize()
        b = Tensor(rng.standard_normal((k, n), dtype=np.float32), device=device).cast(dtype).realize()
        want = a.cast(dtypes.float32).numpy().astype(np.float64) @ b.cast(dtypes.float32).numpy().astype(np.float64)
        got = a.matmul(b, dtype=dtypes.float32).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    return next((key[0], p) for key, p in Device[device]._programs.items() if p.info.name.startswith("r_"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,k,n", [(128, 64, 128), (100, 72, 136)])
def test_tiled_matmul_runs_on_the_ptx_interpreter(mockgpu: None, monkeypatch: pytest.MonkeyPatch, device, m, k, n):
    """128 x 64 x 128 bfloat16 with the heuristic's largest tile (MIN_BLOCKS lowered so one block is enough): 8 warps
    of 4 x 4 fragments, two k-slices of 32 through shared memory; 100 x 72 x 136 padded. NVRTC's PTX (NV:CUDA) and
    the PTX renderer's (NV:PTX) run on the interpreter; both compile to cubin with ptxas too."""
    monkeypatch.setattr(tc_tile, "MIN_BLOCKS", 1)
    ast, prog = checked_matmul(device, m, k, n, dtypes.bfloat16, seed=m + k + n)
    ((opt,),) = [ast_opts(ast, device)]
    shape = tc_tile.TileShape.from_code(opt.amount)
    if (m, k, n) == (128, 64, 128):
        assert shape == tc_tile.TILE_SHAPES[0]
    assert ("__shared__" in prog.info.src or ".shared" in prog.info.src) and "mma.sync.aligned" in prog.info.src
    if find_tool("ptxas") is not None:
        compiler = CUDACompiler("sm_90") if device == "NV:CUDA" else PTXCompiler("sm_90")
        assert compiler.compile(prog.info.src)[:4] == b"\x7fELF"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [dtypes.bfloat16, dtypes.float16])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_pipelined_tiles_copy_asynchronously_on_the_interpreter(
    mockgpu: None, monkeypatch: pytest.MonkeyPatch, device: str, dtype: Any, stages: int
) -> None:
    """Matmuls that are no multiple of the 64 x 32 x 32 tile of 4 warps (m, n and k padded) with 2, 3 and 4 stages of
    cp.async copies: 72 x 120 x 40 (16-byte copies), 72 x 120 x 36 (B's rows of 36 elements: 8-byte copies), 72 x
    118 x 40 (A's rows of 118: 4-byte copies). The kernel has cp.async, commit_group and wait_group (stages - 2),
    and NVRTC's PTX (NV:CUDA) and the PTX renderer's (NV:PTX) equal numpy on the interpreter, which lands a copy only
    when its group is waited for (0xFF bytes before)."""
    shape = tc_tile.TileShape(2, 2, 2, 2, 2, stages)
    force_tile(monkeypatch, device, shape)
    m, k, n = {2: (72, 120, 40), 3: (72, 120, 36), 4: (72, 118, 40)}[stages]
    size = {2: 16, 3: 8, 4: 4}[stages]
    ast, prog = checked_matmul(device, m, k, n, dtype, seed=stages)
    assert ast_opts(ast, device)[0].amount == shape.code
    src = prog.info.src
    assert f"cp.async.{'cg' if size == 16 else 'ca'}.shared.global" in src and "cp.async.commit_group" in src
    assert re.search(rf"cp\.async\.c[ag]\.shared\.global \[[^]]+\], \[[^]]+\], {size}", src)
    assert f"cp.async.wait_group {stages - 2}" in src
    # fragments by ldmatrix: A x4, B (stored k-major) x4 .trans per two fragments
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src and "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in src


def force_tile(monkeypatch: pytest.MonkeyPatch, device: str, shape: tc_tile.TileShape) -> None:
    """The heuristic picks `shape` for every matmul on `device`, whose programs are compiled afresh."""

    def pick(ast: UOp, tc: Any, *limits: int) -> tc_tile.TileShape | None:
        try:
            tc_tile.match_matmul(ast, tc)
        except OptError:
            return None
        return shape

    monkeypatch.setattr(gpu_opt, "pick_tile", pick)
    monkeypatch.setattr(Device[device], "_programs", {})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stages", [3, 4])
def test_deep_pipelines_of_the_large_tile_use_dynamic_shared_memory(
    mockgpu: None, monkeypatch: pytest.MonkeyPatch, device: str, stages: int
) -> None:
    """The 8-warp 128 x 128 x 32 tile with 3 or 4 stages needs 56.8 or 75.8 KB of shared memory, past the 48 KB of
    static arrays: the renderers declare it dynamic (extern), the device allows it (cuFuncSetAttribute, which the
    mock checks at launch) and launches with its size; the bf16 result equals numpy, and ptxas builds the kernel for
    sm_90 without spills."""
    shape = tc_tile.TileShape(2, 4, 4, 4, 2, stages)
    force_tile(monkeypatch, device, shape)
    _, prog = checked_matmul(device, 128, 160, 128, dtypes.bfloat16, seed=stages)
    assert prog.info.extra["shared"] == shape.shared_bytes(Device[device].renderer.tensor_cores[0]) > 48 * 1024
    src = prog.info.src
    assert ("extern __shared__" in src) if device == "NV:CUDA" else (".extern .shared" in src)
    if find_tool("ptxas") is not None:
        ptx = CUDACompiler("sm_90", ptx=True).compile(src).decode() if device == "NV:CUDA" else src
        res = next(iter(ptxas_resources(ptx, "sm_90").values()))
        assert res.spill_stores == 0 and res.spill_loads == 0, res


@pytest.mark.parametrize("device", DEVICES)
def test_an_odd_b_fragment_count_takes_an_x2_matrix_load(
    mockgpu: None, monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    """Warps of 1 x 3 fragments (TC 221322): each k-step reads two B fragments with one ldmatrix .x4.trans and the
    third with an .x2.trans; float16 64 x 160 x 96 equals numpy on the interpreter."""
    force_tile(monkeypatch, device, tc_tile.TileShape(2, 2, 1, 3, 2, 2))
    _, prog = checked_matmul(device, 64, 160, 96, dtypes.float16, seed=5)
    assert "ldmatrix.sync.aligned.m8n8.x2.trans" in prog.info.src and "m8n8.x4.trans" in prog.info.src


def ast_opts(ast: UOp, device: str) -> tuple[Opt, ...]:
    """The opts the heuristic chose for `ast` on `device`."""
    uops = full_rewrite(ast, Device[device].renderer)
    return uops[-1].arg.opts  # type: ignore[no-any-return]


def loop_counts(cubin: bytes) -> dict[str, int]:
    """How many of each SASS opcode (without its modifiers) the loop of `cubin` that holds the HMMAs has: the lines
    from a label to the branch back to it."""
    if find_tool("nvdisasm") is None:
        pytest.skip("nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
    lines = disassemble(cubin).split("\n")
    labels = {line.strip()[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\s*\.L_x_\d+:", line)}
    for i, line in enumerate(lines):
        target = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        body = lines[labels[target.group(1)] : i + 1] if target and labels.get(target.group(1), i) < i else []
        if any("HMMA" in x for x in body):
            ops = [re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", x) for x in body]
            counts: dict[str, int] = {}
            for op in (o.group(1) for o in ops if o):
                counts[op] = counts.get(op, 0) + 1
            return counts
    raise AssertionError("no loop with HMMA in the SASS")


def matmul_ast(device: str, n: int) -> UOp:
    dev = Device[device]
    seen: list[UOp] = []
    orig = dev.compile

    def spy(ast: Any) -> Any:
        seen.append(ast)
        return orig(ast)

    dev.compile = spy  # type: ignore[method-assign]
    try:
        x, y = (
            Tensor.empty(n, n, dtype=dtypes.bfloat16, device=device),
            Tensor.empty(n, n, dtype=dtypes.bfloat16, device=device),
        )
        x.matmul(y, dtype=dtypes.float32).realize()
    finally:
        del dev.compile
    return seen[-1]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("renderer", RENDERERS)
def test_tiled_matmul_sass_reads_each_tile_once(renderer: str, arch: str) -> None:
    """bf16 4096^3 for sm_80 and sm_90: the heuristic's kernel (128 x 128 x 32 blocks of 8 warps, two stages of
    cp.async copies) has in its loop 32 HMMA per k-slice, 12 LDSM, one barrier, no spills (ptxas -v), and copies
    its slices with 16-byte LDGSTS (global -> shared without registers: no LDG, no STS in the loop), 1 per 8 HMMA,
    where the untiled tensor core (tc.py: every warp reads its fragments from global memory) has 12 LDG per HMMA."""
    if find_tool("ptxas") is None:
        pytest.skip("ptxas is not installed (CI has it from the CUDA 13 toolkit)")
    device = f"NULL:{renderer}:{arch}"
    dev = Device[device]
    ast = matmul_ast(device, 4096)
    tc = next(i for i, t in enumerate(dev.renderer.tensor_cores) if t.dtype == dtypes.bfloat16)
    counts = {}
    for name, opts in (("untiled", [Opt("TC", tc, 0)]), ("tiled", None)):
        uops = full_rewrite(ast, dev.renderer, opts)
        src = dev.renderer.render("k", uops)
        cubin = CUDACompiler(arch).compile(src) if renderer == "CUDA" else PTXCompiler(arch).compile(src)
        counts[name] = loop_counts(cubin)
        ptx = CUDACompiler(arch, ptx=True).compile(src).decode() if renderer == "CUDA" else src
        res = ptxas_resources(ptx, arch)["k"]
        assert res.spill_stores == 0 and res.spill_loads == 0, f"{name}: {res}"
        if renderer == "CUDA" and name == "tiled":  # __launch_bounds__(256, 2): two blocks of 8 warps per SM
            assert res.registers <= 128, res
    tiled, untiled = counts["tiled"], counts["untiled"]
    # one k-slice per iteration: 8 warps x (4 x 4 fragments x 2 k-steps); one barrier; fragments by ldmatrix: per
    # k-step 4 A fragments (x4) and 2 pairs of B fragments (x4 .trans), no scalar shared loads and no PRMT to pack
    assert tiled["HMMA"] == 32 and tiled["LDSM"] == 12 and tiled.get("PRMT", 0) == 0 and tiled["BAR"] == 1
    assert tiled.get("LDS", 0) <= 3
    assert tiled.get("LDG", 0) == 0 and tiled.get("STS", 0) == 0 and tiled["LDGSTS"] * 8 == tiled["HMMA"]
    assert untiled["LDG"] / untiled["HMMA"] >= 8
