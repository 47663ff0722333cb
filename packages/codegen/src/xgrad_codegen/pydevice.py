"""The PYTHON device: host memory in `bytearray`s and the reference interpreter (`xgrad_codegen.pyexec`) as its
"compiler". It is slow; it exists to define what every op means and to check the other backends against.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xgrad.device import parse_device
from xgrad.dtype import dtypes
from xgrad.errors import DeviceError
from xgrad.uop.ops import AxisType, GroupOp, Ops, UOp
from xgrad_codegen.device import CompiledDevice
from xgrad_codegen.pyexec import ProgramError, run_program
from xgrad_codegen.pygpu import is_gpu_program, run_gpu_program
from xgrad_codegen.renderer import Renderer, TensorCore


class PythonAllocator:
    """Buffers are `memoryview`s (format 'B') of `bytearray`s; an offset view is a slice sharing the memory, so it
    keeps its base alive without bookkeeping. `free` only drops the reference: Python reclaims the memory."""

    def alloc(self, nbytes: int) -> memoryview:
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes: {nbytes}")
        return memoryview(bytearray(nbytes))

    def free(self, handle: memoryview, nbytes: int) -> None:
        assert nbytes == handle.nbytes, f"free of {nbytes} bytes but the buffer has {handle.nbytes}"

    def copyin(self, dest: memoryview, src: memoryview) -> None:
        src = _as_bytes(src)
        if src.nbytes != dest.nbytes:
            raise ValueError(f"copyin of {src.nbytes} bytes into a buffer of {dest.nbytes} bytes")
        dest[:] = src

    def copyout(self, dest: memoryview, src: memoryview) -> None:
        dest = _as_bytes(dest)
        if dest.nbytes != src.nbytes:
            raise ValueError(f"copyout of a buffer of {src.nbytes} bytes into {dest.nbytes} bytes")
        dest[:] = src

    def offset(self, handle: memoryview, offset: int, nbytes: int) -> memoryview:
        if offset < 0 or nbytes < 0 or offset + nbytes > handle.nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) is outside a buffer of {handle.nbytes} bytes")
        return handle[offset : offset + nbytes]

    def as_memoryview(self, handle: memoryview) -> memoryview:
        return handle[:]


def _as_bytes(mv: memoryview) -> memoryview:
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


ROW, COL = 0, 1


def _bits(*pairs: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    return tuple(pairs)


# NVIDIA sm_80+ mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"): with g = lane >> 2 and t = lane % 4,
# A's a0..a7 sit at row g (+8 for a2,a3,a6,a7), column 2t + (i & 1) (+8 for a4..a7); B's b0..b3 at row 2t + (i & 1)
# (+8 for b2,b3), column g; C/D's c0..c3 at row g (+8 for c2,c3), column 2t + (i & 1).
_NV_A = (_bits((COL, 2), (COL, 4), (ROW, 1), (ROW, 2), (ROW, 4)), _bits((COL, 1), (ROW, 8), (COL, 8)))
_NV_B = (_bits((ROW, 2), (ROW, 4), (COL, 1), (COL, 2), (COL, 4)), _bits((ROW, 1), (ROW, 8)))
_NV_C = (_bits((COL, 2), (COL, 4), (ROW, 1), (ROW, 2), (ROW, 4)), _bits((COL, 1), (ROW, 8)))
# AMD RDNA3 v_wmma_f32_16x16x16_f16 (wave32): lane l holds row l % 16 of A (all 16 k) and column l % 16 of B, lanes
# 16-31 a copy of lanes 0-15; D's 8 floats of lane l are rows 2i + l // 16 of column l % 16.
_RDNA3_A = (_bits((ROW, 1), (ROW, 2), (ROW, 4), (ROW, 8), (ROW, 0)), _bits((COL, 1), (COL, 2), (COL, 4), (COL, 8)))
_RDNA3_B = (_bits((COL, 1), (COL, 2), (COL, 4), (COL, 8), (COL, 0)), _bits((ROW, 1), (ROW, 2), (ROW, 4), (ROW, 8)))
_RDNA3_C = (_bits((COL, 1), (COL, 2), (COL, 4), (COL, 8), (ROW, 1)), _bits((ROW, 2), (ROW, 4), (ROW, 8)))
# AMD CDNA3 v_mfma_f32_16x16x16_f16 (wave64): lane l holds A[l % 16][4 (l // 16) + i], B[4 (l // 16) + i][l % 16]
# and D[4 (l // 16) + i][l % 16], i = 0..3.
_CDNA3_A = (_bits((ROW, 1), (ROW, 2), (ROW, 4), (ROW, 8), (COL, 4), (COL, 8)), _bits((COL, 1), (COL, 2)))
_CDNA3_B = (_bits((COL, 1), (COL, 2), (COL, 4), (COL, 8), (ROW, 4), (ROW, 8)), _bits((ROW, 1), (ROW, 2)))
_CDNA3_C = _CDNA3_B


def _tcs(name: str, dims: tuple[int, int, int], threads: int, layouts: tuple[Any, Any, Any]) -> tuple[TensorCore, ...]:
    """The f16 and bf16 (float32 accumulator) forms of one matrix instruction."""
    return tuple(
        TensorCore(f"{name}_{d.name}", dims, d, dtypes.float32, threads, *layouts)
        for d in (dtypes.float16, dtypes.bfloat16)
    )


TENSOR_CORES: dict[str, tuple[TensorCore, ...]] = {
    "sm_90": _tcs("mma_m16n8k16", (16, 8, 16), 32, (_NV_A, _NV_B, _NV_C)),
    "gfx1100": _tcs("wmma_16x16x16", (16, 16, 16), 32, (_RDNA3_A, _RDNA3_B, _RDNA3_C)),
    "gfx942": _tcs("mfma_16x16x16", (16, 16, 16), 64, (_CDNA3_A, _CDNA3_B, _CDNA3_C)),
}


@dataclass(frozen=True)
class GPUArch:
    """The launch limits of a GPU architecture, as its vendor documents them (what `DEV=PYTHON::<arch>` emulates)."""

    global_max: tuple[int, int, int]  # workgroups per grid dimension
    local_max: tuple[int, int, int]  # threads per workgroup dimension
    max_threads: int  # threads per workgroup
    shared_max: int  # bytes of shared memory per workgroup (static allocation)
    async_copy_bytes: int = 0  # asynchronous global -> shared copies (NVIDIA's cp.async, sm_80+: 16 bytes)
    matrix_loads: bool = False  # warp-wide loads of 8 x 8 matrices from shared memory (NVIDIA's ldmatrix, sm_75+)


# CUDA: grid x up to 2**31-1, y/z 65535, blocks of 1024 threads (z at most 64), 48 KiB static shared memory per block.
# HIP (RDNA3 gfx1100, CDNA3 gfx942): the same grid and block limits, 64 KiB of LDS per workgroup.
GPU_ARCHS: dict[str, GPUArch] = {
    "sm_90": GPUArch((2**31 - 1, 65535, 65535), (1024, 1024, 64), 1024, 48 * 1024, 16, True),
    "gfx1100": GPUArch((2**31 - 1, 65535, 65535), (1024, 1024, 1024), 1024, 64 * 1024),
    "gfx942": GPUArch((2**31 - 1, 65535, 65535), (1024, 1024, 1024), 1024, 64 * 1024),
}


class PythonRenderer(Renderer):
    """The reference executor runs linear programs directly: every op and dtype is native, nothing is decomposed.
    `render` prints the program as text (what DEBUG=4 shows). With a GPU `arch` (a key of GPU_ARCHS) it declares that
    GPU's workgroups and shared memory, and codegen lowers kernels as for that GPU."""

    device = "PYTHON"
    name = "PYTHON"
    supported_ops = frozenset(GroupOp.ALU - {Ops.POW}) | {Ops.CAST, Ops.BITCAST}
    native_dtypes = frozenset(dtypes.all)

    def __init__(self, arch: str | None = None) -> None:
        self.arch = arch
        if arch is None:
            return
        if (gpu := GPU_ARCHS.get(arch)) is None:
            raise DeviceError(f"PYTHON has no GPU arch {arch!r}; use one of {sorted(GPU_ARCHS)} (DEV=PYTHON::sm_90)")
        self.has_local = self.has_shared = True
        self.global_max, self.local_max = gpu.global_max, gpu.local_max
        self.max_threads, self.shared_max = gpu.max_threads, gpu.shared_max
        self.tensor_cores = TENSOR_CORES[arch]
        self.aligned_vector_bytes = 16  # as the GPUs' 128-bit loads (the executor reads vectors at any alignment)
        self.async_copy_bytes = gpu.async_copy_bytes
        self.matrix_loads = gpu.matrix_loads

    def render(self, name: str, uops: list[UOp]) -> str:
        ids = {u: i for i, u in enumerate(uops)}
        lines = [
            f"{i:4d} {u.op.name:12s} {u.dtype.name:10s} {[ids[s] for s in u.src]} {u.arg!r}" for i, u in enumerate(uops)
        ]
        return f"# {name}\n" + "\n".join(lines)


