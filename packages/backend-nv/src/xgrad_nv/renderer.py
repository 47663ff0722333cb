"""The CUDA C renderer: linear program in, one CUDA C++ kernel (for NVRTC or nvcc) out; and the NVIDIA arch table.

Kernel ABI (what `xgrad_nv.device` launches):
    extern "C" __global__ void __launch_bounds__(<threads>[, <blocks>])
    <name>(T0* data0, const T1* data1, ..., const int var0, ...)
(`<blocks>`, 1 or 2, only in tensor-core kernels: the blocks per SM ptxas must fit, see `render_kernel`); one
pointer per PARAM (in PARAM order), then one 32-bit int per DEFINE_VAR (in program order). SPECIAL `gidx<d>` is
`blockIdx.<d>`, `lidx<d>` is `threadIdx.<d>`; the launch's grid and block are the sizes of those SPECIALs
(`xgrad_codegen.pygpu.launch_sizes`). DEFINE_LOCAL is a static `__shared__` array, BARRIER `__syncthreads()`.

Types: half is `cuda_fp16.h`'s `half`, bfloat16 `cuda_bf16.h`'s `__nv_bfloat16` (both native: codegen computes in
them, as the hardware does, one rounding per op); fp8 formats are emulated by codegen on uint8 memory (see
`xgrad_codegen.decompose`). Conversions to and from the 16-bit floats go through the headers' explicitly rounding
intrinsics, never through C++'s overloaded constructors (whose overloads are ambiguous for ints). Vectors exist only
where tensor cores need them (fragments) and for the aligned 16-byte copies of tc_tile's staged tiles
(`aligned_vector_bytes`): a `struct __align__ { T v[n]; }` per vector type, loaded and stored through a pointer to it;
every vector ALU op is split into lanes (`max_vector_width` is 1: the vectorizer does not prove alignment).

Tensor cores: a WMMA (src: the A, B and C fragments in `TensorCore`'s layout) is one `mma.sync.aligned.m16n8k16`
through inline PTX, A as four and B as two 32-bit registers of packed halves in element order, C/D four floats.
Asynchronous copies (sm_80+, `async_copy_bytes`): a STORE of an INDEX into shared memory is one inline-PTX `cp.async`
(`.cg` for 16 bytes, `.ca` for 4 and 8; src-size 0 where the source's gate is off), a BARRIER with an `AsyncWait`
commits the thread's copies and waits (`cp.async.commit_group; cp.async.wait_group N;`) before `__syncthreads()`.
A LOAD with a `MatrixLoad` arg (`matrix_loads`, tc_tile's fragments) is one `ldmatrix.sync.aligned.m8n8` through an
inline-PTX helper that returns the lane's vector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from xgrad.dtype import DType, dtypes
from xgrad.errors import DeviceError
from xgrad.uop.ops import GroupOp, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat
from xgrad_codegen.legalize import split_vector_alu
from xgrad_codegen.pydevice import TENSOR_CORES
from xgrad_codegen.renderer import (
    AsyncWait,
    CStyleRenderer,
    MatrixLoad,
    RenderState,
    TensorCore,
    UopRule,
    base_code_for_op,
    base_uop_rules,
    divisor_may_be_zero,
    quotient_may_overflow,
    rule_alu,
    rule_barrier,
    rule_load,
    rule_store,
)

F16, BF16, F32, F64 = dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64
HALVES = (F16, BF16)


@dataclass(frozen=True)
class NVArch:
    """An NVIDIA GPU architecture as the CUDA C++ Programming Guide's tables of compute capabilities give it."""

    name: str  # "sm_90"
    compute_capability: tuple[int, int]
    min_ptx_isa: tuple[int, int]  # the first PTX ISA version that has this target (its `.target sm_XX`)
    global_max: tuple[int, int, int]  # blocks per grid dimension
    local_max: tuple[int, int, int]  # threads per block dimension
    max_threads: int  # threads per block
    shared_static: int  # bytes of static `__shared__` memory per block
    shared_optin: int  # bytes per block with cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) (dynamic memory)
    shared_per_sm: int  # bytes of shared memory per multiprocessor
    threads_per_sm: int  # resident threads per multiprocessor
    registers_per_thread: int
    tensor_cores: tuple[TensorCore, ...]
    tf32_cores: tuple[TensorCore, ...] = ()  # float32 matmuls at tf32 precision: only with CUDARenderer(tf32=True)
    async_copy_bytes: int = 16  # cp.async (global -> shared, 4/8/16 bytes) exists from sm_80 on (PTX ISA 7.0)
    matrix_loads: bool = True  # ldmatrix (m8n8 .b16 from shared memory) exists from sm_75 on (PTX ISA 6.5)


