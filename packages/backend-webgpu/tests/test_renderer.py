"""WGSL text for hand-built linear programs: what WGSL lacks is legalised, unsupported dtypes are refused."""

from __future__ import annotations

import pytest

from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad_codegen.renderer import Renderer
from xgrad_webgpu.renderer import CPU_OUTPUTS_PER_LANE, CpuAdapter, WGSLRenderer

IDX = dtypes.index


def linear(*items: UOp) -> list[UOp]:
    out: dict[UOp, None] = {}
    for item in items:
        for u in item.toposort:
            out.setdefault(u, None)
    return [*out, UOp(Ops.SINK, dtypes.void, ())]


def param(i: int, dtype: DType) -> UOp:
    return UOp(Ops.PARAM, dtype, (), i)


def idx(n: int) -> UOp:
    return UOp.const(IDX, n)


def end(r: UOp) -> UOp:
    return UOp(Ops.END, dtypes.void, (r,))


def gid(n: int | UOp, dim: int = 0, local: bool = False) -> UOp:
    """A workgroup id (or with `local`, a thread id) of `n` values, as codegen's GPU lowering makes it."""
    name = f"{'lidx' if local else 'gidx'}{dim}"
    if isinstance(n, UOp):
        return UOp(Ops.SPECIAL, IDX, (n,), (name, int(n.vmax)))
    return UOp(Ops.SPECIAL, IDX, (), (name, n))


def unary_program(dtype: DType, fn: object = None, out_dtype: DType | None = None) -> list[UOp]:
    """out[i] = fn(x[i]) over 10 workgroups."""
    out, x = param(0, out_dtype or dtype), param(1, dtype)
    r = gid(10)
    value = x.index(r).load()
    value = fn(value) if callable(fn) else value
    return linear(out.index(r).store(value))


def render(uops: list[UOp], arch: str | None = "shader-f16") -> str:
    return WGSLRenderer(arch).render("k", uops)


def test_kernel_binds_buffers_and_reads_the_workgroup_id() -> None:
    src = render(unary_program(dtypes.float32, lambda v: v * UOp.const(dtypes.float32, 2.0)))
    assert "@group(0) @binding(0) var<storage, read_write> data0: array<f32>;" in src
    assert "@group(0) @binding(1) var<storage, read> data1: array<f32>;" in src
    assert "@compute @workgroup_size(1, 1, 1)" in src
    assert "fn main(@builtin(workgroup_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {" in src
    assert "let gidx0: i32 = i32(gid.x);" in src
    assert "data0[gidx0] = (val0 * 2.0f);" in src


def test_program_without_ids_is_one_invocation() -> None:
    out = param(0, dtypes.int32)
    src = render(linear(out.index(idx(0)).store(UOp.const(dtypes.int32, -(2**31)))))
    assert "@compute @workgroup_size(1, 1, 1)" in src
    assert "data0[0i] = (-2147483647i - 1i);" in src


def test_workgroup_size_shared_memory_and_barrier() -> None:
    """Threads of a workgroup on x and y, an array in workgroup memory, the barrier between its write and read."""
    out = param(0, dtypes.float32)
    lx, ly = gid(8, 0, local=True), gid(4, 1, local=True)
    smem = UOp(Ops.DEFINE_LOCAL, dtypes.float32, (), (0, 32))
    write = smem.index(ly * idx(8) + lx).store(UOp.const(dtypes.float32, 1.0))
    bar = UOp(Ops.BARRIER, dtypes.void, (write,))
    value = smem.index(ly * idx(8) + (lx + idx(1)) % idx(8)).load()
    src = render(linear(write, bar, out.index(gid(3) * idx(32) + ly * idx(8) + lx).store(value)))
    assert "var<workgroup> temp0: array<f32, 32>;" in src
    assert "@compute @workgroup_size(8, 4, 1)" in src
    assert "let lidx0: i32 = i32(lid.x);" in src and "let lidx1: i32 = i32(lid.y);" in src
    assert src.index("temp0[") < src.index("workgroupBarrier();") < src.rindex("temp0[")


def test_loops_accumulators_and_select() -> None:
    out, x = param(0, dtypes.float32), param(1, dtypes.float32)
    r = gid(4)
    acc = UOp(Ops.DEFINE_ACC, dtypes.float32, (UOp.const(dtypes.float32, float("-inf")),), 0)
    rr = UOp.range(idx(7), 1, AxisType.REDUCE)
    assign = UOp(Ops.ASSIGN_ACC, dtypes.float32, (acc, acc.maximum(x.index(r * idx(7) + rr).load())))
    result = acc.lt(UOp.const(dtypes.float32, 0.0)).where(UOp.const(dtypes.float32, float("nan")), acc)
    src = render(linear(r, acc, rr, assign, end(rr), out.index(r).store(result)))
    assert "var acc0: f32 = bitcast<f32>(0xff800000u);" in src
    assert "for (var ridx0: i32 = 0i; ridx0 < 7i; ridx0++) {" in src
    # (a > b ? a : b) with a NaN in either operand propagated, decided on the bits
    nan_acc, nan_val = (f"((bitcast<u32>({v}) & 0x7fffffffu) > 0x7f800000u)" for v in ("acc0", "val0"))
    assert f"select(val0, acc0, ({nan_acc} || ((acc0 > val0) && !{nan_val})))" in src
    assert "bitcast<f32>(0x7fc00000u)" in src


