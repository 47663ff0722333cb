"""The PTX renderer: linear program in, one PTX `.entry` (for ptxas, the driver's JIT or the PTX interpreter) out.

Same kernel ABI as the CUDA renderer (`xgrad_nv.renderer`): one `.u64` pointer per PARAM in PARAM order, then one
`.s32` per DEFINE_VAR; SPECIAL `gidx<d>` is `%ctaid.<d>`, `lidx<d>` is `%tid.<d>`; `.maxntid` is the block size (with
`.minnctapersm 1` where tensor cores keep accumulators in registers).
Every value gets a fresh virtual register (ptxas allocates; types, conversions and ALU ops are in
`xgrad_nv.ptx_arith`): `%p` predicates (bool), `%rs` 16-bit (int8/int16 and their
unsigned forms, kept sign- or zero-extended; half and bfloat16 as bits), `%r` 32-bit (int32, uint32, index), `%rd`
64-bit, `%f` float32, `%fd` float64. half computes with the `.f16` instructions where they exist (add/sub/mul/fma,
one rounding each, as CUDA's half does) and through float32 otherwise; bfloat16 always through float32 (sm_80 has
no bf16 add). Float arithmetic carries `.rn`, so ptxas never contracts a multiply and an add into an fma. EXP2, LOG2
and SIN are not offered (codegen's polynomials are used: PTX's `ex2/lg2/sin.approx` are approximate). Integer
division and remainder follow xgrad's total definition (x / 0 = 0, x % 0 = x, MIN / -1 = MIN) where the bounds say
the divisor may be 0 or -1. RANGE is a counted loop (`bra` back), a gated LOAD a predicated `ld` after a `mov` of
0, BARRIER `bar.sync 0`, DEFINE_LOCAL a `.shared` array, WMMA one `mma.sync.aligned.m16n8k16.row.col.f32`. A STORE
of an INDEX (tc_tile's staged slices, `async_copy_bytes`) is one `cp.async` of 4-16 bytes (src-size 0 where its gate
is off), a BARRIER with an `AsyncWait` `cp.async.commit_group; cp.async.wait_group N;` before the `bar.sync`. A LOAD
with a `MatrixLoad` arg is one `ldmatrix.sync.aligned.m8n8`, its 32-bit registers split into 16-bit elements.
"""

from __future__ import annotations

from xgrad.dtype import DType, dtypes
from xgrad.uop.ops import GroupOp, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, UPat
from xgrad_codegen.legalize import legalize_linear, split_vector_alu
from xgrad_codegen.renderer import (
    AsyncWait,
    MatrixLoad,
    Renderer,
    TensorCore,
)
from xgrad_nv.ptx_arith import (
    BF16,
    F16,
    F32,
    F64,
    HALVES,
    PTXArith,
    PTXContext,
    mem_type,
    nbytes,
    op_type,
    ptx_type,
    reg_class,
)
from xgrad_nv.renderer import dynamic_shared, nv_arch

pm_legalize_ptx = PatternMatcher(
    [
        (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST}, name="x"), split_vector_alu),
    ]
)


