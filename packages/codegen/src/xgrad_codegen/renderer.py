"""Renderers: linear program (list of UOps ending in SINK) in, kernel source text out.

`Renderer` is what codegen sees of a target: capability attributes (ops, dtypes, vector width, locals, launch limits)
and a `legalize` table of rewrites for what the language lacks. `CStyleRenderer` is the shared printer of the C family
(C, CUDA, HIP, and with other type and declaration hooks WGSL): every language difference is a table entry
(`type_map`, `code_for_op`, `uop_rules`) or a small hook method, never a branch on a device name.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError
from xgrad.uop.ops import AxisType, GroupOp, KernelInfo, Ops, UOp
from xgrad.uop.pattern import PatternMatcher
from xgrad_codegen.legalize import PURE_OPS as _PURE
from xgrad_codegen.legalize import legalize_linear, pm_split_vector_ops, split_vector_alu

EMULATED = frozenset({dtypes.bfloat16, *dtypes.fp8s})  # what decompositions_for emulates where a target lacks it


@dataclass(frozen=True)
class TensorCore:
    """One matrix instruction a GPU offers: D (m x n, `acc` dtype) = A (m x k, `dtype`) @ B (k x n, `dtype`) + C,
    computed by `threads` threads together (a warp or wave), each holding some elements of A, B and C/D in registers.
    Declared by a renderer in `tensor_cores`.

    Register layouts (`a`, `b`, `c`): where element `e` held by lane `l` sits in its matrix, as bit maps: bit i of `l`
    adds `lane[i] = (axis, weight)` and bit j of `e` adds `elem[j]`, axis 0 the row and 1 the column (A: m x k, B:
    k x n, C/D: m x n); weight 0 means the bit does not move the element (lanes holding copies of one operand)."""

    name: str
    dims: tuple[int, int, int]  # (m, n, k)
    dtype: DType
    acc: DType
    threads: int
    a: tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]  # (lane bits, element bits) of A
    b: tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]
    c: tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]

    def elements(self, operand: str) -> int:
        """Elements of `operand` ("a", "b" or "c") each lane holds."""
        return 1 << len(getattr(self, operand)[1])

    def place(self, operand: str, lane: int, e: int) -> tuple[int, int]:
        """(row, column) of element `e` of lane `lane` in `operand`'s matrix."""
        lane_bits, elem_bits = getattr(self, operand)
        pos = [0, 0]
        for bits, value in ((lane_bits, lane), (elem_bits, e)):
            for i, (axis, weight) in enumerate(bits):
                pos[axis] += weight * ((value >> i) & 1)
        return pos[0], pos[1]


@dataclass(frozen=True)
class AsyncWait:
    """The arg of a BARRIER that also ends asynchronous copies (see `Renderer.async_copy_bytes`): each thread first
    commits the copies it issued since its last commit as one group (cp.async.commit_group), then waits until at
    most `pending` of its groups are still in flight (cp.async.wait_group), then the workgroup meets. Copies of
    groups that are still pending may land in their destination any time before their group completes."""

    pending: int


@dataclass(frozen=True)
class MatrixLoad:
    """The arg of a LOAD from shared memory that one warp runs together (NVIDIA's ldmatrix.sync.aligned.m8n8 .b16, see
    `Renderer.matrix_loads`): `count` 8 x 8 matrices of 16-bit elements, row r of matrix i the 8 elements from the
    place the INDEX of lane 8i + r names. Lane l receives two elements of each matrix i, at row l // 4, columns
    2 (l % 4) and 2 (l % 4) + 1; `trans`: at rows 2 (l % 4) and 2 (l % 4) + 1 of column l // 4. The LOAD's dtype
    (and its INDEX's) holds 2 x `count` elements, matrix by matrix."""

    count: int
    trans: bool = False