_GRID = (2**31 - 1, 65535, 65535)
_BLOCK = (1024, 1024, 64)
# mma.sync m16n8k16 with f16/bf16 operands and f32 accumulators exists from sm_80 on (PTX ISA 7.0), in the layout
# codegen's tensor-core pass uses (xgrad_codegen.pydevice.TENSOR_CORES["sm_90"], the PTX ISA's fragments)
_MMA_M16N8K16 = TENSOR_CORES["sm_90"]
# mma.sync m16n8k8 .tf32 (PTX ISA, "Matrix Fragments for mma.m16n8k8", g = lane >> 2, t = lane % 4): A's a0..a3 at
# row g (+8 for a1, a3), column t (+4 for a2, a3); B's b0, b1 at row t (+4 for b1), column g; C/D as for m16n8k16
ROW, COL = 0, 1
_LANES_ROW_G = ((COL, 1), (COL, 2), (ROW, 1), (ROW, 2), (ROW, 4))
_TF32_A = (_LANES_ROW_G, ((ROW, 8), (COL, 4)))
_TF32_B = (((ROW, 1), (ROW, 2), (COL, 1), (COL, 2), (COL, 4)), ((ROW, 4),))
_TF32_C = (((COL, 2), (COL, 4), (ROW, 1), (ROW, 2), (ROW, 4)), ((COL, 1), (ROW, 8)))
_MMA_TF32 = (TensorCore("mma_m16n8k8_tf32", (16, 8, 8), F32, F32, 32, _TF32_A, _TF32_B, _TF32_C),)
KIB = 1024
NV_ARCHS: dict[str, NVArch] = {
    "sm_80": NVArch("sm_80", (8, 0), (7, 0), _GRID, _BLOCK, 1024, 48 * KIB, 163 * KIB, 164 * KIB, 2048, 255,
                    _MMA_M16N8K16, _MMA_TF32),
    "sm_89": NVArch("sm_89", (8, 9), (7, 8), _GRID, _BLOCK, 1024, 48 * KIB, 99 * KIB, 100 * KIB, 1536, 255,
                    _MMA_M16N8K16, _MMA_TF32),
    "sm_90": NVArch("sm_90", (9, 0), (7, 8), _GRID, _BLOCK, 1024, 48 * KIB, 227 * KIB, 228 * KIB, 2048, 255,
                    _MMA_M16N8K16, _MMA_TF32),
    "sm_120": NVArch("sm_120", (12, 0), (8, 7), _GRID, _BLOCK, 1024, 48 * KIB, 99 * KIB, 100 * KIB, 1536, 255,
                     _MMA_M16N8K16, _MMA_TF32),
}  # fmt: skip
DEFAULT_ARCH = "sm_90"


def nv_arch(arch: str | None) -> NVArch:
    """The table entry of `arch` ("sm_90"; None: DEFAULT_ARCH); DeviceError naming the known ones otherwise."""
    name = arch or DEFAULT_ARCH
    if name not in NV_ARCHS:
        raise DeviceError(f"no NVIDIA arch {name!r}: use one of {', '.join(NV_ARCHS)} (e.g. DEV=NULL:CUDA:sm_90)")
    return NV_ARCHS[name]


# ---- ops ----
def cuda_math(fn32: str, fn64: str) -> Callable[[str, DType], str]:
    """A CUDA math function: float32 `fn32`, float64 `fn64`; half/bfloat16 computed in float32 and rounded once."""

    def call(x: str, dtype: DType) -> str:
        scalar = dtype.scalar()
        if scalar == F64:
            return f"{fn64}({x})"
        if scalar in HALVES:
            return to_half(scalar, f"{fn32}({from_half(scalar, x)})", F32)
        return f"{fn32}({x})"

    return call