class PTXRenderer(PTXArith, Renderer):
    """PTX for NVIDIA GPU `arch` (a key of `xgrad_nv.renderer.NV_ARCHS`, default sm_90): its launch limits, 48 KiB of
    static shared memory per block and its tensor cores, as the CUDA renderer."""

    device = "NV"
    name = "PTX"
    # EXP2, LOG2, SIN (PTX has only .approx forms) and POW are left to codegen's decompositions
    supported_ops = frozenset(GroupOp.ALU - {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW})
    native_dtypes = frozenset({dtypes.bool, *dtypes.ints, dtypes.index, F16, BF16, F32, F64})
    has_local = True
    has_shared = True
    max_vector_width = 1
    legalize = pm_legalize_ptx

    def __init__(self, arch: str | None = None, tf32: bool = False) -> None:
        """`tf32`: float32 matmuls on the tf32 tensor cores too (mma m16n8k8 .tf32: 10-bit mantissa operands; off
        by default, as for the CUDA renderer)."""
        spec = nv_arch(arch)
        self.arch = spec.name
        self.spec = spec
        self.global_max, self.local_max = spec.global_max, spec.local_max
        self.max_threads, self.shared_max = spec.max_threads, spec.shared_optin  # dynamic past shared_static
        self.tensor_cores = spec.tensor_cores + (spec.tf32_cores if tf32 else ())
        self.async_copy_bytes = spec.async_copy_bytes  # cp.async: copies without registers, so 16 bytes (not vectors)
        self.matrix_loads = spec.matrix_loads

    def render(self, name: str, uops: list[UOp]) -> str:
        uops = legalize_linear(uops, self.legalize)
        ctx = PTXContext()
        ctx.dynamic = dynamic_shared(uops, self.spec) > 0
        for u in uops:
            self._render_uop(ctx, u)
        return self._kernel(ctx, name, uops)

    # ---- the kernel ----
    def _kernel(self, ctx: PTXContext, name: str, uops: list[UOp]) -> str:
        threads = [1, 1, 1]
        for u in uops:
            if u.op is Ops.SPECIAL and str(u.arg[0]).startswith("lidx"):
                threads[int(str(u.arg[0])[-1])] = int(u.arg[1])
        count = max(ctx.params, default=-1) + 1
        params = [f"\t.param .u64 {ctx.params.get(i, f'unused{i}')}" for i in range(count)]
        params += [f"\t.param .s32 {v}" for v in ctx.variables]
        major, minor = max(self.spec.min_ptx_isa, (7, 8))
        # tensor-core accumulators live in registers: one block per SM is enough (see the CUDA renderer's bounds)
        min_blocks = "\n.minnctapersm 1" if any(u.op is Ops.WMMA for u in uops) else ""
        head = [
            f".version {major}.{minor}",
            f".target {self.arch}",
            ".address_size 64",
            "",
            *([".extern .shared .align 16 .b8 xg_dynamic_shared[];", ""] if ctx.dynamic else []),
            f".visible .entry {name}(",
            ",\n".join(params),
            f")\n.maxntid {threads[0]}, {threads[1]}, {threads[2]}{min_blocks}\n{{",
        ]
        decls = [f"\t.reg {t} {p}<{ctx.counts[p]}>;" for p, t in ctx.decl.items()]
        return "\n".join([*head, *decls, *ctx.shared, *ctx.lines, "\tret;", "}"]) + "\n"

    # ---- values ----
    def _render_uop(self, ctx: PTXContext, u: UOp) -> None:
        op = u.op
        if op in (Ops.SINK, Ops.NOOP, Ops.INDEX):
            return
        handler = getattr(self, f"_r_{op.name.lower()}", None)
        if handler is None:
            if op in GroupOp.ALU:
                ctx.regs[u] = self._alu(ctx, u)
                return
            raise NotImplementedError(f"the PTX renderer cannot render {op}")
        handler(ctx, u)

    def _r_const(self, ctx: PTXContext, u: UOp) -> None:
        scalar = u.dtype.scalar()
        r = self._const(ctx, u.arg, scalar)
        ctx.regs[u] = tuple([r] * u.dtype.count) if u.dtype.count > 1 else r

    def _r_param(self, ctx: PTXContext, u: UOp) -> None:
        name = f"data{u.arg}"
        ctx.params[int(u.arg)] = name
        raw = ctx.new_reg("%rd", ".b64")
        r = ctx.new_reg("%rd", ".b64")
        ctx.emit(f"ld.param.u64 {raw}, [{name}];")
        ctx.emit(f"cvta.to.global.u64 {r}, {raw};")
        ctx.regs[u] = r

    def _r_define_var(self, ctx: PTXContext, u: UOp) -> None:
        name = f"var{len(ctx.variables)}"
        ctx.variables.append(name)
        r = ctx.new(dtypes.int32)
        ctx.emit(f"ld.param.s32 {r}, [{name}];")
        scalar = u.dtype.scalar()
        same = scalar.itemsize == 4 or scalar == dtypes.index
        ctx.regs[u] = r if same else self._cvt_int(ctx, r, dtypes.int32, scalar)

    def _r_special(self, ctx: PTXContext, u: UOp) -> None:
        name = str(u.arg[0])
        axis = "xyz"[int(name[-1])]
        r = ctx.new(dtypes.int32)
        ctx.emit(f"mov.u32 {r}, %{'ctaid' if name.startswith('gidx') else 'tid'}.{axis};")
        ctx.regs[u] = r

    def _r_define_local(self, ctx: PTXContext, u: UOp) -> None:
        name = f"temp{len(ctx.shared)}"
        size = int(u.arg[1]) * u.dtype.scalar().itemsize
        r = ctx.new(dtypes.int32)
        if ctx.dynamic:  # an offset into the kernel's dynamic shared memory (the launch passes its size)
            ctx.shared.append(f"\t// {name}: {size} bytes of xg_dynamic_shared from {ctx.shared_offset}")
            ctx.emit(f"mov.u32 {r}, xg_dynamic_shared;")
            ctx.emit(f"add.u32 {r}, {r}, {ctx.shared_offset};")
            ctx.shared_offset += -(-size // 16) * 16
        else:
            ctx.shared.append(f"\t.shared .align 16 .b8 {name}[{max(size, 1)}];")
            ctx.emit(f"mov.u32 {r}, {name};")
        ctx.regs[u] = ("shared", r)

    def _r_barrier(self, ctx: PTXContext, u: UOp) -> None:
        if isinstance(u.arg, AsyncWait):  # this thread's copies since its last commit are a group; wait for older
            ctx.emit("cp.async.commit_group;")
            ctx.emit(f"cp.async.wait_group {int(u.arg.pending)};")
        ctx.emit("bar.sync 0;")

    def _r_range(self, ctx: PTXContext, u: UOp) -> None:
        r = ctx.new(u.dtype)
        top, end = ctx.label("loop"), ctx.label("end")
        t = op_type(u.dtype)
        ctx.emit(f"mov.b{reg_class(u.dtype)[1][2:]} {r}, 0;")
        bound = u.src[0]
        if not (bound.op is Ops.CONST and int(bound.arg) > 0):
            p = ctx.new(dtypes.bool)
            ctx.emit(f"setp.ge.{t} {p}, {r}, {ctx.regs[bound]};")
            ctx.emit(f"@{p} bra {end};")
        ctx.lines.append(f"{top}:")
        ctx.loops[u] = (r, top, end)
        ctx.regs[u] = r

    def _r_end(self, ctx: PTXContext, u: UOp) -> None:
        rng = u.src[0]
        r, top, end = ctx.loops[rng]
        t = op_type(rng.dtype)
        p = ctx.new(dtypes.bool)
        ctx.emit(f"add.{t} {r}, {r}, 1;")
        ctx.emit(f"setp.lt.{t} {p}, {r}, {ctx.regs[rng.src[0]]};")
        ctx.emit(f"@{p} bra {top};")
        ctx.lines.append(f"{end}:")

    def _r_define_acc(self, ctx: PTXContext, u: UOp) -> None:
        init = ctx.regs[u.src[0]]
        if u.dtype.count > 1:
            regs = tuple(self._copy(ctx, x, u.dtype.scalar()) for x in init)
            ctx.regs[u] = regs
        else:
            ctx.regs[u] = self._copy(ctx, init, u.dtype)

    def _copy(self, ctx: PTXContext, src: str, dt: DType) -> str:
        r = ctx.new(dt)
        ctx.emit(self._mov(r, src, dt))
        return r

    def _r_assign_acc(self, ctx: PTXContext, u: UOp) -> None:
        acc, value = ctx.regs[u.src[0]], ctx.regs[u.src[1]]
        if isinstance(acc, tuple):
            for a, v in zip(acc, value, strict=True):
                ctx.emit(self._mov(a, v, u.src[0].dtype.scalar()))
        else:
            ctx.emit(self._mov(acc, value, u.src[0].dtype))
        ctx.regs[u] = acc

    def _r_vectorize(self, ctx: PTXContext, u: UOp) -> None:
        regs = tuple(ctx.regs[s] for s in u.src)
        ctx.regs[u] = regs[0] if u.dtype.count == 1 and len(regs) == 1 else regs

    def _r_gep(self, ctx: PTXContext, u: UOp) -> None:
        lanes = u.arg if isinstance(u.arg, tuple) else (u.arg,)
        vec = ctx.regs[u.src[0]]
        if not isinstance(vec, tuple):
            ctx.regs[u] = vec
        elif len(lanes) == 1:
            ctx.regs[u] = vec[lanes[0]]
        else:
            ctx.regs[u] = tuple(vec[i] for i in lanes)

    # ---- memory ----
    def _address(self, ctx: PTXContext, idx: UOp) -> tuple[str, str]:
        """(state space, address register) of INDEX `idx`'s element."""
        buf, pos = idx.src[0], idx.src[1]
        base = ctx.regs[buf]
        size = buf.dtype.scalar().itemsize
        off = ctx.regs[pos]
        pos_t = pos.dtype.scalar()
        if isinstance(base, tuple):  # shared: 32-bit addresses
            if nbytes(pos_t) == 8:
                off = self._cvt_int(ctx, off, pos_t, dtypes.int32)
            a = ctx.new(dtypes.int32)
            ctx.emit(f"mad.lo.s32 {a}, {off}, {size}, {base[1]};")
            return "shared", a
        a = ctx.new(dtypes.int64)
        if nbytes(pos_t) == 8:
            ctx.emit(f"mad.lo.s64 {a}, {off}, {size}, {base};")
        else:
            w = ctx.new(dtypes.int64)
            ctx.emit(f"mul.wide.{'u' if dtypes.is_unsigned(pos_t) else 's'}32 {w}, {off}, {size};")
            ctx.emit(f"add.s64 {a}, {base}, {w};")
        return "global", a

    def _r_load(self, ctx: PTXContext, u: UOp) -> None:
        idx = u.src[0]
        if isinstance(u.arg, MatrixLoad):
            return self._ldmatrix(ctx, u, u.arg)
        if u.dtype.count > 1:
            raise NotImplementedError("the PTX renderer loads scalars only (max_vector_width is 1)")
        space, addr = self._address(ctx, idx)
        gate = ctx.regs[idx.src[2]] if len(idx.src) > 2 else None
        dt = u.dtype.scalar()
        mt = mem_type(dt)
        if dt == dtypes.bool:
            raw = ctx.new(dtypes.int16)
            if gate is not None:
                ctx.emit(f"mov.b16 {raw}, 0;")
            ctx.emit(f"{f'@{gate} ' if gate else ''}ld.{space}.u8 {raw}, [{addr}];")
            r = ctx.new(dt)
            ctx.emit(f"setp.ne.u16 {r}, {raw}, 0;")
            ctx.regs[u] = r
            return
        r = ctx.new(dt)
        if gate is not None:
            ctx.emit(f"mov.b{reg_class(dt)[1][2:]} {r}, 0;")
        ctx.emit(f"{f'@{gate} ' if gate else ''}ld.{space}.{mt} {r}, [{addr}];")
        ctx.regs[u] = r

    def _r_store(self, ctx: PTXContext, u: UOp) -> None:
        idx, value = u.src[0], u.src[1]
        if value.op is Ops.INDEX:
            return self._copy_async(ctx, idx, value)
        if value.dtype.count > 1:
            raise NotImplementedError("the PTX renderer stores scalars only (max_vector_width is 1)")
        space, addr = self._address(ctx, idx)
        gate = ctx.regs[idx.src[2]] if len(idx.src) > 2 else None
        dt = value.dtype.scalar()
        v = ctx.regs[value]
        if dt == dtypes.bool:
            b = ctx.new(dtypes.int16)
            ctx.emit(f"selp.u16 {b}, 1, 0, {v};")
            v = b
        ctx.emit(f"{f'@{gate} ' if gate else ''}st.{space}.{mem_type(dt)} [{addr}], {v};")

    def _ldmatrix(self, ctx: PTXContext, u: UOp, ml: MatrixLoad) -> None:
        """A LOAD with a MatrixLoad arg (`matrix_loads`): one ldmatrix into 32-bit registers, each split into its two
        16-bit elements (low half first)."""
        idx = u.src[0]
        if len(idx.src) > 2 or idx.src[0].op is not Ops.DEFINE_LOCAL or u.dtype.scalar().itemsize != 2:
            raise NotImplementedError(f"the PTX renderer's ldmatrix reads 16-bit elements of shared memory: {u}")
        _, addr = self._address(ctx, idx)
        words = [ctx.new(dtypes.uint32) for _ in range(ml.count)]
        shape = f"m8n8.x{ml.count}{'.trans' if ml.trans else ''}"
        ctx.emit(f"ldmatrix.sync.aligned.{shape}.shared.b16 {{{', '.join(words)}}}, [{addr}];")
        halves = []
        for w in words:
            lo, hi = ctx.new(u.dtype.scalar()), ctx.new(u.dtype.scalar())
            ctx.emit(f"mov.b32 {{{lo}, {hi}}}, {w};")
            halves += [lo, hi]
        ctx.regs[u] = tuple(halves)

    def _copy_async(self, ctx: PTXContext, dst: UOp, src: UOp) -> None:
        """STORE(shared INDEX, global INDEX): one cp.async of the INDEX's bytes (`async_copy_bytes`); a gate off
        reads nothing (src-size 0) and zero-fills."""
        size = src.dtype.scalar().itemsize * src.dtype.count
        if len(dst.src) > 2 or dst.src[0].op is not Ops.DEFINE_LOCAL or size not in (4, 8, 16):
            raise NotImplementedError(
                f"the PTX renderer copies asynchronously 4, 8 or 16 bytes into shared memory: {dst}"
            )
        (_, to), (_, frm) = self._address(ctx, dst), self._address(ctx, src)
        src_size = str(size)
        if len(src.src) > 2:
            src_size = ctx.new(dtypes.uint32)
            ctx.emit(f"selp.u32 {src_size}, {size}, 0, {ctx.regs[src.src[2]]};")
        ctx.emit(f"cp.async.{'cg' if size == 16 else 'ca'}.shared.global [{to}], [{frm}], {size}, {src_size};")

    # ---- tensor cores ----
    def _r_wmma(self, ctx: PTXContext, u: UOp) -> None:
        tc = u.arg
        ok = isinstance(tc, TensorCore) and tc.acc == F32
        half = ok and tc.dtype in HALVES and tc.dims == (16, 8, 16)
        tf32 = ok and tc.dtype == F32 and tc.dims == (16, 8, 8)
        if not (half or tf32):
            raise NotImplementedError(f"the PTX renderer has no mma.sync for WMMA {u.arg!r}")
        a, b, c = (ctx.regs[s] for s in u.src)
        t = "tf32" if tf32 else ptx_type(tc.dtype)

        def regs(elements: tuple[str, ...]) -> list[str]:
            """A/B elements in 32-bit registers, in element order: two halves or one tf32 (float32 bits) each."""
            out = []
            step = 1 if tf32 else 2
            for i in range(0, len(elements), step):
                r = ctx.new(dtypes.uint32)
                ctx.emit(f"mov.b32 {r}, {elements[i] if tf32 else '{' + elements[i] + ', ' + elements[i + 1] + '}'};")
                out.append(r)
            return out

        ra, rb = regs(a), regs(b)
        d = tuple(ctx.new(F32) for _ in c)
        m, n, k = tc.dims
        ctx.emit(
            f"mma.sync.aligned.m{m}n{n}k{k}.row.col.f32.{t}.{t}.f32 {{{', '.join(d)}}}, {{{', '.join(ra)}}}, "
            f"{{{', '.join(rb)}}}, {{{', '.join(c)}}};"
        )
        ctx.regs[u] = d


__all__ = ["PTXRenderer", "pm_legalize_ptx", "ptx_type"]