class Renderer:
    """A target language. Codegen reads exactly these attributes (and nothing through `getattr` defaults); `render`
    prints one kernel. A CPU target keeps the GPU attributes at their defaults (no workgroups, no shared memory)."""

    device: str = ""
    name: str = ""
    arch: str | None = None
    supported_ops: frozenset[Ops] = frozenset()  # ALU ops rendered natively; codegen decomposes the others
    native_dtypes: frozenset[DType] = frozenset()  # scalar dtypes the language has; codegen emulates bf16/fp8
    max_vector_width: int = 1  # widest vector dtype (in lanes) codegen may produce
    # widest vector load/store (bytes) printed where codegen proves its alignment itself (tc_tile's staged copies of
    # a matmul's tiles), even where `max_vector_width` is 1 because the vectorizer proves none; 0: scalars only
    aligned_vector_bytes: int = 0
    # widest asynchronous global->shared copy (bytes; NVIDIA's cp.async on sm_80+: 4, 8 or 16), printed for tc_tile's
    # staged tiles: a STORE whose value is an INDEX (copy that place's elements; a gate off copies zeros) completes
    # only at a BARRIER whose arg is an `AsyncWait`; 0: no asynchronous copies (tc_tile loads and stores)
    async_copy_bytes: int = 0
    # tc_tile reads 16-bit tensor-core fragments from shared memory with warp-wide matrix loads (a LOAD with a
    # `MatrixLoad` arg: NVIDIA's ldmatrix, sm_75+) where the instruction's register layout is ldmatrix's
    matrix_loads: bool = False
    masked_stores: bool = False  # stores a vector under a bool vector gate, one per lane (codegen's vectorize)
    supports_scratch: bool = False  # PACK may copy a panel into a per-thread scratch array (see xgrad_codegen.pack)
    # ---- GPU: workgroups (GLOBAL axes are workgroup ids, LOCAL/GROUP axes thread ids within one) ----
    has_local: bool = False  # workgroups of several threads: LOCAL/GROUP axes, SPECIAL thread indexes, BARRIER
    has_shared: bool = False  # memory shared by one workgroup's threads (DEFINE_LOCAL): GROUP reductions
    global_max: tuple[int, ...] = ()  # most workgroups per launch dimension (x, y, z); empty: no GPU grid
    local_max: tuple[int, ...] = ()  # most threads per workgroup dimension
    max_threads: int = 1  # most threads in one workgroup (all dimensions together)
    shared_max: int = 0  # bytes of shared memory one workgroup may use
    # preferences of the GPU heuristic (`gpu_opt.gpu_heuristic_opts`): a long reduction is split over a workgroup's
    # threads (GROUP) only in a kernel with fewer outputs than `group_max_outputs` (with more, one thread per output
    # keeps the device busy and GROUP only adds barriers); a workgroup narrower than `min_local` threads wastes lanes
    # (a CPU driver runs a workgroup's threads as SIMD lanes), so the heuristic pads a loop to fill one
    group_max_outputs: int = 16384
    min_local: int = 1
    tensor_cores: tuple[TensorCore, ...] = ()  # matrix instructions (none are used by codegen yet)
    legalize: PatternMatcher | None = None  # this language's own rewrites, applied right before printing

    @property
    def supports_group_reduce(self) -> bool:
        """A reduction may be split over a workgroup's threads (GROUP/GROUPTOP): needs threads and shared memory."""
        return self.has_local and self.has_shared

    def supports_dtype(self, dtype: DType) -> bool:
        return dtype.scalar() in self.native_dtypes

    def supported_dtypes(self) -> list[DType]:
        """The dtypes tensors may hold on this target (tinygrad's renderer method): its `native_dtypes` and those
        codegen emulates with them (bfloat16 and the fp8 formats, see `decompositions_for`), in `dtypes.all` order."""
        return [d for d in dtypes.all if d in self.native_dtypes or d in EMULATED]

    def compile_only(self, ast: UOp) -> str:
        """Run the codegen pipeline for this renderer and print the source (the NULL device's compile step)."""
        from xgrad_codegen.pipeline import full_rewrite

        name = ast.arg.name if isinstance(ast.arg, KernelInfo) else "kernel"
        return self.render(name, full_rewrite(ast, self))

    def render(self, name: str, uops: list[UOp]) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement render(name, uops)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r}, arch={self.arch!r})"


# ---------------------------------------------------------------------------------------------------------------------
# the C-family printer