def test_shift_counts_are_u32() -> None:
    src = render(unary_program(dtypes.int32, lambda v: v.alu(Ops.SHL, UOp.const(dtypes.int32, 3))))
    assert "(val0 << u32(3i))" in src


def test_int_remainder_is_spelled_with_division() -> None:
    """wgpu's OpenGL backend (Mesa's llvmpipe, where no Vulkan driver is installed) prints WGSL's `%` as GLSL's,
    which is undefined for negative operands: -7 % 3 came out 0, and floor division (which tests the remainder) went
    wrong. Integer remainders are a - (a / b) * b; float ones keep `%`."""
    src = render(unary_program(dtypes.int32, lambda v: UOp(Ops.MOD, dtypes.int32, (v, UOp.const(dtypes.int32, 3)))))
    assert "%" not in src and "(val0 - (val0 / 3i) * 3i)" in src
    src = render(
        unary_program(dtypes.float32, lambda v: UOp(Ops.MOD, dtypes.float32, (v, UOp.const(dtypes.float32, 3.0))))
    )
    assert "(val0 % 3.0f)" in src


def test_int8_buffers_are_packed_words_written_with_atomics() -> None:
    src = render(unary_program(dtypes.int8, lambda v: v * UOp.const(dtypes.int8, 3)))
    assert "var<storage, read_write> data0: array<atomic<u32>>;" in src
    assert "var<storage, read> data1: array<u32>;" in src
    assert "bitcast<i32>(data1[(gidx0) / 4i] << (24u - (u32((gidx0) % 4i) * 8u))) >> 24u" in src  # sign-extended lane
    assert "atomicAnd(&data0[(gidx0) / 4i]" in src and "atomicOr(&data0[(gidx0) / 4i]" in src
    assert "(((val0 * 3i) << 24u) >> 24u)" in src  # int8 arithmetic wraps


def test_bool_and_uint16_lanes() -> None:
    src = render(unary_program(dtypes.bool, lambda v: v.alu(Ops.CMPLT, UOp.const(dtypes.bool, True))))
    assert "(((data1[(gidx0) / 4i] >> (u32((gidx0) % 4i) * 8u)) & 0xffu) != 0u)" in src
    assert "((val0 != true) & true)" in src  # bool < bool has no WGSL operator
    assert "select(0u, 1u," in src
    src = render(unary_program(dtypes.uint16))
    assert "((data1[(gidx0) / 2i] >> (u32((gidx0) % 2i) * 16u)) & 0xffffu)" in src


def test_float16_enables_the_extension() -> None:
    src = render(unary_program(dtypes.float16, lambda v: v + UOp.const(dtypes.float16, 1.5)))
    assert src.startswith("enable f16;")
    assert "array<f16>" in src and "1.5h" in src


@pytest.mark.parametrize("dtype", [dtypes.int64, dtypes.uint64, dtypes.float64])
def test_64_bit_dtypes_are_refused_with_the_reason(dtype: DType) -> None:
    with pytest.raises(DTypeError, match=f"{dtype.name}.*WGSL has no"):
        render(unary_program(dtype))


def test_float16_without_shader_f16_is_refused() -> None:
    assert dtypes.float16 not in WGSLRenderer("").native_dtypes
    with pytest.raises(DTypeError, match="shader-f16"):
        render(unary_program(dtypes.float16), arch="")


def test_rounding_idiom_is_printed_as_round() -> None:
    magic = 1.5 * 2.0**23
    fn = lambda v: (v + UOp.const(dtypes.float32, magic)) + UOp.const(dtypes.float32, -magic)  # noqa: E731
    assert "data0[gidx0] = round(val0);" in render(unary_program(dtypes.float32, fn))


def test_variables_come_from_their_own_binding() -> None:
    out = param(0, dtypes.float32)
    n = UOp.variable("n", 1, 100)
    r = gid(n)
    src = render(linear(out.index(r).store(UOp.const(dtypes.float32, 1.0))))
    assert "@group(0) @binding(1) var<storage, read> xvars: array<i32>;" in src
    assert "let n: i32 = xvars[0];" in src and "data0[gidx0] = 1.0f;" in src


def test_exp2_log2_sin_are_left_to_codegen() -> None:
    ops = WGSLRenderer().supported_ops
    assert not {Ops.EXP2, Ops.LOG2, Ops.SIN} & ops
    assert {Ops.SQRT, Ops.WHERE, Ops.IDIV, Ops.MOD, Ops.SHL} <= ops


