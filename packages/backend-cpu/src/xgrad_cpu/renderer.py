"""The C renderer of the CPU backend: linear program in, one C function (GNU C for gcc >= 12 and clang) out.

Kernel ABI:
    void <name>(void** restrict bufs, const int* restrict vars, int start, int end)
`bufs[i]` is the data of PARAM i, `vars[k]` the value of the k-th DEFINE_VAR of the program, and the first GLOBAL
range runs over `[start, end)` so a launcher can split it across threads. No headers are needed: math goes through
`__builtin_*` functions, vectors are GCC/clang vector extensions, half is `_Float16` (`__fp16` where that is missing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from xgrad.dtype import DType, dtypes
from xgrad.uop.ops import Ops, UOp
from xgrad_codegen.renderer import CStyleRenderer, RenderState, base_code_for_op, pm_split_vector_ops


def c_math_call(fn: str, x: str, dtype: DType) -> str:
    """A libm builtin on a float64/float32 scalar; half goes through float (there is no half libm)."""
    if dtype.scalar() == dtypes.float64:
        return f"__builtin_{fn}({x})"
    if dtype.scalar() == dtypes.float32:
        return f"__builtin_{fn}f({x})"
    return f"((half)__builtin_{fn}f((float){x}))"


def c_exp2(x: str, dtype: DType) -> str:
    return c_math_call("exp2", x, dtype)


def c_log2(x: str, dtype: DType) -> str:
    return c_math_call("log2", x, dtype)


def c_sin(x: str, dtype: DType) -> str:
    return c_math_call("sin", x, dtype)


def c_sqrt(x: str, dtype: DType) -> str:
    return c_math_call("sqrt", x, dtype)


def c_trunc(x: str, dtype: DType) -> str:
    return c_math_call("trunc", x, dtype) if dtypes.is_float(dtype) else x


# ops GNU C has no vector form of (math builtins, ?:, comparisons giving bool) or only a slow scalar loop of
# (integer division); on vector dtypes they are split into lanes before printing
C_SCALAR_ONLY_OPS = frozenset(
    {
        Ops.EXP2,
        Ops.LOG2,
        Ops.SIN,
        Ops.SQRT,
        Ops.TRUNC,
        Ops.MAX,
        Ops.CMPLT,
        Ops.CMPNE,
        Ops.CMPEQ,
        Ops.WHERE,
        Ops.IDIV,
        Ops.MOD,
    }
)
pm_legalize_c = pm_split_vector_ops(C_SCALAR_ONLY_OPS)


def c_sizeof(dtype: DType) -> int:
    """Bytes of one lane as C stores it (index is printed as int)."""
    return 4 if dtype.scalar() == dtypes.index else dtype.scalar().itemsize


class CRenderer(CStyleRenderer):
    """C for the CPU backend. `arch` is the `-march` target the source is compiled for (None: the host)."""

    device = "CPU"
    name = "C"
    type_map: ClassVar[dict[DType, str]] = {
        **CStyleRenderer.type_map,
        dtypes.bool: "_Bool",
        dtypes.float16: "half",
    }
    # _Float16 where the compiler has it (gcc >= 12, clang >= 15 on x86-64); older clang only has the storage type
    # __fp16, whose arithmetic happens in float: results are rounded to half when stored into a half variable
    type_prelude: ClassVar[dict[DType, str]] = {
        dtypes.float16: "#ifdef __FLT16_MAX__\ntypedef _Float16 half;\n#else\ntypedef __fp16 half;\n#endif",
    }
    vector_lane_type: ClassVar[dict[DType, str]] = {dtypes.bool: "unsigned char"}  # _Bool vectors do not exist
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = {
        **base_code_for_op,
        Ops.EXP2: c_exp2,
        Ops.LOG2: c_log2,
        Ops.SIN: c_sin,
        Ops.SQRT: c_sqrt,
        Ops.TRUNC: c_trunc,
    }
    supported_dtypes = frozenset(
        {dtypes.bool, *dtypes.ints, dtypes.index, dtypes.float16, dtypes.float32, dtypes.float64}
    )
    max_vector_width = 8  # 256-bit registers (AVX2) hold 8 floats; wider vectors are split by the compiler
    has_local = False
    legalize = pm_legalize_c
    infinity = "__builtin_inff()"
    nan = '__builtin_nanf("")'
    parallel_range_bounds = ("start", "end")
    buffer_qualifier = " restrict"

    def __init__(self, arch: str | None = None) -> None:
        super().__init__()
        self.arch = arch

    # ---- vectors: typedefs and unaligned load/store helpers, emitted only for the types used ----
    def vector_typedef(self, name: str, dtype: DType) -> str:
        lane = self.vector_lane_type.get(dtype.scalar(), self.type_map[dtype.scalar()])
        # vector_size must be a power of two: a 3-lane vector lives in a 4-lane register
        size = c_sizeof(dtype) * (1 << (dtype.count - 1).bit_length())
        return f"typedef {lane} {name} __attribute__((vector_size({size})));"

    def vector_access(self, ctx: RenderState, dtype: DType, load: bool) -> str:
        vec, ptr = self.render_dtype(ctx, dtype), self.type_map[dtype.scalar()]
        nbytes = c_sizeof(dtype) * dtype.count
        name = f"{'load' if load else 'store'}_{vec}"
        if load:
            body = f"{vec} v = {{0}}; __builtin_memcpy(&v, p, {nbytes}); return v;"
            ctx.helpers.setdefault(name, f"static inline {vec} {name}(const {ptr}* p) {{ {body} }}")
        else:
            body = f"__builtin_memcpy(p, &v, {nbytes});"
            ctx.helpers.setdefault(name, f"static inline void {name}({ptr}* p, {vec} v) {{ {body} }}")
        return name

    def render_load(self, ctx: RenderState, dtype: DType, buf: str, idx: str, gate: str | None) -> str:
        if dtype.count == 1:
            return super().render_load(ctx, dtype, buf, idx, gate)
        value = f"{self.vector_access(ctx, dtype, load=True)}({buf}+{idx})"
        return f"({gate}?{value}:{self.render_vectorize(ctx, dtype, ['0'])})" if gate is not None else value

    def render_store(self, ctx: RenderState, dtype: DType, buf: str, idx: str, value: str, gate: str | None) -> str:
        if dtype.count == 1:
            return super().render_store(ctx, dtype, buf, idx, value, gate)
        stmt = f"{self.vector_access(ctx, dtype, load=False)}({buf}+{idx}, {value});"
        return f"if ({gate}) {stmt}" if gate is not None else stmt

    def render_cast(self, ctx: RenderState, dtype: DType, src_dtype: DType, x: str) -> str:
        if dtype.count > 1:  # casts to/from bool vectors were split into lanes by legalize
            return f"__builtin_convertvector({x}, {self.render_dtype(ctx, dtype)})"
        return super().render_cast(ctx, dtype, src_dtype, x)

    # ---- the kernel ----
    def render_buffer_decl(self, ctx: RenderState, u: UOp, name: str, written: bool) -> str:
        ptr = f"{'' if written else 'const '}{self.render_dtype(ctx, u.dtype)}*"
        return f"{ptr} restrict {name} = ({ptr})bufs[{u.arg}];"

    def render_var_decl(self, ctx: RenderState, u: UOp, name: str, k: int) -> str:
        return f"const {self.render_dtype(ctx, u.dtype)} {name} = vars[{k}];"

    def render_prefix(self, ctx: RenderState) -> list[str]:
        preludes = [text for key, text in ctx.helpers.items() if key.startswith("type ")]
        typedefs = [self.vector_typedef(name, dtype) for name, dtype in ctx.vector_types.items()]
        return preludes + typedefs + [text for key, text in ctx.helpers.items() if not key.startswith("type ")]

    def render_kernel(self, ctx: RenderState, name: str, body: list[str]) -> str:
        decls = [self.render_buffer_decl(ctx, u, n, w) for u, n, w in ctx.params if ctx.users.get(u)]
        decls += [self.render_var_decl(ctx, u, n, k) for u, n, k in ctx.variables if ctx.users.get(u)]
        head = f"void {name}(void** restrict bufs, const int* restrict vars, int start, int end) {{"
        prefix = self.render_prefix(ctx)  # after the declarations: they may use vector types too
        return "\n".join([*prefix, head, *("  " + d for d in decls), *body, "}"]) + "\n"


__all__ = ["CRenderer", "pm_legalize_c", "C_SCALAR_ONLY_OPS"]
