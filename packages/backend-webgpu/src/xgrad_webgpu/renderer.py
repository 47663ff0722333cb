"""The WGSL renderer: linear program in, one WGSL compute shader out.

Kernel ABI (what `xgrad_webgpu.device` binds):
    @group(0) @binding(i) var<storage, read|read_write> data<i>: array<T>;   one per PARAM i
    @group(0) @binding(n) var<storage, read> xvars: array<i32>;             the variables, if the kernel has any
    var<workgroup> temp<j>: array<T, n>;                                    one per DEFINE_LOCAL (shared memory)
    @compute @workgroup_size(lx, ly, lz) fn main(@builtin(workgroup_id) gid, @builtin(local_invocation_id) lid)
Codegen lowers the kernel for workgroups (`xgrad_codegen.gpu`): SPECIAL `gidx<d>` is `gid.<d>`, `lidx<d>` is
`lid.<d>`, the workgroup size is the sizes of the `lidx` SPECIALs and the device dispatches as many workgroups as
the `gidx` SPECIALs say (within the adapter's limits, which the renderer declares); BARRIER is `workgroupBarrier()`.
A kernel without SPECIALs is one workgroup of one invocation.

What WGSL lacks, and what this renderer does about it:
- Storage holds 32-bit words only (f32, i32, u32; f16 with the `shader-f16` feature). bool, int8/uint8 and
  int16/uint16 buffers are packed into u32 words: a load reads the word and shifts/masks (sign-extends) the lane; a
  store clears and sets the lane's bits with `atomicAnd`/`atomicOr`, so neighbouring lanes written by other
  invocations survive. Their values live in i32/u32 (bool in `bool`) and every op that can leave the narrow range is
  wrapped, as C's integer promotion would be. bfloat16/fp8 are emulated by codegen on uint16/uint8 memory.
- No 64-bit types: int64, uint64 and float64 raise `DTypeError` naming the limit.
- Shift counts must be u32; `select(false_value, true_value, cond)`; inf/NaN have no literal (built with bitcast;
  float16 ones convert the float32 bits: naga cannot bitcast to vec2<f16>); `>` and `^` do not exist on bool
  (legalised below); integer division by zero does not trap (WGSL gives the dividend; xgrad's 0 is selected).
- Compilers may assume floats are never NaN (lavapipe folds `x != x` to false): float comparisons and MAX test for
  NaN on the bits, so they follow IEEE (and MAX propagates a NaN from either operand) on every adapter.
- EXP2, LOG2 and SIN are not listed as supported: codegen's accurate approximations replace them (WGSL's builtins
  only promise 2**-11 absolute error for sin).
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat
from xgrad_codegen.renderer import (
    CStyleRenderer,
    RenderState,
    base_uop_rules,
    divisor_may_be_zero,
    infix_code_for_op,
    round_float,
)

F16_FEATURE = "shader-f16"

# dtypes whose buffers are packed into u32 words: bits per element
PACKED_BITS: dict[DType, int] = {
    dtypes.bool: 8,
    dtypes.int8: 8,
    dtypes.uint8: 8,
    dtypes.int16: 16,
    dtypes.uint16: 16,
}
NARROW_INTS = frozenset({dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16})
# why a dtype cannot be rendered (DTypeError text)
UNSUPPORTED_REASON: dict[DType, str] = {
    dtypes.int64: "WGSL has no 64-bit integers (storage holds 32-bit words: f32, i32, u32)",
    dtypes.uint64: "WGSL has no 64-bit integers (storage holds 32-bit words: f32, i32, u32)",
    dtypes.float64: "WGSL has no float64 (storage holds 32-bit words: f32, i32, u32)",
    dtypes.float16: f"WGSL has f16 only with the WebGPU feature {F16_FEATURE!r}, which this adapter does not offer",
}


def wrap_narrow(expr: str, dtype: DType) -> str:
    """An i32/u32 expression reduced to the range of narrow int `dtype` (two's complement wraparound)."""
    bits = 8 * dtype.itemsize
    if dtypes.is_unsigned(dtype):
        return f"({expr} & {(1 << bits) - 1:#x}u)"
    return f"(({expr} << {32 - bits}u) >> {32 - bits}u)"


# WGSL lets shader compilers assume that floats are never NaN (lavapipe folds `x != x` to false), so wherever a NaN
# changes a result, it is detected on the bits: exponent all ones and a nonzero mantissa.
FINITE_LITERAL = re.compile(r"^\(?-?[0-9][0-9.e+-]*[fh]\)?$")
NEGATIVE_LITERAL = re.compile(r"\(?-[0-9]+i\)?")  # an index that folded to a negative integer constant
_INF_BITS = ("bitcast<f32>(0x7f800000u)", "bitcast<f32>(0xff800000u)")  # +inf, -inf as `render_float` prints them
INF_LITERALS = frozenset([*_INF_BITS, *(f"f16({b})" for b in _INF_BITS)])


def wgsl_isnan(x: str, dtype: DType) -> str:
    bits = f"bitcast<u32>({x})" if dtype.itemsize == 4 else f"bitcast<u32>(f32({x}))"
    return f"(({bits} & 0x7fffffffu) > 0x7f800000u)"


def any_nan(operands: list[str], dtype: DType) -> str:
    """A WGSL bool: is one of the float `operands` NaN? Empty when all are finite literals."""
    return " || ".join(wgsl_isnan(x, dtype) for x in operands if not (FINITE_LITERAL.match(x) or x in INF_LITERALS))


def wgsl_max(a: str, b: str, dtype: DType) -> str:
    """(a > b ? a : b) where a NaN in either operand propagates, tested on the bits (see above)."""
    cond = f"({a} > {b})"
    if not dtypes.is_float(dtype):
        return f"select({b}, {a}, {cond})"
    if nan_b := any_nan([b], dtype):
        cond = f"({cond} && !{nan_b})"
    if nan_a := any_nan([a], dtype):
        cond = f"({nan_a} || {cond})"
    return f"select({b}, {a}, {cond})"


def wgsl_float_compare(op: Ops, operands: list[str], src_dtype: DType) -> str:
    """IEEE comparisons whatever the compiler assumes: NaN is unequal to everything and unordered."""
    expr = code_for_op_wgsl[op](*operands, dtype=dtypes.bool)
    if not (nans := any_nan(operands, src_dtype)):
        return expr
    return f"({expr} || {nans})" if op is Ops.CMPNE else f"({expr} && !({nans}))"


def wgsl_neg(x: str, dtype: DType) -> str:
    return f"(0u - {x})" if dtypes.is_unsigned(dtype) else f"(-{x})"


def wgsl_trunc(x: str, dtype: DType) -> str:
    return f"trunc({x})" if dtypes.is_float(dtype) else x


# the C family's infix operators with spaces, and what WGSL prints otherwise
code_for_op_wgsl: dict[Ops, Callable[..., str]] = {
    **infix_code_for_op(" "),
    Ops.NEG: wgsl_neg,
    Ops.RECIPROCAL: lambda x, dtype: f"(1.0 / {x})",
    Ops.SQRT: lambda x, dtype: f"sqrt({x})",
    Ops.TRUNC: wgsl_trunc,
    Ops.MAX: wgsl_max,
    Ops.SHL: lambda a, b, dtype: f"({a} << u32({b}))",  # shift counts must be u32
    Ops.SHR: lambda a, b, dtype: f"({a} >> u32({b}))",
    Ops.WHERE: lambda c, a, b, dtype: f"select({b}, {a}, {c})",
}

FLOAT_COMPARES = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
# ops whose i32/u32 result can leave the range of a narrow int dtype
WRAP_OPS = frozenset({Ops.NEG, Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.SHL, Ops.MULACC})


# ---- legalisation: what WGSL lacks on bool ----
def _true() -> UOp:
    return UOp.const(dtypes.bool, True)


def or_for_bool_max(a: UOp, b: UOp) -> UOp:
    return UOp(Ops.OR, dtypes.bool, (a, b))


def and_not_for_bool_cmplt(a: UOp, b: UOp) -> UOp:
    return UOp(Ops.AND, dtypes.bool, (UOp(Ops.CMPNE, dtypes.bool, (a, _true())), b))


def cmpne_for_bool_xor(a: UOp, b: UOp) -> UOp:
    return UOp(Ops.CMPNE, dtypes.bool, (a, b))


_BOOL = dtypes.bool
pm_legalize_wgsl = PatternMatcher(
    [
        (UPat(Ops.MAX, _BOOL, src=(UPat.var("a"), UPat.var("b"))), or_for_bool_max),
        (UPat(Ops.CMPLT, src=(UPat.var("a", _BOOL), UPat.var("b", _BOOL))), and_not_for_bool_cmplt),
        (UPat(Ops.XOR, _BOOL, src=(UPat.var("a"), UPat.var("b"))), cmpne_for_bool_xor),
    ]
)


# ---- uop rules that differ from the C family ----
def rule_define_local_wgsl(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    """A workgroup array: declared at module scope (`render_kernel`), named here."""
    name = ctx.new_name("temp")
    ctx.exprs[u] = name
    ctx.shared.append((u, name))


def buffer_of(ctx: RenderState, name: str) -> tuple[DType, bool] | None:
    """The element dtype of storage buffer `name` and whether the kernel writes it; None for a workgroup array (it
    holds the register types, never packed words)."""
    return next(((u.dtype.scalar(), written) for u, n, written in ctx.params if n == name), None)


# (x + M) - M rounds x to an integer (ties to even) when M is 2**23 or 1.5*2**23; codegen's approximations use it.
# Shader compilers treat WGSL float math as reassociable and fold it to x (lavapipe does), so it is printed as round().
ROUNDING_MAGIC = frozenset({2.0**23, 1.5 * 2.0**23})


def rule_add_wgsl(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    inner, c2 = u.src
    if (
        u.dtype == dtypes.float32
        and inner.op is Ops.ADD
        and c2.op is Ops.CONST
        and (c1 := inner.src[1]).op is Ops.CONST
        and c1.arg in ROUNDING_MAGIC
        and c2.arg == -c1.arg
    ):
        return f"round({ctx.exprs[inner.src[0]]})"
    return base_uop_rules[Ops.ADD](r, ctx, u) or ""


def rule_idiv_wgsl(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    """WGSL's a / 0 is a (MIN / -1 is MIN, as xgrad defines it); xgrad's a IDIV 0 is 0, selected where the divisor
    may be 0. MOD, printed as a - (a / b) * b, is then a, as xgrad defines it."""
    expr = base_uop_rules[Ops.IDIV](r, ctx, u) or ""
    if dtypes.is_float(u.dtype) or not divisor_may_be_zero(u):
        return expr
    b, zero = ctx.exprs[u.src[1]], r.render_const(0, u.dtype)
    return f"select({expr}, {zero}, {b} == {zero})"


uop_rules_wgsl = {
    **base_uop_rules,
    Ops.DEFINE_LOCAL: rule_define_local_wgsl,
    Ops.ADD: rule_add_wgsl,
    Ops.IDIV: rule_idiv_wgsl,
}


# a CPU driver's thread keeps busy without GROUP when each of its SIMD lanes has this many outputs to compute
CPU_OUTPUTS_PER_LANE = 16


@dataclass(frozen=True)
class CpuAdapter:
    """A WebGPU adapter that is a CPU driver (Mesa's lavapipe): it runs a workgroup on one of `threads` CPU threads,
    its invocations as SIMD lanes of compiled code, `lanes` at a time (llvmpipe names its vector width: `llvmpipe
    (LLVM 15.0.6, 256 bits)` is 8 float lanes). The GPU heuristic then fills workgroups to at least `lanes` threads
    (`Renderer.min_local`) and keeps reductions in one thread when the kernel has enough outputs for every lane
    (`Renderer.group_max_outputs`): a group reduction's barriers switch between the invocations of a workgroup,
    which costs a CPU far more than a GPU (the demo's conv weight gradient: 3.8 ms with GROUP, 1.4 ms without)."""

    threads: int
    lanes: int


class WGSLRenderer(CStyleRenderer):
    """WGSL for WebGPU. `arch` is a comma-separated list of enabled WebGPU features; "shader-f16" enables float16."""

    device = "WEBGPU"
    name = "WGSL"
    type_map: ClassVar[dict[DType, str]] = {
        dtypes.bool: "bool",
        dtypes.int8: "i32",
        dtypes.uint8: "u32",
        dtypes.int16: "i32",
        dtypes.uint16: "u32",
        dtypes.int32: "i32",
        dtypes.uint32: "u32",
        dtypes.index: "i32",
        dtypes.float32: "f32",
        dtypes.float16: "f16",
    }
    vector_type_prefix: ClassVar[dict[DType, str]] = {}
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = code_for_op_wgsl
    uop_rules = uop_rules_wgsl
    legalize = pm_legalize_wgsl
    max_vector_width = 1
    # MAX and float comparisons print their operands again in the NaN test: they are named, never inlined
    ops_repeating_operands: ClassVar[frozenset[Ops]] = frozenset({Ops.MAX, *FLOAT_COMPARES})
    float_suffix: ClassVar[dict[DType, str]] = {dtypes.float32: "f", dtypes.float16: "h"}
    reserved_names: ClassVar[frozenset[str]] = frozenset(
        {"gid", "lid", "xvars", "main", "fn", "let", "var", "const", "if", "else", "for", "loop", "while"}
        | {"return", "break", "continue", "switch", "case", "default", "struct", "true", "false", "bitcast"}
        | {"select", "array", "atomic", "bool", "i32", "u32", "f32", "f16", "enable", "override", "alias"}
    )
    # workgroups: the limits WebGPU guarantees on every adapter (the spec's defaults); the device passes its own
    has_local = True
    has_shared = True
    global_max: tuple[int, ...] = (65535, 65535, 65535)
    local_max: tuple[int, ...] = (256, 256, 64)
    max_threads = 256
    shared_max = 16384

    def __init__(
        self, arch: str | None = None, limits: Mapping[str, int] | None = None, cpu: CpuAdapter | None = None
    ) -> None:
        """`limits`: a WebGPU device's limits (`device.limits`); the workgroup limits are read from them. `cpu`: the
        threads and SIMD lanes of an adapter that is a CPU driver (lavapipe), which sets the GPU heuristic's
        preferences for it (see `CpuAdapter`); None for a GPU."""
        super().__init__()
        if limits is not None:
            self.global_max = (int(limits["max-compute-workgroups-per-dimension"]),) * 3
            self.local_max = tuple(int(limits[f"max-compute-workgroup-size-{d}"]) for d in "xyz")
            self.max_threads = int(limits["max-compute-invocations-per-workgroup"])
            self.shared_max = int(limits["max-compute-workgroup-storage-size"])
        if cpu is not None:
            self.min_local = cpu.lanes
            self.group_max_outputs = cpu.threads * cpu.lanes * CPU_OUTPUTS_PER_LANE
        self.arch = arch
        self.features = frozenset(f.strip() for f in (arch or "").split(",") if f.strip())
        supported = {*PACKED_BITS, dtypes.int32, dtypes.uint32, dtypes.index, dtypes.float32}
        if F16_FEATURE in self.features:
            supported.add(dtypes.float16)
        self.native_dtypes = frozenset(supported)

    # ---- types and constants ----
    def render_dtype(self, ctx: RenderState | None, dtype: DType) -> str:
        scalar = dtype.scalar()
        if scalar not in self.native_dtypes:
            why = UNSUPPORTED_REASON.get(scalar, "WGSL has no such type and codegen did not emulate it")
            raise DTypeError(f"the WGSL renderer cannot use {scalar!r}: {why}")
        if dtype.count > 1:
            raise DTypeError(f"the WGSL renderer has max_vector_width 1 but got {dtype!r}")
        if ctx is not None and scalar == dtypes.float16:
            ctx.helpers.setdefault("enable f16", "enable f16;")
        return self.type_map[scalar]

    def render_const(self, value: object, dtype: DType) -> str:
        if dtypes.is_bool(dtype):
            return "true" if value else "false"
        self.render_dtype(None, dtype)  # refuse dtypes WGSL lacks
        return super().render_const(value, dtype)

    def render_int(self, value: int, dtype: DType) -> str:
        if dtypes.is_unsigned(dtype):
            return f"{value & 0xFFFFFFFF}u"
        if value == -(2**31):
            return "(-2147483647i - 1i)"  # 2147483648i does not exist
        return f"({value}i)" if value < 0 else f"{value}i"

    def render_float(self, value: float, dtype: DType) -> str:
        rounded = round_float(value, dtype)
        if math.isfinite(rounded):
            text = f"{rounded!r}{self.float_suffix[dtype]}"
            return f"({text})" if text.startswith("-") else text
        # no literal for inf/NaN, and const-expressions must not overflow: build the float32 bits (f16 converts
        # them; naga cannot bitcast to vec2<f16>)
        bits = f"bitcast<f32>({struct.unpack('<I', struct.pack('<f', rounded))[0]:#x}u)"
        return f"f16({bits})" if dtype == dtypes.float16 else bits

    # ---- ALU ----
    def render_alu(self, op: Ops, dtype: DType, operands: list[str], src_dtypes: list[DType]) -> str:
        if op in FLOAT_COMPARES and dtypes.is_float(src_dtypes[0]):
            return wgsl_float_compare(op, operands, src_dtypes[0])
        if op is Ops.MOD and not dtypes.is_float(dtype):
            # a - (a / b) * b, WGSL's truncated remainder: wgpu's OpenGL backend (Mesa's llvmpipe where Vulkan is
            # missing) prints `%` as GLSL's, undefined for negative operands (it gave -7 % 3 == 0); `/` truncates
            a, b = operands
            return f"({a} - ({a} / {b}) * {b})"
        expr = self.code_for_op[op](*operands, dtype=dtype)
        if dtype in NARROW_INTS and op in WRAP_OPS:
            return wrap_narrow(expr, dtype)
        return expr

    def render_cast(self, ctx: RenderState, dtype: DType, src_dtype: DType, x: str) -> str:
        if dtypes.is_bool(dtype):
            return x if dtypes.is_bool(src_dtype) else f"({x} != {self.render_const(0, src_dtype)})"
        expr = f"{self.render_dtype(ctx, dtype)}({x})"
        return wrap_narrow(expr, dtype) if dtype in NARROW_INTS else expr

    def render_bitcast(self, ctx: RenderState, dtype: DType, src_dtype: DType, x: str) -> str:
        if dtype.itemsize == 4:
            return f"bitcast<{self.render_dtype(ctx, dtype)}>({x})"
        # 16-bit floats through the pack builtins (exact for f16 values; naga cannot bitcast vec2<f16>)
        if dtype == dtypes.float16:  # from a 16-bit int held in i32/u32
            return f"f16(unpack2x16float(u32({x}) & 0xffffu).x)"
        if src_dtype == dtypes.float16:
            bits = f"(pack2x16float(vec2<f32>(f32({x}), 0.0f)) & 0xffffu)"
            return bits if dtypes.is_unsigned(dtype) else wrap_narrow(f"i32({bits})", dtype)
        return self.render_cast(ctx, dtype, src_dtype, x)  # narrow ints: the same bits are a wrapping conversion

    # ---- memory ----
    def render_load(self, ctx: RenderState, dtype: DType, buf: str, idx: str, gate: str | None) -> str:
        if gate is not None and NEGATIVE_LITERAL.fullmatch(idx):
            # a lane whose index folded to a negative constant is one the gate turns off (select still evaluates the
            # load): WGSL rejects the shader for a constant negative index, so that lane reads element 0 instead
            idx = "0i"
        storage = buffer_of(ctx, buf)
        if storage is not None and storage[0] in PACKED_BITS:
            value = self._packed_load(storage[0], buf, idx, storage[1])
        else:
            value = f"{buf}[{idx}]"
        return f"select({self.render_const(0, dtype)}, {value}, {gate})" if gate is not None else value

    def _packed_load(self, mem: DType, buf: str, idx: str, written: bool) -> str:
        bits = PACKED_BITS[mem]
        per_word = 32 // bits
        word = f"{buf}[({idx}) / {per_word}i]"
        word = f"atomicLoad(&{word})" if written else word
        shift = f"(u32(({idx}) % {per_word}i) * {bits}u)"
        if dtypes.is_bool(mem):
            return f"((({word} >> {shift}) & 0xffu) != 0u)"
        if dtypes.is_unsigned(mem):
            return f"(({word} >> {shift}) & {(1 << bits) - 1:#x}u)"
        return f"(bitcast<i32>({word} << ({32 - bits}u - {shift})) >> {32 - bits}u)"

    def render_store(self, ctx: RenderState, dtype: DType, buf: str, idx: str, value: str, gate: str | None) -> str:
        storage = buffer_of(ctx, buf)
        if storage is not None and (mem := storage[0]) in PACKED_BITS:
            bits = PACKED_BITS[mem]
            per_word = 32 // bits
            mask = f"{(1 << bits) - 1:#x}u"
            lane = f"select(0u, 1u, {value})" if dtypes.is_bool(dtype) else f"(u32({value}) & {mask})"
            word = f"&{buf}[({idx}) / {per_word}i]"
            shift = f"(u32(({idx}) % {per_word}i) * {bits}u)"
            stmt = f"atomicAnd({word}, ~({mask} << {shift})); atomicOr({word}, {lane} << {shift});"
        else:
            stmt = f"{buf}[{idx}] = {value};"
        return f"if ({gate}) {{ {stmt} }}" if gate is not None else stmt

    def render_declare(self, ctx: RenderState, dtype: DType, name: str, expr: str, mutable: bool) -> str:
        return f"{'var' if mutable else 'let'} {name}: {self.render_dtype(ctx, dtype)} = {expr};"

    def render_range(self, ctx: RenderState, dtype: DType, name: str, start: str, end: str) -> str:
        t = self.render_dtype(ctx, dtype)
        return f"for (var {name}: {t} = {start}; {name} < {end}; {name}++) {{"

    # ---- the kernel ----
    def render_buffer_decl(self, ctx: RenderState, u: UOp, name: str, written: bool) -> str:
        mem = u.dtype.scalar()
        if mem in PACKED_BITS:
            elem = "atomic<u32>" if written else "u32"
        else:
            elem = self.render_dtype(ctx, mem)
        access = "read_write" if written else "read"
        return f"@group(0) @binding({u.arg}) var<storage, {access}> {name}: array<{elem}>;"

    def render_var_decl(self, ctx: RenderState, u: UOp, name: str, k: int) -> str:
        return f"let {name}: {self.render_dtype(ctx, u.dtype)} = xvars[{k}];"

    def render_special(self, ctx: RenderState, u: UOp) -> str:
        name, _ = u.arg
        return f"i32({'gid' if name.startswith('gidx') else 'lid'}.{'xyz'[int(name[-1])]})"

    def render_barrier(self) -> str:
        return "workgroupBarrier();"

    def render_kernel(self, ctx: RenderState, name: str, body: list[str]) -> str:
        buffers = [self.render_buffer_decl(ctx, u, n, w) for u, n, w in ctx.params]
        if ctx.variables:
            binding = max(u.arg for u, _, _ in ctx.params) + 1 if ctx.params else 0
            buffers.append(f"@group(0) @binding({binding}) var<storage, read> xvars: array<i32>;")
        shared = [f"var<workgroup> {n}: array<{self.render_dtype(ctx, u.dtype)}, {u.arg[1]}>;" for u, n in ctx.shared]
        decls = [self.render_var_decl(ctx, u, n, k) for u, n, k in ctx.variables]
        size = [1, 1, 1]  # threads per workgroup (x, y, z): the sizes of the lidx SPECIALs
        for u in ctx.uops:
            if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx"):
                size[int(u.arg[0][-1])] = int(u.arg[1])
        head = [
            f"// kernel {name}",
            f"@compute @workgroup_size({size[0]}, {size[1]}, {size[2]})",
            "fn main(@builtin(workgroup_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {",
        ]
        prefix = self.render_prefix(ctx)
        return "\n".join([*prefix, *buffers, *shared, *head, *("  " + d for d in decls), *body, "}"]) + "\n"


__all__ = ["WGSLRenderer", "pm_legalize_wgsl", "PACKED_BITS", "UNSUPPORTED_REASON", "F16_FEATURE"]