def cuda_trunc(x: str, dtype: DType) -> str:
    return cuda_math("truncf", "trunc")(x, dtype) if dtypes.is_float(dtype) else x


def cuda_reciprocal(x: str, dtype: DType) -> str:
    one = {F64: "1.0", F32: "1.0f", F16: "__float2half_rn(1.0f)", BF16: "__float2bfloat16_rn(1.0f)"}
    return f"({one.get(dtype.scalar(), '1')}/{x})"  # `1/x` on half: int->half and half->float overloads tie


code_for_op_cuda: dict[Ops, Callable[..., str]] = {
    **base_code_for_op,
    Ops.RECIPROCAL: cuda_reciprocal,
    Ops.EXP2: cuda_math("exp2f", "exp2"),
    Ops.LOG2: cuda_math("log2f", "log2"),
    Ops.SIN: cuda_math("sinf", "sin"),
    Ops.SQRT: cuda_math("sqrtf", "sqrt"),
    Ops.TRUNC: cuda_trunc,
}


# ---- conversions of the 16-bit floats ----
_HALF_NAME = {F16: "half", BF16: "bfloat16"}


def from_half(src: DType, x: str) -> str:
    """half/bfloat16 `x` as float (exact)."""
    return f"__{_HALF_NAME[src]}2float({x})"


def to_half(dst: DType, x: str, src: DType) -> str:
    """`x` of dtype `src` (not a 16-bit float) rounded to nearest-even half/bfloat16 `dst`."""
    h = _HALF_NAME[dst]
    if src == F32:
        return f"__float2{h}_rn({x})"
    if src == F64:
        return f"__double2{h}({x})"
    if src in (dtypes.int64,):
        return f"__ll2{h}_rn({x})"
    if src in (dtypes.uint64,):
        return f"__ull2{h}_rn({x})"
    if dtypes.is_unsigned(src):
        return f"__uint2{h}_rn((unsigned int)({x}))"
    return f"__int2{h}_rn((int)({x}))"  # bool, int8/16/32, index


# ---- legalisation: vectors are only tensor-core fragments ----
pm_legalize_cuda = PatternMatcher(
    [
        (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST}, name="x"), split_vector_alu),
    ]
)


# ---- uop rules that differ from the C family ----
def divmod_helper(name: str, op: Ops, t: str, unsigned: bool) -> str:
    """`name(a, b)`: xgrad's total IDIV/MOD on `t`: a / 0 is 0, a % 0 is a, MIN / -1 is MIN and MIN % -1 is 0
    (CUDA leaves all of them undefined)."""
    if op is Ops.IDIV:
        wrap = f"({t})(0 - ({u_t(t)})a)"  # -MIN wraps to MIN
        body = "b == 0 ? 0 : a / b" if unsigned else f"b == 0 ? ({t})0 : b == -1 ? {wrap} : ({t})(a / b)"
    else:
        body = "b == 0 ? a : a % b" if unsigned else f"b == 0 ? a : b == -1 ? ({t})0 : ({t})(a % b)"
    return f"__device__ __forceinline__ {t} {name}({t} a, {t} b) {{ return {body}; }}"


def u_t(t: str) -> str:
    return f"unsigned {t.removeprefix('signed ')}"


