"""The HIP renderer: linear program in, one HIP kernel (clang's `-x hip` dialect, no ROCm headers) out.

Kernel ABI (what `xgrad_amd.device` packs into the kernarg segment):
    extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(1, N)))
    void <name>(T0* data0, const T1* data1, ..., const int var0, ...)
one pointer per PARAM index from 0 to the highest one the program uses (an index it does not use is a `void*` kept
for its place), then one `int` per DEFINE_VAR in program order: pointers at 8-byte offsets, then 4-byte ints, as
clang lays out the kernel's explicit arguments. N is the workgroup's thread count (the `lidx` SPECIALs' product).

Nothing from ROCm is needed to build a kernel: workgroup and thread ids are `__builtin_amdgcn_workgroup_id_<d>()` and
`__builtin_amdgcn_workitem_id_<d>()`, shared memory is `__attribute__((shared))` (LDS, address space 3), a barrier is
`s_barrier` between workgroup release/acquire fences, math goes through clang builtins that lower to instructions
(`__builtin_sqrtf`, `__builtin_exp2f`, `__builtin_log2f`: v_sqrt/v_exp/v_log with the denormal scaling LLVM adds),
half is `_Float16` and bfloat16 clang's `__bf16`. SIN is left to codegen's approximation (v_sin_f32 is coarse), and
float64 EXP2/LOG2 to the same approximations (there is no float64 instruction; LLVM would call a library function).
Tensor cores (WMMA UOps) are the matrix builtins of the arch (`AMD_ARCHS`): RDNA3's `wmma_*_w32`, RDNA4's
`wmma_*_w32_gfx12` and CDNA's `mfma_*`, each with its own register layout (`TensorCore`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from xgrad.dtype import DType, dtypes
from xgrad.errors import DeviceError
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat
from xgrad_codegen.decompose import lower_exp2, lower_log2
from xgrad_codegen.pydevice import GPU_ARCHS, TENSOR_CORES, GPUArch
from xgrad_codegen.renderer import (
    CStyleRenderer,
    RenderState,
    TensorCore,
    UopRule,
    base_code_for_op,
    base_uop_rules,
    divisor_may_be_zero,
    pm_split_vector_ops,
    quotient_may_overflow,
    rule_alu,
)

ROW, COL = 0, 1


def _bits(*pairs: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    return tuple(pairs)


# RDNA4 v_wmma_f32_16x16x16_{f16,bf16} (wave32, gfx12 forms): no copies across the halves of the wave any more. Lane
# l holds row l % 16 of A at k = 8 (l // 16) + i and column l % 16 of B at k = 8 (l // 16) + i (i = 0..7, 8 halves
# in 4 VGPRs); D's 8 floats of lane l are rows 8 (l // 16) + i of column l % 16 (RDNA3 interleaves them: 2i + l // 16).
_RDNA4_A = (_bits((ROW, 1), (ROW, 2), (ROW, 4), (ROW, 8), (COL, 8)), _bits((COL, 1), (COL, 2), (COL, 4)))
_RDNA4_B = (_bits((COL, 1), (COL, 2), (COL, 4), (COL, 8), (ROW, 8)), _bits((ROW, 1), (ROW, 2), (ROW, 4)))
_RDNA4_C = _RDNA4_B
RDNA4_TENSOR_CORES: tuple[TensorCore, ...] = tuple(
    TensorCore(f"wmma_16x16x16_gfx12_{d.name}", (16, 16, 16), d, dtypes.float32, 32, _RDNA4_A, _RDNA4_B, _RDNA4_C)
    for d in (dtypes.float16, dtypes.bfloat16)
)


@dataclass(frozen=True)
class MatrixBuiltin:
    """How a TensorCore is called: the clang builtin, the integer type its bf16 operands are passed as (clang-19
    takes bf16 fragments as `short` vectors; None: the operands' own type) and the arguments after A, B, C."""

    builtin: str
    operand_int: bool = False
    extra_args: str = ""


MFMA_EXTRA = ", 0, 0, 0"  # cbsz, abid, blgp: no broadcast between the blocks of a wave
MATRIX_BUILTINS: dict[str, MatrixBuiltin] = {
    "wmma_16x16x16_float16": MatrixBuiltin("__builtin_amdgcn_wmma_f32_16x16x16_f16_w32"),
    "wmma_16x16x16_bfloat16": MatrixBuiltin("__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32", operand_int=True),
    "wmma_16x16x16_gfx12_float16": MatrixBuiltin("__builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12"),
    "wmma_16x16x16_gfx12_bfloat16": MatrixBuiltin(
        "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12", operand_int=True
    ),
    "mfma_16x16x16_float16": MatrixBuiltin("__builtin_amdgcn_mfma_f32_16x16x16f16", extra_args=MFMA_EXTRA),
    "mfma_16x16x16_bfloat16": MatrixBuiltin(
        "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k", operand_int=True, extra_args=MFMA_EXTRA
    ),
}


@dataclass(frozen=True)
class AMDArch:
    """One AMD GPU target clang-19 builds for: its family, wave size, workgroup limits and matrix instructions."""

    name: str
    family: str  # "CDNA2", "CDNA3", "RDNA3", "RDNA3.5", "RDNA4"
    wave_size: int
    limits: GPUArch
    tensor_cores: tuple[TensorCore, ...]
    products: str = ""


# HIP's grid and workgroup limits (grid x up to 2**31-1 workgroups, y/z 65535; 1024 threads per workgroup, 64 KiB of
# LDS per workgroup) are the same on every listed target: the PYTHON device's gfx1100 table is the one source.
_LIMITS = GPU_ARCHS["gfx1100"]
AMD_ARCHS: dict[str, AMDArch] = {
    "gfx90a": AMDArch("gfx90a", "CDNA2", 64, _LIMITS, TENSOR_CORES["gfx942"], "Instinct MI210/MI250"),
    "gfx942": AMDArch("gfx942", "CDNA3", 64, GPU_ARCHS["gfx942"], TENSOR_CORES["gfx942"], "Instinct MI300"),
    "gfx1100": AMDArch("gfx1100", "RDNA3", 32, _LIMITS, TENSOR_CORES["gfx1100"], "Radeon RX 7900"),
    "gfx1151": AMDArch("gfx1151", "RDNA3.5", 32, _LIMITS, TENSOR_CORES["gfx1100"], "Ryzen AI Max (Strix Halo)"),
    "gfx1200": AMDArch("gfx1200", "RDNA4", 32, _LIMITS, RDNA4_TENSOR_CORES, "Radeon RX 9060"),
    "gfx1201": AMDArch("gfx1201", "RDNA4", 32, _LIMITS, RDNA4_TENSOR_CORES, "Radeon RX 9070"),
}
DEFAULT_ARCH = "gfx1100"
# targets an AMD user may have that this backend cannot build for, and why
UNSUPPORTED_ARCHS: dict[str, str] = {
    "gfx950": "clang-19 does not know gfx950 (Instinct MI350, added in LLVM 20); a newer clang is needed",
}


def arch_info(arch: str) -> AMDArch:
    """The `AMD_ARCHS` entry of a target id (`gfx90a` or with features, `gfx90a:xnack-`); DeviceError naming the
    supported ones otherwise."""
    base = arch.split(":")[0]
    if (info := AMD_ARCHS.get(base)) is not None:
        return info
    why = UNSUPPORTED_ARCHS.get(base, "not a target this backend knows")
    raise DeviceError(f"AMD arch {arch!r}: {why}; use one of {', '.join(AMD_ARCHS)} (e.g. DEV=NULL:HIP:gfx1100)")


# ---- math ----
def hip_math(fn: str, x: str, dtype: DType) -> str:
    """A clang math builtin on float32/float64; half and bfloat16 go through float32."""
    if dtype.scalar() == dtypes.float64:
        return f"__builtin_{fn}({x})"
    if dtype.scalar() == dtypes.float32:
        return f"__builtin_{fn}f({x})"
    return f"(({HIPRenderer.type_map[dtype.scalar()]})__builtin_{fn}f((float){x}))"


def hip_trunc(x: str, dtype: DType) -> str:
    return hip_math("trunc", x, dtype) if dtypes.is_float(dtype) else x


code_for_op_hip: dict[Ops, Callable[..., str]] = {
    **base_code_for_op,
    Ops.EXP2: lambda x, dtype: hip_math("exp2", x, dtype),
    Ops.LOG2: lambda x, dtype: hip_math("log2", x, dtype),
    Ops.SQRT: lambda x, dtype: hip_math("sqrt", x, dtype),
    Ops.TRUNC: hip_trunc,
}

# ops with no vector form in clang's ext_vector_type (math builtins, ?:, comparisons giving bool) or that need a
# guarded helper per lane (integer division): split into lanes before printing
HIP_SCALAR_ONLY_OPS = frozenset(
    {Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.TRUNC, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE, Ops.IDIV, Ops.MOD}
)


def approximate_float64(x: UOp) -> UOp | None:
    """float64 EXP2/LOG2 -> codegen's float64 approximations (AMD GPUs have no float64 exp/log instruction)."""
    if x.dtype != dtypes.float64:
        return None
    return lower_exp2(x) if x.op is Ops.EXP2 else lower_log2(x)


pm_legalize_hip = pm_split_vector_ops(HIP_SCALAR_ONLY_OPS) + PatternMatcher(
    [
        (UPat((Ops.EXP2, Ops.LOG2), name="x"), approximate_float64),
    ]
)


# ---- uop rules that differ from the C family ----
def divmod_helper(name: str, op: Ops, t: str, unsigned: bool) -> str:
    """`name(a, b)`: xgrad's total IDIV/MOD on type `t`: a / 0 is 0 and a % 0 is a, MIN / -1 is MIN and MIN % -1 is 0
    (C leaves both undefined, and clang may assume they never happen)."""
    if op is Ops.IDIV:
        body = "b == 0 ? 0 : a / b" if unsigned else f"b == 0 ? 0 : b == -1 ? ({t})(0 - ({unsigned_of(t)})a) : a / b"
    else:
        body = "b == 0 ? a : a % b" if unsigned else "b == 0 ? a : b == -1 ? 0 : a % b"
    return f"{DEVICE_FN} {t} {name}({t} a, {t} b) {{ return {body}; }}"


def unsigned_of(t: str) -> str:
    return {"long long": "unsigned long long", "signed char": "unsigned char"}.get(t, f"unsigned {t}")


def rule_hip_divmod(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    """Int IDIV/MOD whose divisor may be 0 (or -1 with a dividend that may be the minimum) calls a guarded helper; a
    divisor the bounds keep safe (every index computation) is C's `/`, `%`."""
    if dtypes.is_float(u.dtype) or not (divisor_may_be_zero(u) or quotient_may_overflow(u)):
        return rule_alu(r, ctx, u)
    name = f"{u.op.name.lower()}_{u.dtype.name}"
    ctx.helpers.setdefault(name, divmod_helper(name, u.op, r.render_dtype(ctx, u.dtype), dtypes.is_unsigned(u.dtype)))
    return f"{name}({ctx.exprs[u.src[0]]}, {ctx.exprs[u.src[1]]})"


def rule_hip_wmma(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    """WMMA(A fragment, B fragment, C fragment) -> the arch's matrix builtin, through a helper per TensorCore."""
    tc: TensorCore = u.arg
    call = MATRIX_BUILTINS.get(tc.name)
    if call is None:
        raise DeviceError(f"the HIP renderer has no builtin for tensor core {tc.name!r}")
    ta, tb, tcc = (r.render_dtype(ctx, s.dtype) for s in u.src)
    td = r.render_dtype(ctx, u.dtype)
    a, b = "a", "b"
    if call.operand_int:  # bf16 fragments go in as the bits, in `short` vectors
        ints = r.render_dtype(ctx, dtypes.int16.vec(u.src[0].dtype.count))
        a, b = f"__builtin_bit_cast({ints}, a)", f"__builtin_bit_cast({ints}, b)"
    name = f"xg_{tc.name}"
    # clang-19's machine sinking moves a WMMA whose result only gated stores use under their lane condition (LLVM 19
    # does not mark the V_WMMA machine instructions convergent; fixed upstream in llvm-project PRs 165602 and 178314),
    # along with the packing of its operands, so the off lanes' A rows are never built. An empty asm that reads and
    # writes the result pins it before any branch on the lanes: HIP marks inline asm convergent, which machine sinking
    # honours; not volatile, so loads stay free to move across it (a volatile one ordered every load after it).
    pin = ' __asm__("" : "+v"(d));' if tc.name.startswith("wmma") else ""
    body = f"{td} d = {call.builtin}({a}, {b}, c{call.extra_args});{pin} return d;"
    ctx.helpers.setdefault(name, f"{DEVICE_FN} {td} {name}({ta} a, {tb} b, {tcc} c) {{ {body} }}")
    return f"{name}({', '.join(ctx.exprs[s] for s in u.src)})"


def rule_hip_param(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    name = f"data{u.arg}"
    ctx.taken.add(name)
    ctx.exprs[u] = name
    ctx.params.append((u, name, u in ctx.written))


uop_rules_hip: dict[Ops, UopRule] = {
    **base_uop_rules,
    Ops.IDIV: rule_hip_divmod,
    Ops.MOD: rule_hip_divmod,
    Ops.WMMA: rule_hip_wmma,
    Ops.PARAM: rule_hip_param,
}

DEVICE_FN = "static inline __attribute__((device))"
HALF_TYPEDEF = "typedef _Float16 half;"
SPECIAL_CALLS = {"gidx": "__builtin_amdgcn_workgroup_id_", "lidx": "__builtin_amdgcn_workitem_id_"}
BARRIER = (
    '__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); '
    '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");'
)


class HIPRenderer(CStyleRenderer):
    """HIP C++ for clang-19's amdgcn target. `arch` is a key of `AMD_ARCHS` (optionally with target features,
    `gfx90a:xnack-`); it fixes the wave size, the workgroup limits and the tensor cores."""

    device = "AMD"
    name = "HIP"
    type_map: ClassVar[dict[DType, str]] = {
        **CStyleRenderer.type_map,
        dtypes.float16: "half",
        dtypes.bfloat16: "__bf16",
    }
    vector_type_prefix: ClassVar[dict[DType, str]] = {**CStyleRenderer.vector_type_prefix, dtypes.bfloat16: "bf16_"}
    type_prelude: ClassVar[dict[DType, str]] = {dtypes.float16: HALF_TYPEDEF}
    vector_lane_type: ClassVar[dict[DType, str]] = {dtypes.bool: "unsigned char"}  # no vectors of bool
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = code_for_op_hip
    uop_rules: ClassVar[dict[Ops, UopRule]] = uop_rules_hip
    legalize = pm_legalize_hip
    native_dtypes = frozenset(
        {dtypes.bool, *dtypes.ints, dtypes.index, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64}
    )
    max_vector_width = 4  # 128-bit loads and stores (global_load_dwordx4) of float32
    infinity = "__builtin_inff()"
    nan = '__builtin_nanf("")'
    buffer_qualifier = " __restrict__"
    has_local = True
    has_shared = True

    def __init__(self, arch: str | None = None) -> None:
        super().__init__()
        self.supported_ops = frozenset(self.code_for_op) - {Ops.SIN}  # codegen approximates what is not listed
        self.arch = arch or DEFAULT_ARCH
        info = arch_info(self.arch)
        self.target = info
        self.wave_size = info.wave_size
        self.global_max, self.local_max = info.limits.global_max, info.limits.local_max
        self.max_threads, self.shared_max = info.limits.max_threads, info.limits.shared_max
        self.tensor_cores = info.tensor_cores

    # ---- types ----
    def render_dtype(self, ctx: RenderState | None, dtype: DType) -> str:
        name = super().render_dtype(ctx, dtype)
        if ctx is not None and dtype.count > 1 and dtypes.float16 == dtype.scalar():
            ctx.helpers.setdefault(f"type {dtypes.float16.name}", HALF_TYPEDEF)
        return name

    def vector_typedef(self, name: str, dtype: DType) -> str:
        lane = self.vector_lane_type.get(dtype.scalar(), self.type_map[dtype.scalar()])
        return f"typedef {lane} {name} __attribute__((ext_vector_type({dtype.count})));"

    def render_vectorize(self, ctx: RenderState, dtype: DType, lanes: list[str]) -> str:
        """`(T4){a, b, ...}`; lanes of types narrower than int are cast first: C++ refuses a narrowing conversion in
        an initializer list, and `a | b` of bools or chars is an int."""
        scalar = dtype.scalar()
        if scalar.itemsize < 4 and not dtypes.is_float(scalar):
            lane_t = self.vector_lane_type.get(scalar, self.type_map[scalar])
            lanes = [x if x.lstrip("(-").rstrip(")").isdigit() else f"({lane_t})({x})" for x in lanes]
        return super().render_vectorize(ctx, dtype, lanes)

    def render_bitcast(self, ctx: RenderState, dtype: DType, src_dtype: DType, x: str) -> str:
        return f"__builtin_bit_cast({self.render_dtype(ctx, dtype)}, {x})"

    def render_cast(self, ctx: RenderState, dtype: DType, src_dtype: DType, x: str) -> str:
        if dtype.count > 1:  # casts to/from bool vectors were split into lanes by legalize
            return f"__builtin_convertvector({x}, {self.render_dtype(ctx, dtype)})"
        return super().render_cast(ctx, dtype, src_dtype, x)

    # ---- memory: vectors move through memcpy helpers (any alignment; clang merges them into wide loads) ----
    def vector_access(self, ctx: RenderState, dtype: DType, load: bool) -> str:
        vec, lane = self.render_dtype(ctx, dtype), self.type_map[dtype.scalar()]
        nbytes = dtype.scalar().itemsize * dtype.count
        name = f"{'load' if load else 'store'}_{vec}"
        if load:
            body = f"{vec} v; __builtin_memcpy(&v, p, {nbytes}); return v;"
            ctx.helpers.setdefault(name, f"{DEVICE_FN} {vec} {name}(const {lane}* p) {{ {body} }}")
        else:
            body = f"__builtin_memcpy(p, &v, {nbytes});"
            ctx.helpers.setdefault(name, f"{DEVICE_FN} void {name}({lane}* p, {vec} v) {{ {body} }}")
        return name

    def render_load(self, ctx: RenderState, dtype: DType, buf: str, idx: str, gate: str | None) -> str:
        if dtype.count == 1:
            return super().render_load(ctx, dtype, buf, idx, gate)
        value = f"{self.vector_access(ctx, dtype, load=True)}({buf}+{idx})"
        zero = self.render_vectorize(ctx, dtype, [self.render_const(0, dtype.scalar())] * dtype.count)
        return f"({gate}?{value}:{zero})" if gate is not None else value

    def render_store(self, ctx: RenderState, dtype: DType, buf: str, idx: str, value: str, gate: str | None) -> str:
        if dtype.count == 1:
            return super().render_store(ctx, dtype, buf, idx, value, gate)
        stmt = f"{self.vector_access(ctx, dtype, load=False)}({buf}+{idx}, {value});"
        return f"if ({gate}) {stmt}" if gate is not None else stmt

    # ---- workgroups ----
    def render_special(self, ctx: RenderState, u: UOp) -> str:
        name = str(u.arg[0])
        return f"((int){SPECIAL_CALLS[name[:4]]}{'xyz'[int(name[-1])]}())"

    def render_shared_decl(self, ctx: RenderState, u: UOp, name: str) -> str:
        t = self.render_dtype(ctx, u.dtype.scalar())
        return f"__attribute__((shared, aligned(16))) {t} {name}[{int(u.arg[1])}];"

    def render_barrier(self) -> str:
        return BARRIER

    # ---- the kernel ----
    def render_prefix(self, ctx: RenderState) -> list[str]:
        preludes = [text for key, text in ctx.helpers.items() if key.startswith("type ")]
        typedefs = [self.vector_typedef(name, dtype) for name, dtype in ctx.vector_types.items()]
        return preludes + typedefs + [text for key, text in ctx.helpers.items() if not key.startswith("type ")]

    def render_kernel(self, ctx: RenderState, name: str, body: list[str]) -> str:
        by_index = {u.arg: (u, n, w) for u, n, w in ctx.params}
        params = []
        for i in range(max(by_index, default=-1) + 1):  # every index up to the highest: the launcher's positions
            params.append(self.render_buffer_decl(ctx, *by_index[i]) if i in by_index else f"void* data{i}")
        params += [self.render_var_decl(ctx, u, n, k) for u, n, k in ctx.variables]
        threads = 1
        for u in ctx.uops:
            if u.op is Ops.SPECIAL and str(u.arg[0]).startswith("lidx"):
                threads *= int(u.arg[1])
        attrs = f"__attribute__((global)) __attribute__((amdgpu_flat_work_group_size(1, {threads})))"
        head = f'extern "C" {attrs} void {name}({", ".join(params)}) {{'
        prefix = self.render_prefix(ctx)  # after the body: helpers and types are collected while printing it
        return "\n".join([*prefix, head, *body, "}"]) + "\n"


def kernel_params(uops: list[UOp]) -> tuple[int, tuple[str, ...]]:
    """(number of pointer arguments, variable names in argument order) of a program rendered by `HIPRenderer`."""
    params = [int(u.arg) for u in uops if u.op is Ops.PARAM]
    names = tuple(str(u.arg[0]) for u in uops if u.op is Ops.DEFINE_VAR)
    return max(params, default=-1) + 1, names


__all__ = [
    "HIPRenderer",
    "AMD_ARCHS",
    "AMDArch",
    "DEFAULT_ARCH",
    "UNSUPPORTED_ARCHS",
    "RDNA4_TENSOR_CORES",
    "MATRIX_BUILTINS",
    "arch_info",
    "kernel_params",
    "pm_legalize_hip",
]