@dataclass
class RenderState:
    """What one `render` call knows: names of rendered values, emitted lines, buffers and variables seen."""

    uops: list[UOp]
    users: dict[UOp, list[int]] = field(default_factory=dict)  # value -> positions of the UOps that read it
    barriers: list[int] = field(default_factory=list)  # barriers[i]: side effects/scope changes before position i
    exprs: dict[UOp, str] = field(default_factory=dict)  # value -> its variable name or inline expression
    lines: list[str] = field(default_factory=list)
    depth: int = 1
    counters: dict[str, int] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    params: list[tuple[UOp, str, bool]] = field(default_factory=list)  # (PARAM, name, written)
    shared: list[tuple[UOp, str]] = field(default_factory=list)  # (DEFINE_LOCAL, name): workgroup shared arrays
    variables: list[tuple[UOp, str, int]] = field(default_factory=list)  # (DEFINE_VAR, name, position in vars)
    vector_types: dict[str, DType] = field(default_factory=dict)  # vector type name -> dtype, in order of first use
    helpers: dict[str, str] = field(default_factory=dict)  # helper name -> definition (type preludes, functions)
    written: set[UOp] = field(default_factory=set)  # PARAMs that are stored to
    parallel_range: UOp | None = None  # the first GLOBAL range
    pos: int = 0  # position of the UOp being rendered
    nesting: dict[UOp, int] = field(default_factory=dict)  # inlined value -> how many inlined ops it nests

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def new_name(self, prefix: str) -> str:
        while True:
            n = self.counters.get(prefix, 0)
            self.counters[prefix] = n + 1
            if (name := f"{prefix}{n}") not in self.taken:
                self.taken.add(name)
                return name


UopRule = Callable[["CStyleRenderer", RenderState, UOp], "str | None"]


