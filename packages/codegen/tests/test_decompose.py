"""Tests of the decomposition passes: hand-built kernel ASTs are rewritten, linearized and run on the PYTHON reference
executor, and compared with numpy and the dtype module's bit-conversion helpers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from xgrad.dtype import (
    DType,
    bf16_bits_to_float,
    dtypes,
    float_to_bf16_bits,
    float_to_fp8_bits,
    fp8_bits_to_float,
)
from xgrad.uop.ops import AxisType, GroupOp, Ops, UOp
from xgrad.uop.pattern import PatternMatcher, graph_rewrite
from xgrad_codegen.decompose import (
    decompositions_for,
    pm_decompose_missing,
    pm_emulate_bf16,
    pm_emulate_fp8,
    pm_emulate_fp8_by_dtype,
    pm_transcendental,
)
from xgrad_codegen.linearize import linearize
from xgrad_codegen.pyexec import run_program

# ---- building and running kernels ----

Arr = npt.NDArray[Any]
_NP: dict[DType, Any] = {dtypes.bfloat16: np.uint16, **{d: np.uint8 for d in dtypes.fp8s}}


def _np_dtype(d: DType) -> Any:
    return _NP.get(d) or np.dtype(d.fmt or "")


def _kernel(out_dtype: DType, in_dtypes: list[DType], n: int, fn: Callable[..., UOp]) -> UOp:
    """out[i] = fn(in0[i], in1[i], ...) for i < n."""
    r = UOp.range(n, 0, AxisType.LOOP)
    loads = [UOp(Ops.PARAM, d, arg=i + 1).index(r).load() for i, d in enumerate(in_dtypes)]
    return UOp(Ops.PARAM, out_dtype, arg=0).index(r).store(fn(*loads)).sink()


def _run(ast: UOp, out_dtype: DType, n: int, *inputs: Arr, passes: list[PatternMatcher] | None = None) -> Arr:
    for i, pm in enumerate(passes or []):
        ast = graph_rewrite(ast, pm, name=f"test pass {i}")
    bufs = [memoryview(bytearray(np.zeros(n, _np_dtype(out_dtype)).tobytes()))]
    bufs += [memoryview(bytearray(np.ascontiguousarray(a).tobytes())) for a in inputs]
    run_program(linearize(ast), bufs)
    return np.frombuffer(bytes(bufs[0]), _np_dtype(out_dtype))


def _unary(op: Ops, dtype: DType, x: Arr, pm: PatternMatcher = pm_transcendental) -> Arr:
    ast = _kernel(dtype, [dtype], len(x), lambda a: UOp(op, dtype, (a,)))
    return _run(ast, dtype, len(x), x.astype(_np_dtype(dtype)), passes=[pm])


def _ulp_error(got: Arr, ref: Arr, np_dtype: Any) -> Arr:
    """|got - ref| in units of the last place of ref rounded to np_dtype (denormal results: the smallest step)."""
    step: Arr = np.spacing(np.abs(ref.astype(np_dtype))).astype(np.float64)
    err: Arr = np.abs(got.astype(np.float64) - ref.astype(np.float64)) / step
    return err


def _same_bits_or_both_nan(got: Arr, want: Arr) -> bool:
    with np.errstate(invalid="ignore"):  # signalling NaNs warn when widened
        g, w = got.astype(np.float64), want.astype(np.float64)
    return bool(np.all((g == w) & (np.signbit(g) == np.signbit(w)) | (np.isnan(g) & np.isnan(w))))


def _ops_in(ast: UOp) -> set[Ops]:
    return {u.op for u in ast.toposort}


def _dtypes_in(ast: UOp) -> set[DType]:
    return {u.dtype.scalar() for u in ast.toposort}


# ---- bfloat16 ----


def _bf16_halfway_cases() -> Arr:
    """float32 patterns that sit exactly between two bf16 values, or one bit either side, plus the specials."""
    rng = np.random.default_rng(7)
    tops = rng.integers(0, 0x10000, 400, dtype=np.uint32) << 16
    bits = np.concatenate([tops | 0x8000, tops | 0x7FFF, tops | 0x8001, tops])
    specials = np.array(
        [
            0x7F7FFFFF,
            0x7F7F8000,
            0x7F7F7FFF,
            0x00008000,
            0x00018000,
            0x80008000,
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0xFFC00001,
            0x7F800001,
            0x00000000,
            0x80000000,
        ],
        dtype=np.uint32,
    )
    return np.concatenate([bits, specials]).astype(np.uint32).view(np.float32)


def test_bf16_cast_from_float32_rounds_like_host_helper_including_halfway_and_nan() -> None:
    x = _bf16_halfway_cases()
    ast = _kernel(dtypes.bfloat16, [dtypes.float32], len(x), lambda a: a.cast(dtypes.bfloat16))
    got = _run(ast, dtypes.bfloat16, len(x), x, passes=[pm_emulate_bf16])
    np.testing.assert_array_equal(got, float_to_bf16_bits(x))


def test_bf16_cast_from_float64_rounds_once_not_twice() -> None:
    # v = a bf16 halfway point nudged by much less than a float32 ulp: float32 first would round to the tie
    rng = np.random.default_rng(3)
    base = bf16_bits_to_float(rng.integers(0x0080, 0x7F00, 500).astype(np.uint16)).astype(np.float64)
    half_ulp = np.ldexp(1.0, np.frexp(base)[1] - 9)
    x = np.concatenate(
        [
            base + half_ulp * (1 + 2.0**-40),
            base + half_ulp * (1 - 2.0**-40),
            base + half_ulp,
            [1e300, -1e300, 1e-300, -1e-300, 0.0, -0.0, np.inf, np.nan],
        ]
    )
    ast = _kernel(dtypes.bfloat16, [dtypes.float64], len(x), lambda a: a.cast(dtypes.bfloat16))
    got = _run(ast, dtypes.bfloat16, len(x), x, passes=[pm_emulate_bf16])
    np.testing.assert_array_equal(got, float_to_bf16_bits(x))


def test_bf16_cast_to_float32_is_exact_for_every_pattern() -> None:
    bits = np.arange(0, 0x10000, 7, dtype=np.uint16)
    ast = _kernel(dtypes.float32, [dtypes.bfloat16], len(bits), lambda a: a.cast(dtypes.float32))
    got = _run(ast, dtypes.float32, len(bits), bits, passes=[pm_emulate_bf16])
    assert _same_bits_or_both_nan(got, bf16_bits_to_float(bits))


def test_bf16_arithmetic_computes_in_float32_and_rounds_at_store() -> None:
    rng = np.random.default_rng(0)
    a, b = (float_to_bf16_bits(rng.standard_normal(256).astype(np.float32) * 10) for _ in range(2))
    ast = _kernel(dtypes.bfloat16, [dtypes.bfloat16, dtypes.bfloat16], 256, lambda x, y: x * y + x)
    got = _run(ast, dtypes.bfloat16, 256, a, b, passes=[pm_emulate_bf16])
    fa, fb = bf16_bits_to_float(a), bf16_bits_to_float(b)
    np.testing.assert_array_equal(got, float_to_bf16_bits(fa * fb + fa))
    rewritten = graph_rewrite(ast, pm_emulate_bf16, name="emulate bf16")
    assert dtypes.bfloat16 not in _dtypes_in(rewritten)


def test_bf16_reduce_sum_accumulates_in_float32() -> None:
    rng = np.random.default_rng(1)
    x = float_to_bf16_bits(rng.uniform(0, 1, 64).astype(np.float32))
    red = UOp.range(64, 1, AxisType.REDUCE)
    val = UOp(Ops.PARAM, dtypes.bfloat16, arg=1).index(red).load()
    total = UOp(Ops.REDUCE, dtypes.bfloat16, (val, red), Ops.ADD)
    ast = UOp(Ops.PARAM, dtypes.bfloat16, arg=0).index(UOp.const(dtypes.index, 0)).store(total).sink()
    got = _run(ast, dtypes.bfloat16, 1, x, passes=[pm_emulate_bf16])
    want = np.float32(0)
    for v in bf16_bits_to_float(x):
        want = np.float32(want + v)
    np.testing.assert_array_equal(got, float_to_bf16_bits([want]))


def test_bf16_bitcast_to_and_from_int16_keeps_the_pattern() -> None:
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0001, 0x8000], dtype=np.uint16)
    ast = _kernel(
        dtypes.int16,
        [dtypes.bfloat16],
        5,
        lambda a: (a.cast(dtypes.float32) * 1.0).cast(dtypes.bfloat16).bitcast(dtypes.int16),
    )
    np.testing.assert_array_equal(_run(ast, dtypes.int16, 5, bits, passes=[pm_emulate_bf16]), bits.view(np.int16))
    ast = _kernel(dtypes.float32, [dtypes.int16], 5, lambda a: a.bitcast(dtypes.bfloat16).cast(dtypes.float32))
    got = _run(ast, dtypes.float32, 5, bits.view(np.int16), passes=[pm_emulate_bf16])
    np.testing.assert_array_equal(got, bf16_bits_to_float(bits))


# ---- fp8 ----


def _fp8_signed_values(bits: Arr, dtype: DType) -> Arr:
    """fp8_bits_to_float, but a NaN keeps the sign bit of its pattern (as the emulation does)."""
    return np.copysign(fp8_bits_to_float(bits, dtype), np.where(bits & 0x80, -1.0, 1.0)).astype(np.float32)


@pytest.mark.parametrize("dtype", dtypes.fp8s, ids=lambda d: d.name)
def test_fp8_decode_matches_helper_for_all_256_patterns(dtype: DType) -> None:
    bits = np.arange(256, dtype=np.uint8)
    ast = _kernel(dtypes.float32, [dtype], 256, lambda a: a.cast(dtypes.float32))
    got = _run(ast, dtypes.float32, 256, bits, passes=[pm_emulate_fp8_by_dtype[dtype]])
    assert _same_bits_or_both_nan(got, fp8_bits_to_float(bits, dtype))


def _fp8_encode_cases(dtype: DType) -> Arr:
    """Every fp8 value, every midpoint between neighbours (ties), values just beside them, overflow, specials."""
    vals = np.unique(fp8_bits_to_float(np.arange(256, dtype=np.uint8), dtype).astype(np.float64))
    vals = vals[np.isfinite(vals)]
    mids = (vals[1:] + vals[:-1]) / 2
    beside = np.concatenate(
        [
            np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
            np.nextafter(mids.astype(np.float32), np.float32(-np.inf)),
        ]
    )
    top = vals.max()
    rng = np.random.default_rng(5)
    wide = rng.standard_normal(500) * np.exp2(rng.uniform(-24, 18, 500))
    special = [
        top * 1.03,
        top * 1.1,
        -top * 1.2,
        1e30,
        -1e30,
        np.inf,
        -np.inf,
        np.nan,
        -np.nan,
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        1e-45,
        3.4e38,
    ]
    return np.concatenate([vals, mids, beside, wide, special]).astype(np.float32)


@pytest.mark.parametrize("dtype", dtypes.fp8s, ids=lambda d: d.name)
def test_fp8_encode_matches_helper_including_ties_and_saturation(dtype: DType) -> None:
    x = _fp8_encode_cases(dtype)
    ast = _kernel(dtype, [dtypes.float32], len(x), lambda a: a.cast(dtype))
    got = _run(ast, dtype, len(x), x, passes=[pm_emulate_fp8_by_dtype[dtype]])
    np.testing.assert_array_equal(got, float_to_fp8_bits(x, dtype))


def test_fp8_combined_table_converts_between_formats() -> None:
    bits = np.arange(256, dtype=np.uint8)
    ast = _kernel(dtypes.fp8e5m2, [dtypes.fp8e4m3], 256, lambda a: a.cast(dtypes.fp8e5m2))
    got = _run(ast, dtypes.fp8e5m2, 256, bits, passes=[pm_emulate_fp8])
    np.testing.assert_array_equal(got, float_to_fp8_bits(_fp8_signed_values(bits, dtypes.fp8e4m3), dtypes.fp8e5m2))
    rewritten = graph_rewrite(ast, pm_emulate_fp8, name="emulate fp8")
    assert not _dtypes_in(rewritten) & set(dtypes.fp8s)


def test_fp8_arithmetic_from_float64_and_int_sources_rounds_once() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(200) * 30
    ast = _kernel(
        dtypes.fp8e4m3fnuz,
        [dtypes.float64, dtypes.int32],
        200,
        lambda a, i: (a + i.cast(dtypes.float64)).cast(dtypes.fp8e4m3fnuz),
    )
    ints = rng.integers(-300, 300, 200).astype(np.int32)
    got = _run(ast, dtypes.fp8e4m3fnuz, 200, x, ints, passes=[pm_emulate_fp8_by_dtype[dtypes.fp8e4m3fnuz]])
    np.testing.assert_array_equal(got, float_to_fp8_bits(x + ints, dtypes.fp8e4m3fnuz))


def test_fp8_bitcast_to_uint8_gives_the_stored_pattern() -> None:
    bits = np.arange(256, dtype=np.uint8)
    ast = _kernel(dtypes.uint8, [dtypes.fp8e5m2], 256, lambda a: a.bitcast(dtypes.uint8))
    got = _run(ast, dtypes.uint8, 256, bits, passes=[pm_emulate_fp8_by_dtype[dtypes.fp8e5m2]])
    want = float_to_fp8_bits(_fp8_signed_values(bits, dtypes.fp8e5m2), dtypes.fp8e5m2)  # NaNs become the quiet NaN
    np.testing.assert_array_equal(got, want)


# ---- transcendental functions ----

_F32_ULP = 3.0  # measured on 40k points: exp2 1.0, log2 2.2, sin 2.5 (|x| < 1e5); reference: numpy in float64
_F64_ULP = 3.0  # the float64 reference itself may be 1 ulp off


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_exp2_within_few_ulp_over_whole_range(dtype: DType) -> None:
    rng = np.random.default_rng(10)
    lo, hi = (-149, 128) if dtype == dtypes.float32 else (-1074, 1024)
    x = np.concatenate([rng.uniform(lo, hi, 1500), rng.uniform(-1, 1, 500), np.arange(lo, hi, 7.0)])
    x = x.astype(_np_dtype(dtype))
    got = _unary(Ops.EXP2, dtype, x)
    err = _ulp_error(got, np.exp2(x.astype(np.float64)), _np_dtype(dtype))
    assert err.max() <= (_F32_ULP if dtype == dtypes.float32 else _F64_ULP)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_log2_within_few_ulp_including_denormal_inputs(dtype: DType) -> None:
    rng = np.random.default_rng(11)
    np_dt = _np_dtype(dtype)
    tiny = np.finfo(np_dt).smallest_subnormal.astype(np.float64)
    big = float(np.finfo(np_dt).max)
    x = np.concatenate(
        [np.exp2(rng.uniform(np.log2(tiny), np.log2(big), 1500)), rng.uniform(0.5, 2, 500), [tiny, tiny * 3, big, 1.0]]
    ).astype(np_dt)
    got = _unary(Ops.LOG2, dtype, x)
    err = _ulp_error(got, np.log2(x.astype(np.float64)), np_dt)
    assert err.max() <= (_F32_ULP if dtype == dtypes.float32 else _F64_ULP)


@pytest.mark.parametrize(("dtype", "span"), [(dtypes.float32, 1e5), (dtypes.float64, 6e6)], ids=["float32", "float64"])
def test_sin_within_few_ulp_including_near_multiples_of_pi(dtype: DType, span: float) -> None:
    rng = np.random.default_rng(12)
    np_dt = _np_dtype(dtype)
    k = rng.integers(1, int(span / (np.pi / 2)), 700)
    near = (k * (np.pi / 2)).astype(np_dt)
    x = np.concatenate(
        [
            near,
            np.nextafter(near, np.array(np.inf, np_dt)),
            rng.uniform(-span, span, 500),
            rng.uniform(-4, 4, 500),
            [1e-30, -1e-30, 1e-40],
        ]
    ).astype(np_dt)
    got = _unary(Ops.SIN, dtype, x)
    err = _ulp_error(got, np.sin(x.astype(np.float64)), np_dt)
    assert err.max() <= (_F32_ULP if dtype == dtypes.float32 else _F64_ULP)


_EDGE_CASES: list[tuple[Ops, float, float]] = [
    (Ops.EXP2, 0.0, 1.0),
    (Ops.EXP2, -0.0, 1.0),
    (Ops.EXP2, np.inf, np.inf),
    (Ops.EXP2, -np.inf, 0.0),
    (Ops.EXP2, np.nan, np.nan),
    (Ops.EXP2, 1e4, np.inf),
    (Ops.EXP2, -1e4, 0.0),
    (Ops.EXP2, 10.0, 1024.0),
    (Ops.LOG2, 0.0, -np.inf),
    (Ops.LOG2, -0.0, -np.inf),
    (Ops.LOG2, -1.0, np.nan),
    (Ops.LOG2, -np.inf, np.nan),
    (Ops.LOG2, np.inf, np.inf),
    (Ops.LOG2, np.nan, np.nan),
    (Ops.LOG2, 1.0, 0.0),
    (Ops.LOG2, 1024.0, 10.0),
    (Ops.SIN, 0.0, 0.0),
    (Ops.SIN, -0.0, -0.0),
    (Ops.SIN, np.inf, np.nan),
    (Ops.SIN, -np.inf, np.nan),
    (Ops.SIN, np.nan, np.nan),
]


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_transcendentals_edge_cases_match_c_library(dtype: DType) -> None:
    for op, arg, want in _EDGE_CASES:
        got = _unary(op, dtype, np.array([arg]))
        assert _same_bits_or_both_nan(got, np.array([want])), (op, arg, got)


def test_transcendentals_on_float16_compute_in_float32() -> None:
    x = np.linspace(-8, 8, 301).astype(np.float16)
    with np.errstate(all="ignore"):
        for op, ref in ((Ops.EXP2, np.exp2), (Ops.LOG2, np.log2), (Ops.SIN, np.sin)):
            got = _unary(op, dtypes.float16, x)
            want = ref(x.astype(np.float64)).astype(np.float16)
            assert _same_bits_or_both_nan(got, want), op


def test_transcendental_pass_leaves_no_exp2_log2_sin() -> None:
    ast = _kernel(
        dtypes.float32,
        [dtypes.float32],
        4,
        lambda a: UOp(
            Ops.SIN, dtypes.float32, (UOp(Ops.LOG2, dtypes.float32, (UOp(Ops.EXP2, dtypes.float32, (a,)),)),)
        ),
    )
    assert not _ops_in(graph_rewrite(ast, pm_transcendental, name="transcendental")) & {Ops.EXP2, Ops.LOG2, Ops.SIN}


# ---- other missing ops ----

_MISSING_CASES: list[tuple[Ops, DType, DType]] = [
    (Ops.MULACC, dtypes.float32, dtypes.float32),
    (Ops.SUB, dtypes.float32, dtypes.float32),
    (Ops.SUB, dtypes.int32, dtypes.int32),
    (Ops.NEG, dtypes.float32, dtypes.float32),
    (Ops.NEG, dtypes.int32, dtypes.int32),
    (Ops.CMPEQ, dtypes.float32, dtypes.bool),
    (Ops.MAX, dtypes.float32, dtypes.float32),
    (Ops.MAX, dtypes.bool, dtypes.bool),
    (Ops.RECIPROCAL, dtypes.float32, dtypes.float32),
    (Ops.MOD, dtypes.int32, dtypes.int32),
    (Ops.XOR, dtypes.bool, dtypes.bool),
    (Ops.SHL, dtypes.uint32, dtypes.uint32),
    (Ops.SHR, dtypes.uint32, dtypes.uint32),
]


def _operands(dtype: DType, n: int) -> list[Arr]:
    rng = np.random.default_rng(4)
    if dtype == dtypes.bool:
        return [rng.integers(0, 2, n).astype(np.bool_) for _ in range(3)]
    if dtypes.is_int(dtype):
        ints = [rng.integers(-1000, 1000, n) for _ in range(3)]
        ints[1] = np.where(ints[1] == 0, 7, ints[1])  # no division by zero
        return [v.astype(_np_dtype(dtype)) for v in ints]
    vals = [rng.standard_normal(n) * 10 for _ in range(3)]
    vals[0][:4], vals[1][:4] = [np.nan, 1.0, 0.0, -0.0], [1.0, np.nan, -0.0, 0.0]
    vals[1][4:8] = vals[0][4:8]
    return [v.astype(_np_dtype(dtype)) for v in vals]


@pytest.mark.parametrize(("op", "dtype", "out"), _MISSING_CASES, ids=lambda c: getattr(c, "name", None))
def test_missing_op_rewrite_matches_the_op_on_reference_executor(op: Ops, dtype: DType, out: DType) -> None:
    n = 64
    arity = 1 if op in GroupOp.Unary else 3 if op in GroupOp.Ternary else 2

    def build(*xs: UOp) -> UOp:
        if op in (Ops.SHL, Ops.SHR):
            return UOp(op, out, (xs[0], UOp.const(dtype, 3)))
        return UOp(op, out, xs[:arity])

    ast = _kernel(out, [dtype] * 3, n, build)
    args = _operands(dtype, n)
    want = _run(ast, out, n, *args)
    rewritten = graph_rewrite(ast, pm_decompose_missing, name="decompose missing")
    assert op not in _ops_in(rewritten)
    got = _run(rewritten, out, n, *args)
    assert _same_bits_or_both_nan(got, want) if dtypes.is_float(out) else np.array_equal(got, want)


# ---- choosing passes ----


@dataclass
class _FakeRenderer:
    supported_ops: frozenset[Ops] = field(default_factory=lambda: frozenset(GroupOp.ALU - {Ops.POW}))
    native_dtypes: frozenset[DType] = field(default_factory=lambda: frozenset(dtypes.all))


def test_decompositions_for_full_renderer_is_empty() -> None:
    assert decompositions_for(_FakeRenderer()) == []


def test_decompositions_for_renderer_lacking_bf16_and_fp8_emulates_each() -> None:
    r = _FakeRenderer(native_dtypes=frozenset(d for d in dtypes.all if d != dtypes.bfloat16 and not dtypes.is_fp8(d)))
    names = [name for name, _ in decompositions_for(r)]
    assert names == [
        "emulate bfloat16",
        "emulate fp8e4m3",
        "emulate fp8e5m2",
        "emulate fp8e4m3fnuz",
        "emulate fp8e5m2fnuz",
    ]


def test_decompositions_for_picks_only_missing_op_rules() -> None:
    r = _FakeRenderer(supported_ops=frozenset(GroupOp.ALU - {Ops.POW, Ops.SIN, Ops.MULACC}))
    passes = dict(decompositions_for(r))
    assert list(passes) == ["approximate transcendentals", "decompose missing ops"]
    assert {op for pat, _ in passes["approximate transcendentals"].rules for op in pat.ops or ()} == {Ops.SIN}
    assert {op for pat, _ in passes["decompose missing ops"].rules for op in pat.ops or ()} == {Ops.MULACC}


def test_decompositions_for_pipeline_on_minimal_renderer_runs_bf16_exp2() -> None:
    ops = frozenset(GroupOp.ALU - {Ops.POW, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.MULACC, Ops.SUB, Ops.CMPEQ, Ops.MAX})
    r = _FakeRenderer(ops, frozenset(d for d in dtypes.all if d != dtypes.bfloat16))
    x = float_to_bf16_bits(np.linspace(-20, 20, 101).astype(np.float32))
    ast = _kernel(dtypes.bfloat16, [dtypes.bfloat16], 101, lambda a: UOp(Ops.EXP2, dtypes.bfloat16, (a,)))
    passes = decompositions_for(r)
    got = _run(ast, dtypes.bfloat16, 101, x, passes=[pm for _, pm in passes])
    rewritten = ast
    for name, pm in passes:
        rewritten = graph_rewrite(rewritten, pm, name=name)
    assert not _ops_in(rewritten) & (set(GroupOp.ALU) - ops)
    np.testing.assert_array_equal(got, float_to_bf16_bits(np.exp2(bf16_bits_to_float(x).astype(np.float64))))