class PythonDevice(CompiledDevice):
    """The `PYTHON` device: the codegen pipeline's linear programs run in the pure-Python reference executor."""

    def __init__(self, name: str) -> None:
        super().__init__(name, PythonAllocator(), PythonRenderer(parse_device(name).arch), _NoCompiler(), _no_factory)

    def build(self, name: str, uops: list[UOp], src: str) -> list[UOp]:
        return uops

    def launch(self, raw: Any, bufs: list[Any], info: Any, vals: dict[str, int], wait: bool) -> float | None:
        start = time.perf_counter()
        self.run_linear(raw, bufs, vals)
        return time.perf_counter() - start if wait else None

    def run_linear(
        self,
        uops: Sequence[UOp],
        handles: Sequence[memoryview],
        vals: dict[str, int] | None = None,
        global_size: Sequence[int] | None = None,
    ) -> None:
        """Run a linear program with `handles[i]` as PARAM i. The interpreter runs the program's GLOBAL range
        itself, so `global_size` (launch dimensions, as other devices take them) is only checked when given: its
        product must be the GLOBAL range's size (1 for a program without one)."""
        if is_gpu_program(uops):  # workgroups, shared memory, barriers
            run_gpu_program(uops, handles, vals)
            return
        if global_size is not None:
            _check_global_size(uops, vals or {}, global_size)
        run_program(uops, handles, vals)

    def __repr__(self) -> str:
        return f"<PythonDevice {self.name}>"


class _NoCompiler:
    def compile(self, src: str) -> bytes:
        return src.encode()


def _no_factory(name: str, lib: bytes) -> Any:
    raise AssertionError("PythonDevice.build does not compile")


def _check_global_size(uops: Sequence[UOp], vals: dict[str, int], global_size: Sequence[int]) -> None:
    want = 1
    for n in global_size:
        want *= n
    rng = next((u for u in uops if u.op is Ops.RANGE and u.arg[1] is AxisType.GLOBAL), None)
    end = rng.src[0] if rng is not None else None
    if end is None:
        have = 1
    elif end.op is Ops.CONST:
        have = int(end.arg)
    elif end.op is Ops.DEFINE_VAR and end.arg[0] in vals:
        have = vals[end.arg[0]]
    else:
        return  # a computed size: the interpreter checks the split when it evaluates it
    if have != want:
        raise ProgramError(
            f"global_size {tuple(global_size)} ({want} items) does not match the program's GLOBAL range of {have} items"
        )