def rule_const(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    if u.dtype.count > 1:
        lane = r.render_const(u.arg, u.dtype.scalar())
        return r.render_vectorize(ctx, u.dtype, [lane] * u.dtype.count)
    return r.render_const(u.arg, u.dtype)


def rule_alu(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    operands = [ctx.exprs[s] for s in u.src]
    return r.render_alu(u.op, u.dtype, operands, [s.dtype for s in u.src])


def rule_cast(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    return r.render_cast(ctx, u.dtype, u.src[0].dtype, ctx.exprs[u.src[0]])


def rule_bitcast(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    if u.dtype.itemsize != u.src[0].dtype.itemsize:
        raise DTypeError(f"BITCAST from {u.src[0].dtype!r} to {u.dtype!r} needs equal sizes")
    return r.render_bitcast(ctx, u.dtype, u.src[0].dtype, ctx.exprs[u.src[0]])


def rule_vectorize(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    if len(u.src) == 1 and u.dtype.count == 1:
        return ctx.exprs[u.src[0]]
    return r.render_vectorize(ctx, u.dtype, [ctx.exprs[s] for s in u.src])


def rule_gep(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    lanes = u.arg if isinstance(u.arg, tuple) else (u.arg,)
    vec = ctx.exprs[u.src[0]]
    if u.src[0].dtype.count == 1:
        return vec
    if len(lanes) == 1:
        return r.render_gep(vec, lanes[0])
    return r.render_vectorize(ctx, u.dtype, [r.render_gep(vec, i) for i in lanes])


def rule_load(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    idx = u.src[0]
    buf, pos = ctx.exprs[idx.src[0]], ctx.exprs[idx.src[1]]
    gate = ctx.exprs[idx.src[2]] if len(idx.src) > 2 else None
    return r.render_load(ctx, u.dtype, buf, pos, gate)


def rule_store(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    idx, value = u.src[0], u.src[1]
    buf, pos = ctx.exprs[idx.src[0]], ctx.exprs[idx.src[1]]
    gate = ctx.exprs[idx.src[2]] if len(idx.src) > 2 else None
    ctx.emit(r.render_store(ctx, value.dtype, buf, pos, ctx.exprs[value], gate))


def rule_param(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    name = f"data{u.arg}"
    ctx.taken.add(name)
    ctx.exprs[u] = name
    ctx.params.append((u, name, u in ctx.written))


def rule_define_var(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    raw = str(u.arg[0])
    ok = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", raw) and raw not in ctx.taken and raw not in r.reserved_names
    name = raw if ok else ctx.new_name("var")
    ctx.taken.add(name)
    ctx.exprs[u] = name
    ctx.variables.append((u, name, len(ctx.variables)))


def rule_range(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    name = ctx.new_name("ridx")
    ctx.exprs[u] = name
    if u is ctx.parallel_range and r.parallel_range_bounds is not None:
        start, end = r.parallel_range_bounds
    else:
        start, end = r.render_const(0, u.dtype), ctx.exprs[u.src[0]]
    ctx.emit(r.render_range(ctx, u.dtype, name, start, end))
    ctx.depth += 1


def rule_end(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    ctx.depth -= 1
    ctx.emit("}")


def rule_define_acc(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    name = ctx.new_name("acc")
    ctx.emit(r.render_declare(ctx, u.dtype, name, ctx.exprs[u.src[0]], mutable=True))
    ctx.exprs[u] = name


def rule_assign_acc(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    acc = ctx.exprs[u.src[0]]
    ctx.emit(f"{acc} = {ctx.exprs[u.src[1]]};")
    ctx.exprs[u] = acc


def rule_special(r: CStyleRenderer, ctx: RenderState, u: UOp) -> str:
    return r.render_special(ctx, u)


def rule_define_local(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    name = ctx.new_name("temp")
    ctx.exprs[u] = name
    ctx.shared.append((u, name))
    if (decl := r.render_shared_decl(ctx, u, name)) is not None:
        ctx.emit(decl)


def rule_barrier(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    ctx.emit(r.render_barrier())


def rule_nothing(r: CStyleRenderer, ctx: RenderState, u: UOp) -> None:
    return None


base_uop_rules: dict[Ops, UopRule] = {
    Ops.CONST: rule_const,
    Ops.CAST: rule_cast,
    Ops.BITCAST: rule_bitcast,
    Ops.VECTORIZE: rule_vectorize,
    Ops.GEP: rule_gep,
    Ops.LOAD: rule_load,
    Ops.STORE: rule_store,
    Ops.PARAM: rule_param,
    Ops.DEFINE_VAR: rule_define_var,
    Ops.RANGE: rule_range,
    Ops.END: rule_end,
    Ops.DEFINE_ACC: rule_define_acc,
    Ops.ASSIGN_ACC: rule_assign_acc,
    Ops.SPECIAL: rule_special,
    Ops.DEFINE_LOCAL: rule_define_local,
    Ops.BARRIER: rule_barrier,
    Ops.INDEX: rule_nothing,  # LOAD and STORE read the INDEX's sources themselves
    Ops.SINK: rule_nothing,
    Ops.NOOP: rule_nothing,
    **{op: rule_alu for op in GroupOp.ALU},
}

# values that always get a variable: state and memory reads (a load stays where the program put it)
_NAMED_OPS = frozenset({Ops.LOAD, Ops.DEFINE_ACC, Ops.RANGE, Ops.PARAM, Ops.DEFINE_VAR, Ops.SPECIAL})
MAX_INLINE_NESTING = 64
# UOps with effects or scopes: an expression is never inlined across one of them
_BARRIER_OPS = frozenset({Ops.STORE, Ops.ASSIGN_ACC, Ops.RANGE, Ops.END, Ops.BARRIER})


def divisor_may_be_zero(u: UOp) -> bool:
    """Whether int IDIV/MOD node `u` may divide by 0, by its divisor's bounds."""
    lo, hi = u.src[1].vmin_vmax
    return bool(lo <= 0 <= hi)


def quotient_may_overflow(u: UOp) -> bool:
    """Whether int IDIV/MOD node `u` may divide its dtype's minimum by -1, by its operands' bounds."""
    if dtypes.is_unsigned(u.dtype):
        return False
    lo, hi = u.src[1].vmin_vmax
    return bool(lo <= -1 <= hi and u.src[0].vmin <= dtypes.min(u.dtype.scalar()))


def c_max(a: str, b: str, dtype: DType) -> str:
    """MAX: a NaN in either operand propagates (b's through the failed a>b, a's through a!=a)."""
    if dtypes.is_float(dtype):
        return f"(({a}>{b}||{a}!={a})?{a}:{b})"
    return f"({a}>{b}?{a}:{b})"


# the infix operators C and its relatives (CUDA, HIP, WGSL) share: op -> symbol, printed `(a<symbol>b)`
C_INFIX_OPS: dict[Ops, str] = {
    Ops.ADD: "+",
    Ops.SUB: "-",
    Ops.MUL: "*",
    Ops.FDIV: "/",
    Ops.IDIV: "/",
    Ops.MOD: "%",
    Ops.CMPLT: "<",
    Ops.CMPNE: "!=",
    Ops.CMPEQ: "==",
    Ops.AND: "&",
    Ops.OR: "|",
    Ops.XOR: "^",
    Ops.SHL: "<<",
    Ops.SHR: ">>",
}


@dataclass(frozen=True)
class Infix:
    """Prints a binary op as `(a<symbol>b)`, with `space` on both sides of the symbol."""

    symbol: str
    space: str = ""

    def __call__(self, a: str, b: str, dtype: DType) -> str:
        return f"({a}{self.space}{self.symbol}{self.space}{b})"


@dataclass(frozen=True)
class MulAcc:
    """Prints MULACC as `((a*b)+c)`, with `space` on both sides of each symbol."""

    space: str = ""

    def __call__(self, a: str, b: str, c: str, dtype: DType) -> str:
        return Infix("+", self.space)(Infix("*", self.space)(a, b, dtype), c, dtype)


def infix_code_for_op(space: str = "") -> dict[Ops, Callable[..., str]]:
    """`code_for_op` entries for every op of C_INFIX_OPS and MULACC; a renderer adds its unary ops, MAX, WHERE and
    math functions, and overrides the entries its language prints otherwise."""
    return {**{op: Infix(symbol, space) for op, symbol in C_INFIX_OPS.items()}, Ops.MULACC: MulAcc(space)}


# the C-family operators; math functions differ per language and are added by each renderer
base_code_for_op: dict[Ops, Callable[..., str]] = {
    Ops.NEG: lambda x, dtype: f"(-{x})",
    Ops.RECIPROCAL: lambda x, dtype: f"(1/{x})",
    **infix_code_for_op(),
    Ops.MAX: c_max,
    Ops.WHERE: lambda c, a, b, dtype: f"({c}?{a}:{b})",
}

# ops whose result may not fit an integer type narrower than int after C's integer promotion
_WRAP_NARROW_OPS = frozenset({Ops.NEG, Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.SHL, Ops.MULACC})


class CStyleRenderer(Renderer):
    """The shared C-family printer. Subclasses change tables and hooks:

    - `type_map` (scalar dtype -> type name), `vector_type_prefix` (scalar dtype -> prefix of its vector type names),
    - `code_for_op` (ALU op -> function of the rendered operands and `dtype=`), `uop_rules` (every other UOp kind),
    - hooks: `render_kernel` (signature and prefix), `render_buffer_decl`, `render_var_decl`, `render_range`,
      `render_declare`, `render_load`, `render_store`, `render_cast`, `render_bitcast`, `render_vectorize`,
      `render_gep`, `render_special`, `render_shared_decl`, `render_barrier`, `render_float`.
    """

    type_map: ClassVar[dict[DType, str]] = {
        dtypes.bool: "bool",
        dtypes.int8: "signed char",
        dtypes.uint8: "unsigned char",
        dtypes.int16: "short",
        dtypes.uint16: "unsigned short",
        dtypes.int32: "int",
        dtypes.uint32: "unsigned int",
        dtypes.int64: "long long",
        dtypes.uint64: "unsigned long long",
        dtypes.index: "int",
        dtypes.float16: "half",
        dtypes.float32: "float",
        dtypes.float64: "double",
    }
    vector_type_prefix: ClassVar[dict[DType, str]] = {
        dtypes.bool: "bool",
        dtypes.int8: "char",
        dtypes.uint8: "uchar",
        dtypes.int16: "short",
        dtypes.uint16: "ushort",
        dtypes.int32: "int",
        dtypes.uint32: "uint",
        dtypes.int64: "long",
        dtypes.uint64: "ulong",
        dtypes.index: "int",
        dtypes.float16: "half",
        dtypes.float32: "float",
        dtypes.float64: "double",
    }
    code_for_op: ClassVar[dict[Ops, Callable[..., str]]] = base_code_for_op
    uop_rules: ClassVar[dict[Ops, UopRule]] = base_uop_rules
    ops_repeating_operands: ClassVar[frozenset[Ops]] = frozenset({Ops.MAX})  # operands printed twice: never inline
    reserved_names: ClassVar[frozenset[str]] = frozenset(
        {"bufs", "vars", "start", "end", "int", "float", "double", "char", "short", "long", "if", "for", "while"}
    )
    # when set, the first GLOBAL range runs over these kernel arguments ([start, end)) instead of [0, range end)
    parallel_range_bounds: ClassVar[tuple[str, str] | None] = None
    float_suffix: ClassVar[dict[DType, str]] = {dtypes.float32: "f", dtypes.float64: ""}
    infinity: ClassVar[str] = "INFINITY"  # a float32 +inf
    nan: ClassVar[str] = "NAN"  # a float32 quiet NaN
    name_prefix: ClassVar[dict[Ops, str]] = {
        Ops.LOAD: "val",
        Ops.CAST: "cast",
        Ops.BITCAST: "cast",
        Ops.GEP: "gep",
        Ops.VECTORIZE: "vec",
        Ops.CONST: "const",
        Ops.SPECIAL: "gidx",
    }
    type_prelude: ClassVar[dict[DType, str]] = {}  # definitions a type needs (e.g. a typedef), emitted once if used
    kernel_prefix: ClassVar[str] = ""  # written before the return type, e.g. `extern "C" __global__`
    buffer_qualifier: ClassVar[str] = ""  # e.g. " restrict"

    def __init__(self) -> None:
        self.supported_ops = frozenset(self.code_for_op)

    # ---- the driver ----
    def render(self, name: str, uops: list[UOp]) -> str:
        uops = legalize_linear(uops, self.legalize)
        ctx = self._analyse(uops)
        for pos, u in enumerate(uops):
            ctx.pos = pos
            self._render_uop(ctx, u)
        return self.render_kernel(ctx, name, ctx.lines)

    def _analyse(self, uops: list[UOp]) -> RenderState:
        ctx = RenderState(uops)
        barriers = 0
        for pos, u in enumerate(uops):
            ctx.barriers.append(barriers)
            if u.op in _BARRIER_OPS:
                barriers += 1
            if u.op is Ops.RANGE and ctx.parallel_range is None and u.arg[1] is AxisType.GLOBAL:
                ctx.parallel_range = u
            if u.op is Ops.STORE:
                ctx.written.add(u.src[0].src[0])
            srcs = u.src
            if u.op is Ops.INDEX or (u is ctx.parallel_range and self.parallel_range_bounds is not None):
                srcs = ()  # an INDEX prints nothing itself; the parallel range's end is not printed
            for s in srcs:
                # an INDEX is printed inside its LOAD/STORE, so its sources are read where the LOAD/STORE stands
                reads = s.src if s.op is Ops.INDEX else (s,)
                for x in reads:
                    ctx.users.setdefault(x, []).append(pos)
                    if u.op in self.ops_repeating_operands:
                        ctx.users[x].append(pos)
            if u.op is Ops.INDEX:
                ctx.users.setdefault(u, [])
        ctx.barriers.append(barriers)
        return ctx

    def _inline(self, ctx: RenderState, u: UOp) -> bool:
        if u.op is Ops.CONST:
            return True
        users = ctx.users.get(u, [])
        if u.op in _NAMED_OPS or len(users) != 1:
            return False
        # no side effect or loop boundary between here and the use: evaluating later gives the same value
        return ctx.barriers[users[0]] == ctx.barriers[ctx.pos + 1]

    def _render_uop(self, ctx: RenderState, u: UOp) -> None:
        rule = self.uop_rules.get(u.op)
        if rule is None:
            raise NotImplementedError(f"{type(self).__name__} cannot render {u.op}; add it to uop_rules")
        pure = u.op in _PURE or u.op is Ops.LOAD
        if pure and u.op is not Ops.INDEX and not ctx.users.get(u) and u.op is not Ops.CONST:
            return  # dead value
        expr = rule(self, ctx, u)
        if expr is None:
            return
        # compilers cap the nesting of parentheses (clang: 256): a long chain of inlined ops gets a name every so often
        nesting = 1 + max((ctx.nesting.get(s, 0) for s in u.src), default=0)
        if self._inline(ctx, u) and (u.op is Ops.CONST or nesting < MAX_INLINE_NESTING):
            ctx.exprs[u] = expr
            ctx.nesting[u] = nesting
            return
        if u.op is Ops.SPECIAL and u.arg[0] not in ctx.taken and u.arg[0] not in self.reserved_names:
            name = u.arg[0]  # a thread id keeps its name: gidx0, lidx0
            ctx.taken.add(name)
        else:
            name = ctx.new_name(self.name_prefix.get(u.op, "alu"))
        ctx.emit(self.render_declare(ctx, u.dtype, name, expr, mutable=False))
        ctx.exprs[u] = name

    # ---- types and constants ----
    def render_dtype(self, ctx: RenderState | None, dtype: DType) -> str:
        scalar = dtype.scalar()
        if scalar not in self.type_map:
            raise DTypeError(f"{type(self).__name__} has no type for {dtype!r}; codegen should have decomposed it")
        if ctx is not None and scalar in self.type_prelude:
            ctx.helpers.setdefault(f"type {scalar.name}", self.type_prelude[scalar])
        if dtype.count == 1:
            return self.type_map[scalar]
        name = f"{self.vector_type_prefix[scalar]}{dtype.count}"
        if ctx is not None:
            ctx.vector_types.setdefault(name, dtype)
        return name

    def render_const(self, value: Any, dtype: DType) -> str:
        if dtypes.is_bool(dtype):
            return "1" if value else "0"
        if dtypes.is_float(dtype):
            return self.render_float(float(value), dtype)
        return self.render_int(int(value), dtype)

    def render_int(self, value: int, dtype: DType) -> str:
        suffix = {dtypes.uint32: "u", dtypes.int64: "ll", dtypes.uint64: "ull"}.get(dtype, "")
        if dtypes.is_int(dtype) and not dtypes.is_unsigned(dtype) and dtype.itemsize >= 4 and value == dtype.min:
            return f"({value + 1}{suffix}-1)"  # -2147483648 is -(2147483648), a long in C
        return f"({value}{suffix})" if value < 0 else f"{value}{suffix}"

    def render_float(self, value: float, dtype: DType) -> str:
        """An exact literal: the value is first rounded to `dtype` (as numpy does), then printed so that parsing it
        gives that value back. inf and nan use the `infinity`/`nan` attributes. Float types without a literal form in
        `float_suffix` (half) are printed as a float32 literal (exact: they are float32 values) and cast."""
        rounded = round_float(value, dtype)
        native = dtype in self.float_suffix and math.isfinite(rounded)
        if math.isnan(rounded):
            text = self.nan
        elif math.isinf(rounded):
            text = self.infinity if rounded > 0 else f"(-{self.infinity})"
        else:
            text = f"{rounded!r}{self.float_suffix.get(dtype, self.float_suffix[dtypes.float32])}"
            text = f"({text})" if text.startswith("-") else text
        if native or dtype == dtypes.float32:
            return text
        return f"(({self.render_dtype(None, dtype)}){text})"

    # ---- ALU ----
    def render_alu(self, op: Ops, dtype: DType, operands: list[str], src_dtypes: list[DType]) -> str:
        narrow = dtype.count == 1 and dtypes.is_int(dtype) and dtype.itemsize < 4 and op in _WRAP_NARROW_OPS
        if narrow and dtypes.is_unsigned(dtype) and op in (Ops.MUL, Ops.MULACC, Ops.SHL):
            operands = [f"((unsigned int){operands[0]})", *operands[1:]]  # no signed int overflow after promotion
        expr = self.code_for_op[op](*operands, dtype=dtype)
        return f"(({self.type_map[dtype]}){expr})" if narrow else expr

    # ---- hooks ----
    def render_cast(self, ctx: RenderState, dtype: DType, src_dtype: DType, x: str) -> str:
        if dtypes.is_bool(dtype):
            return f"({x}!=0)"
        return f"(({self.render_dtype(ctx, dtype)})({x}))"

    def render_bitcast(self, ctx: RenderState, dtype: DType, src_dtype: DType, x: str) -> str:
        src_t, dst_t = self.render_dtype(ctx, src_dtype), self.render_dtype(ctx, dtype)
        return f"((union {{ {src_t} src; {dst_t} dst; }}){{{x}}}).dst"

    def render_vectorize(self, ctx: RenderState, dtype: DType, lanes: list[str]) -> str:
        return f"(({self.render_dtype(ctx, dtype)}){{{', '.join(lanes)}}})"

    def render_gep(self, vec: str, lane: int) -> str:
        return f"{vec}[{lane}]"

    def render_special(self, ctx: RenderState, u: UOp) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no hardware thread indexes (SPECIAL {u.arg})")

    def render_shared_decl(self, ctx: RenderState, u: UOp, name: str) -> str | None:
        """The declaration of workgroup shared array `name` (DEFINE_LOCAL `u`) where it stands in the body, or None
        for a language that declares it elsewhere (`render_kernel` reads `ctx.shared`)."""
        raise NotImplementedError(f"{type(self).__name__} has no workgroup shared memory (DEFINE_LOCAL {u.arg})")

    def render_barrier(self) -> str:
        """The statement that waits for every thread of the workgroup (and makes their shared writes visible)."""
        raise NotImplementedError(f"{type(self).__name__} has no workgroup barrier")

    def render_load(self, ctx: RenderState, dtype: DType, buf: str, idx: str, gate: str | None) -> str:
        if dtype.count > 1:
            raise NotImplementedError(f"{type(self).__name__} cannot load vectors; override render_load")
        value = f"{buf}[{idx}]"
        return f"({gate}?{value}:{self.render_const(0, dtype)})" if gate is not None else value

    def render_store(self, ctx: RenderState, dtype: DType, buf: str, idx: str, value: str, gate: str | None) -> str:
        if dtype.count > 1:
            raise NotImplementedError(f"{type(self).__name__} cannot store vectors; override render_store")
        stmt = f"{buf}[{idx}] = {value};"
        return f"if ({gate}) {stmt}" if gate is not None else stmt

    def render_declare(self, ctx: RenderState, dtype: DType, name: str, expr: str, mutable: bool) -> str:
        return f"{'' if mutable else 'const '}{self.render_dtype(ctx, dtype)} {name} = {expr};"

    def render_range(self, ctx: RenderState, dtype: DType, name: str, start: str, end: str) -> str:
        return f"for ({self.render_dtype(ctx, dtype)} {name} = {start}; {name} < {end}; {name}++) {{"

    def render_buffer_decl(self, ctx: RenderState, u: UOp, name: str, written: bool) -> str:
        """How a buffer reaches the kernel: here a parameter `T* data0` of the signature."""
        return f"{'' if written else 'const '}{self.render_dtype(ctx, u.dtype)}*{self.buffer_qualifier} {name}"

    def render_var_decl(self, ctx: RenderState, u: UOp, name: str, k: int) -> str:
        return f"const {self.render_dtype(ctx, u.dtype)} {name}"

    def render_prefix(self, ctx: RenderState) -> list[str]:
        """Definitions the kernel needs before it (vector types, helpers)."""
        return list(ctx.helpers.values())

    def render_kernel(self, ctx: RenderState, name: str, body: list[str]) -> str:
        """Default: a plain function taking every buffer and variable as a parameter."""
        params = [self.render_buffer_decl(ctx, u, n, w) for u, n, w in ctx.params]
        params += [self.render_var_decl(ctx, u, n, k) for u, n, k in ctx.variables]
        head = f"{self.kernel_prefix + ' ' if self.kernel_prefix else ''}void {name}({', '.join(params)}) {{"
        return "\n".join([*self.render_prefix(ctx), head, *body, "}"]) + "\n"


def round_float(value: float, dtype: DType) -> float:
    """`value` rounded to the nearest `dtype` value (ties to even), as a Python float; overflow gives inf."""
    if math.isnan(value) or math.isinf(value) or dtype.itemsize >= 8:
        return value
    fmt = {2: "e", 4: "f"}.get(dtype.itemsize)
    if fmt is None or dtype.scalar() not in (dtypes.float16, dtypes.float32):
        return value  # other formats are decomposed before rendering; print the value as given
    try:
        return float(struct.unpack(fmt, struct.pack(fmt, value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


__all__ = [
    "AsyncWait",
    "MatrixLoad",
    "Renderer",
    "TensorCore",
    "CStyleRenderer",
    "RenderState",
    "legalize_linear",
    "pm_split_vector_ops",
    "split_vector_alu",
    "base_code_for_op",
    "C_INFIX_OPS",
    "Infix",
    "MulAcc",
    "infix_code_for_op",
    "base_uop_rules",
    "round_float",
    "divisor_may_be_zero",
    "quotient_may_overflow",
]
