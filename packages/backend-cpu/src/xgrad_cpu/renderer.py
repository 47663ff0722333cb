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
from xgrad.uop.pattern import PatternMatcher, UPat
from xgrad.uop.symbolic import simplify
from xgrad_codegen.renderer import (
    CStyleRenderer,
    RenderState,
    UopRule,
    base_code_for_op,
    base_uop_rules,
    divisor_may_be_zero,
    pm_split_vector_ops,
    quotient_may_overflow,
    rule_alu,
    split_vector_alu,
)


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
# (integer division); on vector dtypes they are split into lanes before printing, so each lane computes what a scalar
# does. EXP2 on float32 is the exception: one helper (`exp2_helper`) in a scalar and a vector form that give the same
# bits, so softmax and friends do not call libm once per lane.
C_SCALAR_ONLY_OPS = frozenset(
    {
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


def split_exp2_unless_float32(x: UOp) -> UOp | None:
    return None if x.dtype.scalar() == dtypes.float32 else split_vector_alu(x)


# float32 vectors that masked loads fill: AVX's vmaskmovps (128 and 256 bit), AVX-512's masked vmovups (512 bit)
MASKED_LOAD_LANES = (4, 8, 16)


def merge_gated_loads(x: UOp) -> UOp | None:
    """VECTORIZE of float32 LOADs from one buffer at consecutive positions, some gated, each lane its own gate (a conv
    window at the padding: vectorize keeps such lanes scalar) -> one vector LOAD whose gate is a bool vector, printed
    as a masked load (`masked_load_helper`): the masked-off lanes read nothing, so their addresses may lie outside
    the buffer, as the scalar gated loads' could."""
    if x.dtype.scalar() != dtypes.float32 or x.dtype.count not in MASKED_LOAD_LANES:
        return None
    if not all(s.op is Ops.LOAD and s.dtype.count == 1 and s.src[0].op is Ops.INDEX for s in x.src):
        return None
    idxs = [s.src[0] for s in x.src]
    if not any(len(i.src) > 2 for i in idxs) or any(i.src[0] is not idxs[0].src[0] for i in idxs):
        return None
    for k, i in enumerate(idxs[1:], 1):
        if (d := simplify(i.src[1] - idxs[0].src[1])).op is not Ops.CONST or d.arg != k:
            return None
    true = UOp.const(dtypes.bool, True)
    gates = UOp(
        Ops.VECTORIZE, dtypes.bool.vec(x.dtype.count), tuple(i.src[2] if len(i.src) > 2 else true for i in idxs)
    )
    index = UOp(Ops.INDEX, idxs[0].dtype.vec(x.dtype.count), (idxs[0].src[0], idxs[0].src[1], gates))
    return UOp(Ops.LOAD, x.dtype, (index,))


pm_legalize_c = pm_split_vector_ops(C_SCALAR_ONLY_OPS) + PatternMatcher(
    [
        (UPat(Ops.EXP2, name="x"), split_exp2_unless_float32),
        (UPat(Ops.VECTORIZE, name="x"), merge_gated_loads),
    ]
)


# AVX-512's masked loads and stores take a mask register: from a bool vector, the sign bits of its negated bytes
HAVE_AVX512_MASKS = "defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)"
CHAR16_TYPEDEF = "  typedef char xg_char16 __attribute__((vector_size(16)));"


def avx512_mask(g: str) -> str:
    return f"__builtin_ia32_cvtb2mask128(-(xg_char16){g})"


def target_or_loop(have: str, fast: list[str], loop: list[str]) -> list[str]:
    """A helper's body: `fast` where the target has `have` (a preprocessor condition), else `loop` over the lanes."""
    return [f"#if {have}", *fast, "#else", *loop, "#endif"]


def masked_load_helper(name: str, vf: str, vi: str, vb: str, lanes: int) -> str:
    """`name(p, g)`: lanes of `vf` read from `p` where the bool vector `g` is set, 0 elsewhere; masked-off lanes are
    not read (AVX's vmaskmovps and AVX-512's masked loads suppress their faults; without them, a loop reads only the
    set lanes)."""
    if lanes == 16:
        have = HAVE_AVX512_MASKS
        fast = [
            CHAR16_TYPEDEF,
            f"  const {vf} zero = {{0}};",
            f"  return __builtin_ia32_loadups512_mask(p, zero, {avx512_mask('g')});",
        ]
    else:
        builtin = "__builtin_ia32_maskloadps256" if lanes == 8 else "__builtin_ia32_maskloadps"
        have = "defined(__AVX__)"
        fast = [f"  return {builtin}((const {vf}*)p, -__builtin_convertvector(g, {vi}));"]
    loop = [f"  {vf} v = {{0}};", f"  for (int i = 0; i < {lanes}; i++) if (g[i]) v[i] = p[i];", "  return v;"]
    return "\n".join([f"static inline {vf} {name}(const float* p, {vb} g) {{", *target_or_loop(have, fast, loop), "}"])


def rule_c_load(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    """A float32 vector LOAD with a gate is a masked load: a bool vector gate (see `merge_gated_loads`) gives each
    lane's, a bool gates every lane. Never a branch between a plain and a masked load: in an unrolled conv body the
    branches split the loop into blocks, and clang then hoists the loads above them all and spills them."""
    idx = u.src[0]
    n = u.dtype.count
    if len(idx.src) < 3 or u.dtype.scalar() != dtypes.float32 or n not in MASKED_LOAD_LANES:
        return base_uop_rules[Ops.LOAD](r, ctx, u)  # type: ignore[return-value]
    assert isinstance(r, CRenderer)
    gate = idx.src[2]
    vf, vi = r.render_dtype(ctx, u.dtype), r.render_dtype(ctx, dtypes.int32.vec(n))
    vb = r.render_dtype(ctx, dtypes.bool.vec(n))
    name = f"mload_{vf}"
    ctx.helpers.setdefault(name, masked_load_helper(name, vf, vi, vb, n))
    mask = ctx.exprs[gate]
    if gate.dtype.count == 1:
        mask = r.render_vectorize(ctx, dtypes.bool.vec(n), [mask] * n)
    return f"{name}({ctx.exprs[idx.src[0]]}+{ctx.exprs[idx.src[1]]}, {mask})"


def masked_store_helper(name: str, vt: str, scalar: str, vi: str, vb: str, lanes: int, fast: bool) -> str:
    """`name(p, v, g)`: the lanes of `v` (a `vt` of `scalar`) where the bool vector `g` is set go to `p`; the others
    are neither read nor written. float32 uses AVX's vmaskmovps (4, 8 lanes) or AVX-512's masked vmovups (16) when
    `fast` and the target has them, anything else a loop over the lanes."""
    loop = [f"  for (int i = 0; i < {lanes}; i++) if (g[i]) p[i] = v[i];"]
    if not fast:
        body = loop
    elif lanes == 16:
        store = f"  __builtin_ia32_storeups512_mask(p, v, {avx512_mask('g')});"
        body = target_or_loop(HAVE_AVX512_MASKS, [CHAR16_TYPEDEF, store], loop)
    else:
        builtin = "__builtin_ia32_maskstoreps256" if lanes == 8 else "__builtin_ia32_maskstoreps"
        store = f"  {builtin}(({vt}*)p, -__builtin_convertvector(g, {vi}), v);"
        body = target_or_loop("defined(__AVX__)", [store], loop)
    return "\n".join([f"static inline void {name}({scalar}* p, {vt} v, {vb} g) {{", *body, "}"])


def rule_c_store(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    """A vector STORE under a bool vector gate (codegen's vectorize groups a padded row's lanes so) is a masked
    store; any other STORE is printed as usual."""
    idx, value = u.src[0], u.src[1]
    if len(idx.src) < 3 or idx.src[2].dtype.count == 1:
        base_uop_rules[Ops.STORE](r, ctx, u)
        return
    assert isinstance(r, CRenderer)
    n = value.dtype.count
    vt, scalar = r.render_dtype(ctx, value.dtype), r.render_dtype(ctx, value.dtype.scalar())
    vi, vb = r.render_dtype(ctx, dtypes.int32.vec(n)), r.render_dtype(ctx, dtypes.bool.vec(n))
    name = f"mstore_{vt}"
    fast = value.dtype.scalar() == dtypes.float32 and n in MASKED_LOAD_LANES
    ctx.helpers.setdefault(name, masked_store_helper(name, vt, scalar, vi, vb, n, fast))
    ctx.emit(f"{name}({ctx.exprs[idx.src[0]]}+{ctx.exprs[idx.src[1]]}, {ctx.exprs[value]}, {ctx.exprs[idx.src[2]]});")


def exp2_clamp(vf: str, vi: str, lanes: int) -> list[str]:
    """The lines of `exp2_helper` that clamp x to [-151, 128] into `v` (NaN stays NaN): a scalar takes two selects
    (vmaxss/vminss), a vector the comparisons' lane masks (GNU C has no `?:` on vectors). The same values either way."""
    if lanes == 1:
        return [f"  union {{ {vf} f; {vi} i; }} v = {{x < -151.0f ? -151.0f : x > 128.0f ? 128.0f : x}};"]
    return [
        f"  const {vf} zero = {{0}};",
        f"  const {vi} under = x < (zero - 151.0f), over = x > (zero + 128.0f);",
        f"  union {{ {vf} f; {vi} i; }} v = {{x}}, lo = {{zero - 151.0f}}, hi = {{zero + 128.0f}};",
        "  v.i = (v.i & ~(under | over)) | (lo.i & under) | (hi.i & over);",
    ]


def exp2_scale(vf: str, vi: str, lanes: int) -> list[str]:
    """The lines of `exp2_helper` that return p * 2**k: by 2**(k>>1) and then 2**(k - (k>>1)), two normal floats for
    every k of the clamped range, so results down to the denormals and up to inf are rounded once. A scalar whose
    2**k is a normal float (k in [-126, 127], nearly always) multiplies once: p * 2**(k>>1) is exact there, so one
    product rounds to the same bits as two; it saves a fifth of a scalar exp2 (vectors keep the two products)."""
    halves = [
        f"  const {vi} k1 = k >> 1, k2 = k - k1;",
        f"  union {{ {vi} i; {vf} f; }} s1 = {{(k1 + 127) << 23}}, s2 = {{(k2 + 127) << 23}};",
        "  return p * s1.f * s2.f;",
    ]
    if lanes > 1:
        return halves
    one = "  if ((unsigned)(k + 126) <= 253u) { union { int i; float f; } s = {(k + 127) << 23}; return p * s.f; }"
    return [one, *halves]


def exp2_helper(vf: str, vi: str, lanes: int) -> str:
    """`exp2_<vf>(x)`: 2**x on float32 `vf`, a scalar (`lanes` 1, `vi` int) or a vector type (`vi` the int vector of as
    many lanes). Scalar and vector forms are the same sequence of IEEE operations, so every lane of every kernel gets
    the same bits for the same input (a softmax compared with itself must not rank an element above itself). x is
    clamped to [-151, 128] and split into n = round(x) and f in [-0.5, 0.5]: n read from the bits of x + 1.5 * 2**23
    (no float-to-int conversion, whose NaN case C leaves undefined); 2**f by its Taylor polynomial of degree 7
    (truncation error below 1e-8), times 2**n built in the exponent bits (`exp2_scale`). NaN stays NaN. Within
    0.86 ulp of 2**x where the target has FMA (1.14 without)."""
    return "\n".join(
        [
            f"static inline {vf} exp2_{vf}({vf} x) {{",
            *exp2_clamp(vf, vi, lanes),
            f"  union {{ {vf} f; {vi} i; }} r = {{v.f + 12582912.0f}};",
            f"  const {vf} n = r.f - 12582912.0f;",
            f"  const {vf} f = v.f - n;",
            f"  {vf} p = f * 1.5252734e-5f + 1.5403530e-4f;",
            "  p = p * f + 1.3333558e-3f;",
            "  p = p * f + 9.6181291e-3f;",
            "  p = p * f + 5.5504109e-2f;",
            "  p = p * f + 2.4022651e-1f;",
            "  p = p * f + 6.9314718e-1f;",
            "  p = p * f + 1.0f;",
            f"  const {vi} k = r.i - 0x4B400000;  /* 0x4B400000: the bits of 1.5 * 2**23 */",
            *exp2_scale(vf, vi, lanes),
            "}",
        ]
    )


def rule_c_exp2(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str | None:
    """float32 EXP2, scalar or vector, calls `exp2_helper`'s function of its type; float64 and half (whose vectors
    legalize split into lanes) call libm per lane."""
    if u.dtype.scalar() != dtypes.float32:
        return rule_alu(r, ctx, u)
    vf, vi = r.render_dtype(ctx, u.dtype), r.render_dtype(ctx, dtypes.int32.vec(u.dtype.count))
    ctx.helpers.setdefault(f"exp2_{vf}", exp2_helper(vf, vi, u.dtype.count))
    return f"exp2_{vf}({ctx.exprs[u.src[0]]})"


def divmod_helper(name: str, op: Ops, t: str, unsigned: bool) -> str:
    """`name(a, b)`: xgrad's total IDIV or MOD on C type `t` (see xgrad.uop.symbolic): a / 0 is 0 and a % 0 is a,
    MIN / -1 wraps to MIN (-a under -fwrapv) and MIN % -1 is 0; x86's idiv traps (SIGFPE) on both."""
    if op is Ops.IDIV:
        body = "b == 0 ? 0 : a / b" if unsigned else f"b == 0 ? 0 : b == -1 ? ({t})(-a) : ({t})(a / b)"
    else:
        body = "b == 0 ? a : a % b" if unsigned else f"b == 0 ? a : b == -1 ? 0 : ({t})(a % b)"
    return f"static inline {t} {name}({t} a, {t} b) {{ return {body}; }}"


def rule_c_divmod(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    """Int IDIV/MOD whose divisor may be 0 (or -1 under a dividend that may be the minimum) calls a guarded helper
    (`divmod_helper`); a divisor the bounds keep safe (every index computation, every constant) is C's `/`, `%`."""
    if dtypes.is_float(u.dtype) or not (divisor_may_be_zero(u) or quotient_may_overflow(u)):
        return rule_alu(r, ctx, u)
    name = f"{u.op.name.lower()}_{u.dtype.name}"
    ctx.helpers.setdefault(name, divmod_helper(name, u.op, r.render_dtype(ctx, u.dtype), dtypes.is_unsigned(u.dtype)))
    return f"{name}({ctx.exprs[u.src[0]]}, {ctx.exprs[u.src[1]]})"


def c_sizeof(dtype: DType) -> int:
    """Bytes of one lane as C stores it (index is printed as int)."""
    return 4 if dtype.scalar() == dtypes.index else dtype.scalar().itemsize


def rule_c_param(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    """A buffer argument is `data<i>`; a scratch PARAM (negative arg, see xgrad_codegen.pack) is the local `pack<k>`."""
    name = f"pack{-1 - u.arg}" if u.arg < 0 else f"data{u.arg}"
    ctx.taken.add(name)
    ctx.exprs[u] = name
    ctx.params.append((u, name, u in ctx.written))


class CRenderer(CStyleRenderer):
    """C for the CPU backend. `arch` is the `-march` target the source is compiled for (None: the host);
    `vector_width` is how many float32 lanes its widest vector register holds (the CPU device asks its compiler:
    16 with AVX-512, else 8)."""

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
    uop_rules: ClassVar[dict[Ops, UopRule]] = {
        **base_uop_rules,
        Ops.PARAM: rule_c_param,
        Ops.EXP2: rule_c_exp2,
        Ops.LOAD: rule_c_load,
        Ops.STORE: rule_c_store,
        Ops.IDIV: rule_c_divmod,
        Ops.MOD: rule_c_divmod,
    }
    native_dtypes = frozenset({dtypes.bool, *dtypes.ints, dtypes.index, dtypes.float16, dtypes.float32, dtypes.float64})
    has_local = False
    legalize = pm_legalize_c
    infinity = "__builtin_inff()"
    nan = '__builtin_nanf("")'
    parallel_range_bounds = ("start", "end")
    buffer_qualifier = " restrict"
    # codegen may PACK a strided panel into a local array (at most xgrad_codegen.pack.MAX_SCRATCH_BYTES per kernel):
    # it lives on the stack of the calling thread, which `_pool.c` sizes for it
    supports_scratch = True
    masked_stores = True  # a padded row's last vector is stored under a per-lane mask (`rule_c_store`)

    def __init__(self, arch: str | None = None, vector_width: int = 8) -> None:
        super().__init__()
        self.arch = arch
        # 8: 256-bit registers (AVX2) hold 8 floats; vectors wider than the registers are split by the compiler
        self.max_vector_width = vector_width

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
        if u.arg < 0:  # a scratch array, 64-byte aligned so vector accesses never split a cache line
            size = int(u.src[0].arg)
            return f"{self.render_dtype(ctx, u.dtype)} {name}[{size}] __attribute__((aligned(64)));"
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


__all__ = ["CRenderer", "pm_legalize_c", "C_SCALAR_ONLY_OPS", "exp2_helper"]