def rule_cuda_divmod(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    if dtypes.is_float(u.dtype) or not (divisor_may_be_zero(u) or quotient_may_overflow(u)):
        return rule_alu(r, ctx, u)
    name = f"xg_{u.op.name.lower()}_{u.dtype.name}"
    ctx.helpers.setdefault(name, divmod_helper(name, u.op, r.render_dtype(ctx, u.dtype), dtypes.is_unsigned(u.dtype)))
    return f"{name}({ctx.exprs[u.src[0]]}, {ctx.exprs[u.src[1]]})"


MMA_PTX_TYPE = {F16: "f16", BF16: "bf16", F32: "tf32"}  # tf32: float32 bits, the low 13 ignored by the hardware


def wmma_helper(name: str, tc: TensorCore, ta: str, tb: str, tc_: str) -> str:
    """`name(a, b, c)`: D = A @ B + C of one warp by `mma.sync` (m16n8k16 f16/bf16 or m16n8k8 tf32, f32
    accumulators); A's and B's elements fill 32-bit registers in element order (two halves or one tf32 each), which
    is the PTX ISA's fragment order."""
    m, n, k = tc.dims
    t = MMA_PTX_TYPE[tc.dtype]
    per_reg = 4 // tc.dtype.itemsize  # elements per 32-bit register: 2 halves, 1 tf32
    na, nb, nc = tc.elements("a") // per_reg, tc.elements("b") // per_reg, tc.elements("c")
    regs = iter(range(nc + na + nb))
    d_ops = ", ".join(f"%{next(regs)}" for _ in range(nc))
    a_ops = ", ".join(f"%{next(regs)}" for _ in range(na))
    b_ops = ", ".join(f"%{next(regs)}" for _ in range(nb))
    asm = f"mma.sync.aligned.m{m}n{n}k{k}.row.col.f32.{t}.{t}.f32 {{{d_ops}}}, {{{a_ops}}}, {{{b_ops}}}, {{{d_ops}}};"
    outs = ", ".join(f'"+f"(c.v[{i}])' for i in range(nc))
    ins = ", ".join([*(f'"r"(A[{i}])' for i in range(na)), *(f'"r"(B[{i}])' for i in range(nb))])
    return "\n".join(
        [
            f"__device__ __forceinline__ {tc_} {name}({ta} a, {tb} b, {tc_} c) {{",
            "  const unsigned int* A = (const unsigned int*)&a;",
            "  const unsigned int* B = (const unsigned int*)&b;",
            f'  asm volatile("{asm}" : {outs} : {ins});',
            "  return c;",
            "}",
        ]
    )


def rule_cuda_wmma(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    tc = u.arg
    dims = (16, 8, 8) if isinstance(tc, TensorCore) and tc.dtype == F32 else (16, 8, 16)
    if not isinstance(tc, TensorCore) or tc.dtype not in MMA_PTX_TYPE or tc.dims != dims or tc.acc != F32:
        raise NotImplementedError(f"the CUDA renderer has no mma.sync for WMMA {u.arg!r}")
    a, b, c = u.src
    ta, tb, tc_ = (r.render_dtype(ctx, s.dtype) for s in (a, b, c))
    name = f"xg_{tc.name}"
    ctx.helpers.setdefault(name, wmma_helper(name, tc, ta, tb, tc_))
    return f"{name}({ctx.exprs[a]}, {ctx.exprs[b]}, {ctx.exprs[c]})"


def cp_async(size: int, dst: str, src: str, src_size: str) -> str:
    """The inline PTX of one asynchronous copy of `size` bytes from global `src` to shared `dst` (generic pointers),
    reading `src_size` of them (the rest zeros): `.cg` (cached in L2 only) for 16 bytes, `.ca` for 4 and 8."""
    cache = "cg" if size == 16 else "ca"
    return (
        f'asm volatile("cp.async.{cache}.shared.global [%0], [%1], {size}, %2;" :: '
        f'"r"((unsigned int)__cvta_generic_to_shared({dst})), "l"({src}), "r"({src_size}) : "memory");'
    )


def rule_cuda_store(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    """A STORE whose value is an INDEX is an asynchronous copy into shared memory (`async_copy_bytes`)."""
    dst, src = u.src
    if src.op is not Ops.INDEX:
        return rule_store(r, ctx, u)
    size = src.dtype.scalar().itemsize * src.dtype.count
    if len(dst.src) > 2 or dst.src[0].op is not Ops.DEFINE_LOCAL or size not in (4, 8, 16):
        raise NotImplementedError(f"the CUDA renderer copies asynchronously 4, 8 or 16 bytes into shared memory: {u}")
    src_size = f"({ctx.exprs[src.src[2]]}?{size}:0)" if len(src.src) > 2 else str(size)
    at, gptr = (f"({ctx.exprs[x.src[0]]}+{ctx.exprs[x.src[1]]})" for x in (dst, src))
    ctx.emit(cp_async(size, at, gptr, src_size))
    return None


def ldmatrix_helper(name: str, ml: MatrixLoad, t: str, vec: str) -> str:
    """`name(p)`: this lane's part of `ml.count` 8 x 8 matrices by one ldmatrix, p its row (see MatrixLoad)."""
    regs = ", ".join(f"%{i}" for i in range(ml.count))
    asm = f"ldmatrix.sync.aligned.m8n8.x{ml.count}{'.trans' if ml.trans else ''}.shared.b16 {{{regs}}}, [%{ml.count}];"
    outs = ", ".join(f'"=r"(R[{i}])' for i in range(ml.count))
    return "\n".join(
        [
            f"__device__ __forceinline__ {vec} {name}(const {t}* p) {{",
            f"  {vec} v;",
            "  unsigned int* R = (unsigned int*)&v;",
            f'  asm volatile("{asm}" : {outs} : "r"((unsigned int)__cvta_generic_to_shared(p)) : "memory");',
            "  return v;",
            "}",
        ]
    )


def rule_cuda_load(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    """A LOAD with a MatrixLoad arg is one warp-wide ldmatrix (`matrix_loads`)."""
    if not isinstance(ml := u.arg, MatrixLoad):
        return rule_load(r, ctx, u)
    idx = u.src[0]
    if len(idx.src) > 2 or idx.src[0].op is not Ops.DEFINE_LOCAL or u.dtype.scalar().itemsize != 2:
        raise NotImplementedError(f"the CUDA renderer's ldmatrix reads 16-bit elements of shared memory: {u}")
    name = f"xg_ldmatrix_x{ml.count}{'_trans' if ml.trans else ''}_{u.dtype.scalar().name}"
    t, vec = r.render_dtype(ctx, u.dtype.scalar()), r.render_dtype(ctx, u.dtype)
    ctx.helpers.setdefault(name, ldmatrix_helper(name, ml, t, vec))
    return f"{name}({ctx.exprs[idx.src[0]]}+{ctx.exprs[idx.src[1]]})"


def rule_cuda_barrier(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    """A BARRIER with an AsyncWait first commits this thread's asynchronous copies and waits for the older ones."""
    if isinstance(u.arg, AsyncWait):
        ctx.emit('asm volatile("cp.async.commit_group;" ::: "memory");')
        ctx.emit(f'asm volatile("cp.async.wait_group {int(u.arg.pending)};" ::: "memory");')
    return rule_barrier(r, ctx, u)


def dynamic_shared(uops: list[UOp], spec: NVArch) -> int:
    """Bytes of dynamic shared memory a kernel launches with: all its arrays (16-byte aligned) when they exceed the
    arch's static limit, else 0 (static arrays)."""
    total = sum(-(-int(u.arg[1]) * u.dtype.itemsize // 16) * 16 for u in uops if u.op is Ops.DEFINE_LOCAL)
    return total if total > spec.shared_static else 0


uop_rules_cuda: dict[Ops, UopRule] = {
    **base_uop_rules,
    Ops.IDIV: rule_cuda_divmod,
    Ops.MOD: rule_cuda_divmod,
    Ops.WMMA: rule_cuda_wmma,
    Ops.STORE: rule_cuda_store,
    Ops.LOAD: rule_cuda_load,
    Ops.BARRIER: rule_cuda_barrier,
}

BITCAST_HELPER = (
    "template <class T, class F> __device__ __forceinline__ T xg_bitcast(F f) {\n"
    "  T t; memcpy(&t, &f, sizeof(T)); return t;\n"
    "}"
)
HALF_VIA_FLOAT = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.MAX})
HEADERS = {F16: "#include <cuda_fp16.h>", BF16: "#include <cuda_bf16.h>"}


class CUDARenderer(CStyleRenderer):
    """CUDA C++ for NVRTC/nvcc, for NVIDIA GPU `arch` (a key of NV_ARCHS, default sm_90): its launch limits, 48 KiB of
    static shared memory per block, and its tensor cores."""

    device = "NV"
    name = "CUDA"
    type_map: ClassVar[dict[DType, str]] = {
        **CStyleRenderer.type_map,
        dtypes.float16: "half",
        dtypes.bfloat16: "__nv_bfloat16",
    }
    vector_type_prefix: ClassVar[dict[DType, str]] = {
        d: "xg_" + CStyleRenderer.vector_type_prefix.get(d, d.name) for d in type_map
    }
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = code_for_op_cuda
    uop_rules: ClassVar[dict[Ops, UopRule]] = uop_rules_cuda
    legalize = pm_legalize_cuda
    native_dtypes = frozenset({dtypes.bool, *dtypes.ints, dtypes.index, F16, BF16, F32, F64})
    infinity = "__int_as_float(0x7f800000)"
    nan = "__int_as_float(0x7fffffff)"
    kernel_prefix = 'extern "C" __global__'
    reserved_names: ClassVar[frozenset[str]] = CStyleRenderer.reserved_names | {
        "half",
        "bool",
        "signed",
        "unsigned",
        "threadIdx",
        "blockIdx",
        "blockDim",
        "gridDim",
        "warpSize",
        "asm",
    }
    has_local = True
    has_shared = True
    max_vector_width = 1
    aligned_vector_bytes = 16  # tc_tile's staged copies: one 128-bit load/store per 8 halves (LDG.128, STS.128)

    def __init__(self, arch: str | None = None, tf32: bool = False) -> None:
        """`tf32`: float32 matmuls on the tf32 tensor cores too (10-bit mantissa operands; off by default, as
        float32 results would silently lose precision)."""
        super().__init__()
        spec = nv_arch(arch)
        self.arch = spec.name
        self.spec = spec
        self.global_max, self.local_max = spec.global_max, spec.local_max
        # past the 48 KiB of static shared memory a kernel's arrays live in dynamic shared memory (`dynamic_shared`)
        self.max_threads, self.shared_max = spec.max_threads, spec.shared_optin
        self.tensor_cores = spec.tensor_cores + (spec.tf32_cores if tf32 else ())
        self.async_copy_bytes = spec.async_copy_bytes
        self.matrix_loads = spec.matrix_loads

    # ---- ALU ----
    def render_alu(self, op: Ops, dtype: DType, operands: list[str], src_dtypes: list[DType]) -> str:
        """Comparisons and MAX of half/bfloat16 compare their float32 values (exact; the headers' operators are
        inline PTX with scoped predicate registers)."""
        src = src_dtypes[0].scalar() if src_dtypes else dtype.scalar()
        if op in HALF_VIA_FLOAT and src in HALVES and dtype.count == 1:
            as_float = [from_half(src, x) for x in operands]
            expr = self.code_for_op[op](*as_float, dtype=F32 if op is Ops.MAX else dtype)
            return to_half(src, expr, F32) if op is Ops.MAX else expr
        return super().render_alu(op, dtype, operands, src_dtypes)

    # ---- types ----
    def vector_struct(self, name: str, dtype: DType) -> str:
        size = dtype.scalar().itemsize * dtype.count
        align = min(16, 1 << (size - 1).bit_length())
        return f"struct __align__({align}) {name} {{ {self.type_map[dtype.scalar()]} v[{dtype.count}]; }};"

    def render_vectorize(self, ctx: RenderState, dtype: DType, lanes: list[str]) -> str:
        return f"{self.render_dtype(ctx, dtype)}{{{', '.join(lanes)}}}"

    def render_load(self, ctx: RenderState, dtype: DType, buf: str, idx: str, gate: str | None) -> str:
        """A vector (codegen proved it aligned, see `aligned_vector_bytes`) is read through a pointer to its
        struct, one instruction; under a gate, zeros where it is off."""
        if dtype.count == 1:
            return super().render_load(ctx, dtype, buf, idx, gate)
        t = self.render_dtype(ctx, dtype)
        value = f"(*((const {t}*)({buf}+{idx})))"
        return f"({gate}?{value}:{t}{{}})" if gate is not None else value

    def render_store(self, ctx: RenderState, dtype: DType, buf: str, idx: str, value: str, gate: str | None) -> str:
        if dtype.count == 1:
            return super().render_store(ctx, dtype, buf, idx, value, gate)
        stmt = f"*(({self.render_dtype(ctx, dtype)}*)({buf}+{idx})) = {value};"
        return f"if ({gate}) {stmt}" if gate is not None else stmt

    def render_gep(self, vec: str, lane: int) -> str:
        return f"{vec}.v[{lane}]"

    def render_cast(self, ctx: RenderState, dtype: DType, src_dtype: DType, x: str) -> str:
        dst, src = dtype.scalar(), src_dtype.scalar()
        if dtypes.is_bool(dst):
            return f"({x}!={self.render_const(0, src)})"
        if dst == src:
            return x
        if src in HALVES:
            x, src = from_half(src, x), F32
            if dst == F32:
                return x
        if dst in HALVES:
            return to_half(dst, x, src)
        return f"(({self.render_dtype(ctx, dst)})({x}))"

    def render_bitcast(self, ctx: RenderState, dtype: DType, src_dtype: DType, x: str) -> str:
        ctx.helpers.setdefault("xg_bitcast", BITCAST_HELPER)
        return f"xg_bitcast<{self.render_dtype(ctx, dtype)}>({x})"

    def render_special(self, ctx: RenderState, u: UOp) -> str:
        name = str(u.arg[0])
        return f"((int){'blockIdx' if name.startswith('gidx') else 'threadIdx'}.{'xyz'[int(name[-1])]})"

    def render_shared_decl(self, ctx: RenderState, u: UOp, name: str) -> str:
        """A static `__shared__` array, or past `shared_static` bytes in all a pointer into the kernel's dynamic
        shared memory (the launch passes its size: `dynamic_shared`), each array from a 16-byte aligned offset."""
        t = self.render_dtype(ctx, u.dtype)
        if dynamic_shared(ctx.uops, self.spec) == 0:
            return f"__shared__ __align__(16) {t} {name}[{int(u.arg[1])}];"
        offset = sum(-(-int(x.arg[1]) * x.dtype.itemsize // 16) * 16 for x, _ in ctx.shared[:-1])
        first = "extern __shared__ __align__(16) unsigned char xg_dynamic_shared[];\n  " if len(ctx.shared) == 1 else ""
        return f"{first}{t}* {name} = ({t}*)(xg_dynamic_shared + {offset});"

    def render_barrier(self) -> str:
        return "__syncthreads();"

    # ---- the kernel ----
    def render_buffer_decl(self, ctx: RenderState, u: UOp, name: str, written: bool) -> str:
        return f"{'' if written else 'const '}{self.render_dtype(ctx, u.dtype)}* {name}"

    def render_var_decl(self, ctx: RenderState, u: UOp, name: str, k: int) -> str:
        return f"const int {name}"

    def render_prefix(self, ctx: RenderState) -> list[str]:
        used = {u.dtype.scalar() for u in ctx.uops} | {s.dtype.scalar() for u in ctx.uops for s in u.src}
        includes = [text for d, text in HEADERS.items() if d in used]
        structs = [self.vector_struct(name, dtype) for name, dtype in ctx.vector_types.items()]
        return includes + structs + list(ctx.helpers.values())

    def render_kernel(self, ctx: RenderState, name: str, body: list[str]) -> str:
        threads = 1
        for u in ctx.uops:
            if u.op is Ops.SPECIAL and str(u.arg[0]).startswith("lidx"):
                threads *= int(u.arg[1])
        # the ABI: PARAM i is argument i (a PARAM the program lost holds its place as an unused pointer)
        by_index = {int(u.arg): self.render_buffer_decl(ctx, u, n, w) for u, n, w in ctx.params}
        count = max(by_index, default=-1) + 1
        params = [by_index.get(i, f"const void* unused{i}") for i in range(count)]
        params += [self.render_var_decl(ctx, u, n, k) for u, n, k in ctx.variables]
        # a tensor-core kernel keeps its accumulators in registers: one block per SM is enough (minBlocks 1), or
        # ptxas trades registers for occupancy and spills (a 4-warp 64x64 tile: 72 registers and 28 bytes spilled);
        # a block of 8+ warps asks for two (16 warps per SM, <= 128 registers): the double-buffered 8-warp tile fits
        # in 127 registers with the same loop as at 140 (where one block per SM fit)
        bounds = f"{threads}"
        if any(u.op is Ops.WMMA for u in ctx.uops):
            bounds += ", 2" if threads >= 256 else ", 1"
        head = f"{self.kernel_prefix} void __launch_bounds__({bounds}) {name}({', '.join(params)}) {{"
        return "\n".join([*self.render_prefix(ctx), head, *body, "}"]) + "\n"


__all__ = ["CUDARenderer", "dynamic_shared", "NVArch", "NV_ARCHS", "DEFAULT_ARCH", "nv_arch", "pm_legalize_cuda"]