def test_float_compares_decide_nan_on_the_bits() -> None:
    x, y = param(1, dtypes.float32), param(2, dtypes.float32)
    out = param(0, dtypes.bool)
    r = gid(10)
    a, b = x.index(r).load(), y.index(r).load()
    nan_a, nan_b = (f"((bitcast<u32>({v}) & 0x7fffffffu) > 0x7f800000u)" for v in ("val0", "val1"))
    src = render(linear(out.index(r).store(a.alu(Ops.CMPNE, b))))
    assert f"((val0 != val1) || {nan_a} || {nan_b})" in src  # NaN != anything, whatever the compiler assumes
    src = render(linear(out.index(r).store(a.alu(Ops.CMPLT, b))))
    assert f"((val0 < val1) && !({nan_a} || {nan_b}))" in src  # NaN is unordered
    src = render(linear(out.index(r).store(a.alu(Ops.CMPLT, UOp.const(dtypes.float32, 2.0)))))
    assert f"((val0 < 2.0f) && !({nan_a}))" in src  # a finite literal is never NaN: not tested


def test_int_compares_have_no_nan_test() -> None:
    src = render(unary_program(dtypes.int32, lambda v: v.alu(Ops.CMPNE, UOp.const(dtypes.int32, 3)), dtypes.bool))
    assert "bitcast<u32>" not in src


def test_float16_inf_and_nan_constants_are_converted_float32_bits() -> None:
    # naga rejects bitcast<vec2<f16>>(u32).x, and f16 const-expressions must not overflow
    fn = lambda v: v.maximum(UOp.const(dtypes.float16, float("-inf")))  # noqa: E731
    src = render(unary_program(dtypes.float16, fn))
    assert "f16(bitcast<f32>(0xff800000u))" in src and "vec2<f16>" not in src
    fn = lambda v: v + UOp.const(dtypes.float16, float("nan"))  # noqa: E731
    assert "f16(bitcast<f32>(0x7fc00000u))" in render(unary_program(dtypes.float16, fn))


def test_float16_bitcasts_use_the_pack_builtins() -> None:
    src = render(unary_program(dtypes.uint16, lambda v: v.bitcast(dtypes.float16), dtypes.float16))
    assert "f16(unpack2x16float(u32(val0) & 0xffffu).x)" in src
    src = render(unary_program(dtypes.float16, lambda v: v.bitcast(dtypes.uint16), dtypes.uint16))
    assert "(pack2x16float(vec2<f32>(f32(val0), 0.0f)) & 0xffffu)" in src


def test_int_division_by_a_value_that_may_be_zero_selects_zero() -> None:
    """WGSL's a / 0 is a; xgrad's is 0. A constant divisor (folded before rendering when 0) is printed plainly."""
    divide = lambda v: UOp(Ops.IDIV, dtypes.int32, (v, v + UOp.const(dtypes.int32, 1)))  # noqa: E731
    src = render(unary_program(dtypes.int32, divide))
    assert "select(" in src and "== 0i)" in src
    src = render(unary_program(dtypes.int32, lambda v: UOp(Ops.IDIV, dtypes.int32, (v, UOp.const(dtypes.int32, 3)))))
    assert "select(" not in src and "/ 3i" in src


def test_workgroup_limits_default_to_webgpus_and_come_from_the_device() -> None:
    r = WGSLRenderer()
    assert r.has_local and r.has_shared and r.supports_group_reduce
    assert (r.local_max, r.max_threads, r.shared_max, r.global_max) == ((256, 256, 64), 256, 16384, (65535,) * 3)
    limits = {
        "max-compute-workgroups-per-dimension": 1000,
        "max-compute-workgroup-size-x": 512,
        "max-compute-workgroup-size-y": 128,
        "max-compute-workgroup-size-z": 16,
        "max-compute-invocations-per-workgroup": 512,
        "max-compute-workgroup-storage-size": 8192,
    }
    r = WGSLRenderer("", limits)
    assert (r.local_max, r.max_threads, r.shared_max, r.global_max) == ((512, 128, 16), 512, 8192, (1000,) * 3)


def test_cpu_adapter_sets_the_heuristics_preferences() -> None:
    """A GPU keeps codegen's defaults; lavapipe's workgroups are filled to its SIMD lanes, and its reductions stay in
    one thread from 16 outputs per lane of its threads on (CPU_OUTPUTS_PER_LANE)."""
    gpu = WGSLRenderer()
    assert (gpu.min_local, gpu.group_max_outputs) == (Renderer.min_local, Renderer.group_max_outputs)
    lavapipe = WGSLRenderer("", None, CpuAdapter(threads=2, lanes=8))
    assert (lavapipe.min_local, lavapipe.group_max_outputs) == (8, 2 * 8 * CPU_OUTPUTS_PER_LANE)
