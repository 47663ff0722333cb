"""Tests of the PYTHON reference executor: hand-built linear programs, and every ALU op against numpy."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

from xgrad.dtype import DType, dtypes, fp8_bits_to_float, to_np_dtype
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad_codegen.pydevice import PythonDevice
from xgrad_codegen.pyexec import (
    ProgramError,
    UndefinedBehaviorError,
    bitcast_value,
    interpret_alu,
    run_program,
)

# ---- building programs ----


def _prog(*items: UOp) -> list[UOp]:
    """A linear program: each item preceded by whatever it depends on that is not placed yet, then a SINK."""
    out: list[UOp] = []
    placed: set[UOp] = set()
    for item in items:
        for u in item.toposort:
            if u not in placed:
                placed.add(u)
                out.append(u)
    return [*out, UOp(Ops.SINK, src=tuple(u for u in out if u.op is Ops.STORE))]


def _end(r: UOp) -> UOp:
    return UOp(Ops.END, src=(r,))


def _param(i: int, dtype: DType) -> UOp:
    return UOp(Ops.PARAM, dtype, arg=i)


def _idx(n: int) -> UOp:
    return UOp.const(dtypes.index, n)


def _buf(arr: npt.NDArray[Any]) -> memoryview:
    return memoryview(bytearray(arr.tobytes()))


def _read(mv: memoryview, dtype: Any) -> npt.NDArray[Any]:
    return np.frombuffer(bytes(mv), dtype=dtype)


def _add_program(n: int) -> list[UOp]:
    out, a, b = _param(0, dtypes.float32), _param(1, dtypes.float32), _param(2, dtypes.float32)
    r = UOp.range(n, 0, AxisType.GLOBAL)
    st = out.index(r).store(a.index(r).load() + b.index(r).load())
    return _prog(r, st, _end(r))


# ---- programs ----


def test_elementwise_add_float32_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    bufs = [_buf(np.zeros(16, np.float32)), _buf(a), _buf(b)]
    run_program(_add_program(16), bufs)
    np.testing.assert_array_equal(_read(bufs[0], np.float32), a + b)


def test_global_range_split_start_end_covers_whole_range() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(10).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    bufs = [_buf(np.full(10, -1, np.float32)), _buf(a), _buf(b)]
    prog = _add_program(10)
    run_program(prog, bufs, start=0, end=3)
    got = _read(bufs[0], np.float32)
    np.testing.assert_array_equal(got[:3], (a + b)[:3])
    np.testing.assert_array_equal(got[3:], -1)  # untouched outside the split
    run_program(prog, bufs, start=3, end=10)
    np.testing.assert_array_equal(_read(bufs[0], np.float32), a + b)


def test_global_range_split_outside_range_raises() -> None:
    bufs = [_buf(np.zeros(4, np.float32)) for _ in range(3)]
    with pytest.raises(ProgramError, match="outside the GLOBAL range"):
        run_program(_add_program(4), bufs, start=0, end=5)


def test_global_range_empty_split_runs_nothing() -> None:
    bufs = [_buf(np.full(4, 7, np.float32)), _buf(np.zeros(4, np.float32)), _buf(np.zeros(4, np.float32))]
    run_program(_add_program(4), bufs, start=2, end=2)
    np.testing.assert_array_equal(_read(bufs[0], np.float32), 7)


def test_reduction_sum_rows_with_accumulator() -> None:
    rows, cols = 3, 5
    x = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) / 7
    out, inp = _param(0, dtypes.float32), _param(1, dtypes.float32)
    rg = UOp.range(rows, 0, AxisType.GLOBAL)
    acc = UOp(Ops.DEFINE_ACC, dtypes.float32, (UOp.const(dtypes.float32, 0.0),), arg=0)
    rr = UOp.range(cols, 1, AxisType.REDUCE)
    assign = UOp(Ops.ASSIGN_ACC, dtypes.float32, (acc, acc + inp.index(rg * cols + rr).load()))
    st = out.index(rg).store(acc)
    bufs = [_buf(np.zeros(rows, np.float32)), _buf(x)]
    run_program(_prog(rg, acc, rr, assign, _end(rr), st, _end(rg)), bufs)
    expected: npt.NDArray[Any] = np.zeros(rows, np.float32)
    for c in range(cols):  # float32 accumulation in order, like the program
        expected = expected + x[:, c]
    np.testing.assert_array_equal(_read(bufs[0], np.float32), expected)


def test_reduction_max_int32_with_nested_loops() -> None:
    x = np.array([[3, -9, 4], [-1, -2, -3]], dtype=np.int32)
    out, inp = _param(0, dtypes.int32), _param(1, dtypes.int32)
    acc = UOp(Ops.DEFINE_ACC, dtypes.int32, (UOp.const(dtypes.int32, -(2**31)),), arg=0)
    r0, r1 = UOp.range(2, 0, AxisType.REDUCE), UOp.range(3, 1, AxisType.REDUCE)
    assign = UOp(Ops.ASSIGN_ACC, dtypes.int32, (acc, acc.maximum(inp.index(r0 * 3 + r1).load())))
    st = out.index(_idx(0)).store(acc)
    bufs = [_buf(np.zeros(1, np.int32)), _buf(x)]
    run_program(_prog(acc, r0, r1, assign, _end(r1), _end(r0), st), bufs)
    assert _read(bufs[0], np.int32)[0] == 4


def test_gated_load_false_gate_yields_zero_without_access() -> None:
    # out[i] = i >= 1 ? x[i-1] : 0 (a shift right with zero padding); x[-1] is never touched
    x = np.array([5, 6, 7, 8], dtype=np.int32)
    out, inp = _param(0, dtypes.int32), _param(1, dtypes.int32)
    r = UOp.range(4, 0, AxisType.GLOBAL)
    gate = r.ge(1)
    st = out.index(r).store(inp.index(r + (-1), gate).load())
    bufs = [_buf(np.full(4, 99, np.int32)), _buf(x)]
    run_program(_prog(r, st, _end(r)), bufs)
    np.testing.assert_array_equal(_read(bufs[0], np.int32), [0, 5, 6, 7])


def test_gated_store_false_gate_writes_nothing() -> None:
    out = _param(0, dtypes.int32)
    r = UOp.range(8, 0, AxisType.GLOBAL)
    st = out.index(r, r.lt(3)).store(r.cast(dtypes.int32) * 10)
    bufs = [_buf(np.full(3, -1, np.int32))]  # only 3 elements: positions 3..7 would be out of bounds
    run_program(_prog(r, st, _end(r)), bufs)
    np.testing.assert_array_equal(_read(bufs[0], np.int32), [0, 10, 20])


def test_unguarded_out_of_bounds_load_raises_with_buffer_and_position() -> None:
    out, inp = _param(0, dtypes.float32), _param(1, dtypes.float32)
    r = UOp.range(4, 0, AxisType.GLOBAL)
    st = out.index(r).store(inp.index(r + 1).load())
    bufs = [_buf(np.zeros(4, np.float32)), _buf(np.zeros(4, np.float32))]
    with pytest.raises(ProgramError, match=r"load of buffer 1 .*position 4"):
        run_program(_prog(r, st, _end(r)), bufs)


def test_unguarded_out_of_bounds_store_raises_negative_position() -> None:
    out = _param(0, dtypes.float32)
    st = out.index(_idx(-1)).store(UOp.const(dtypes.float32, 1.0))
    with pytest.raises(ProgramError, match=r"store of buffer 0 .*position -1"):
        run_program(_prog(st), [_buf(np.zeros(4, np.float32))])


def test_vector_load_gep_vectorize_store_float4() -> None:
    # out[4i:4i+4] = reversed(x[4i:4i+4]) * 2 through a float4 load, GEPs, and a VECTORIZE'd float4 store
    x = np.arange(8, dtype=np.float32)
    out, inp = _param(0, dtypes.float32), _param(1, dtypes.float32)
    f4 = dtypes.float32.vec(4)
    r = UOp.range(2, 0, AxisType.GLOBAL)
    vec = UOp(Ops.LOAD, f4, (UOp(Ops.INDEX, f4, (inp, r * 4)),))
    lanes = [UOp(Ops.GEP, dtypes.float32, (vec,), arg=i) * 2.0 for i in (3, 2, 1, 0)]
    st = UOp(Ops.INDEX, f4, (out, r * 4)).store(UOp(Ops.VECTORIZE, f4, tuple(lanes)))
    bufs = [_buf(np.zeros(8, np.float32)), _buf(x)]
    run_program(_prog(r, st, _end(r)), bufs)
    np.testing.assert_array_equal(_read(bufs[0], np.float32), [6, 4, 2, 0, 14, 12, 10, 8])


def test_vector_alu_lanewise_on_tuples() -> None:
    f4 = dtypes.float32.vec(4)
    assert interpret_alu(Ops.ADD, f4, (1.0, 2.0, 3.0, 4.0), (0.5, 0.5, 0.5, 0.5)) == (1.5, 2.5, 3.5, 4.5)
    assert interpret_alu(Ops.CMPLT, dtypes.bool.vec(2), (1, 5), (2, 2)) == (True, False)
    with pytest.raises(ProgramError, match="4-lane"):
        interpret_alu(Ops.ADD, f4, (1.0, 2.0), (1.0, 2.0))


def test_vector_load_out_of_bounds_last_lane_raises() -> None:
    f4 = dtypes.float32.vec(4)
    inp, out = _param(1, dtypes.float32), _param(0, dtypes.float32)
    vec = UOp(Ops.LOAD, f4, (UOp(Ops.INDEX, f4, (inp, _idx(2))),))
    st = out.index(_idx(0)).store(UOp(Ops.GEP, dtypes.float32, (vec,), arg=0))
    with pytest.raises(ProgramError, match=r"buffer 1 .*position 2 \(\+4 lanes\)"):
        run_program(_prog(st), [_buf(np.zeros(1, np.float32)), _buf(np.zeros(5, np.float32))])


def test_define_var_bounds_loop_and_missing_value_raises() -> None:
    n = UOp.variable("n", 1, 8)
    out = _param(0, dtypes.int32)
    r = UOp.range(n, 0, AxisType.GLOBAL)
    st = out.index(r).store(r.cast(dtypes.int32) + 1)
    prog = _prog(r, st, _end(r))
    bufs = [_buf(np.zeros(8, np.int32))]
    run_program(prog, bufs, {"n": 3})
    np.testing.assert_array_equal(_read(bufs[0], np.int32), [1, 2, 3, 0, 0, 0, 0, 0])
    with pytest.raises(ProgramError, match="'n' has no value"):
        run_program(prog, bufs)
    with pytest.raises(ProgramError, match="outside its range"):
        run_program(prog, bufs, {"n": 9})


def test_program_without_global_range_runs_once_as_item_zero() -> None:
    out = _param(0, dtypes.int32)
    acc = UOp(Ops.DEFINE_ACC, dtypes.int32, (UOp.const(dtypes.int32, 0),), arg=0)
    r = UOp.range(4, 0, AxisType.LOOP)
    assign = UOp(Ops.ASSIGN_ACC, dtypes.int32, (acc, acc + 1))
    st = out.index(_idx(0)).store(acc)
    prog = _prog(acc, r, assign, _end(r), st)
    bufs = [_buf(np.zeros(1, np.int32))]
    run_program(prog, bufs, start=1, end=2)  # item 0 is not in [1, 2): nothing runs
    assert _read(bufs[0], np.int32)[0] == 0
    run_program(prog, bufs)
    assert _read(bufs[0], np.int32)[0] == 4


def test_store_converts_value_to_buffer_dtype_like_c() -> None:
    out8, outb, outi = _param(0, dtypes.int8), _param(1, dtypes.bool), _param(2, dtypes.int32)
    stores = [
        out8.index(_idx(0)).store(UOp.const(dtypes.int32, 300)),  # int wraparound
        outb.index(_idx(0)).store(UOp.const(dtypes.int32, 2)),  # != 0
        outi.index(_idx(0)).store(UOp.const(dtypes.float32, -2.75)),  # truncation toward zero
    ]
    bufs = [_buf(np.zeros(1, np.int8)), _buf(np.zeros(1, np.bool_)), _buf(np.zeros(1, np.int32))]
    run_program(_prog(*stores), bufs)
    assert bytes(bufs[0]) == struct.pack("b", 44) and bytes(bufs[1]) == b"\x01"
    assert _read(bufs[2], np.int32)[0] == -2


def test_source_used_before_computed_raises() -> None:
    a = UOp.const(dtypes.int32, 1)
    b = a + 2
    with pytest.raises(ProgramError, match="not computed before"):
        run_program([b, a, UOp(Ops.SINK)], [])


def test_unbalanced_range_end_raises() -> None:
    r0, r1 = UOp.range(2, 0), UOp.range(2, 1)
    with pytest.raises(ProgramError, match="innermost"):
        run_program([*_prog(r0, r1)[:-1], _end(r0), _end(r1), UOp(Ops.SINK)], [])
    with pytest.raises(ProgramError, match="no END"):
        run_program(_prog(r0), [])


def test_program_missing_sink_raises() -> None:
    with pytest.raises(ProgramError, match="SINK"):
        run_program([UOp.const(dtypes.int32, 1)], [])


def test_missing_buffer_raises() -> None:
    st = _param(2, dtypes.int32).index(_idx(0)).store(UOp.const(dtypes.int32, 1))
    with pytest.raises(ProgramError, match="PARAM 2"):
        run_program(_prog(st), [_buf(np.zeros(1, np.int32))])


def test_noop_passes_first_source_through() -> None:
    out = _param(0, dtypes.int32)
    st = out.index(_idx(0)).store(UOp(Ops.NOOP, dtypes.int32, (UOp.const(dtypes.int32, 42),)))
    bufs = [_buf(np.zeros(1, np.int32))]
    run_program(_prog(st), bufs)
    assert _read(bufs[0], np.int32)[0] == 42


# ---- bf16 / fp8 buffers ----


def _store_load_program(buf_dtype: DType, n: int) -> list[UOp]:
    """out(float32)[i] = (float32) mid(buf_dtype)[i] where mid[i] = in(float32)[i]: a round trip through memory."""
    out, mid, inp = _param(0, dtypes.float32), _param(1, buf_dtype), _param(2, dtypes.float32)
    r = UOp.range(n, 0, AxisType.GLOBAL)
    st_mid = mid.index(r).store(inp.index(r).load())
    st_out = out.index(r).store(mid.index(r).load().cast(dtypes.float32))
    return _prog(r, st_mid, st_out, _end(r))


def test_bf16_buffer_round_trip_matches_ml_dtypes() -> None:
    rng = np.random.default_rng(2)
    raw = np.concatenate([rng.standard_normal(64) * 1e3, [0.0, -0.0, np.inf, -np.inf, 3.4e38, 1e-40, 1.00390625]])
    x = raw.astype(np.float32)
    bufs = [_buf(np.zeros(len(x), np.float32)), memoryview(bytearray(2 * len(x))), _buf(x)]
    run_program(_store_load_program(dtypes.bfloat16, len(x)), bufs)
    expected = x.astype(ml_dtypes.bfloat16)
    assert bytes(bufs[1]) == expected.tobytes()
    np.testing.assert_array_equal(_read(bufs[0], np.float32), expected.astype(np.float32))


FP8_ML = {
    dtypes.fp8e4m3: ml_dtypes.float8_e4m3fn,
    dtypes.fp8e5m2: ml_dtypes.float8_e5m2,
    dtypes.fp8e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
    dtypes.fp8e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
}


@pytest.mark.parametrize("fp8", dtypes.fp8s, ids=lambda d: d.name)
def test_fp8_buffer_round_trip_every_bit_pattern(fp8: DType) -> None:
    values = fp8_bits_to_float(np.arange(256, dtype=np.uint8), fp8)
    finite = values[np.isfinite(values)]
    bufs = [_buf(np.zeros(len(finite), np.float32)), memoryview(bytearray(len(finite))), _buf(finite)]
    run_program(_store_load_program(fp8, len(finite)), bufs)
    np.testing.assert_array_equal(_read(bufs[0], np.float32), finite)
    # independent oracle for rounding: ml_dtypes, on values inside the finite range (it does not saturate)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(64) * float(np.nanmax(finite)) / 4).astype(np.float32)
    x = x[np.abs(x) <= np.nanmax(finite)]
    bufs = [_buf(np.zeros(len(x), np.float32)), memoryview(bytearray(len(x))), _buf(x)]
    run_program(_store_load_program(fp8, len(x)), bufs)
    np.testing.assert_array_equal(_read(bufs[0], np.float32), x.astype(FP8_ML[fp8]).astype(np.float32))


def test_fp8_store_overflow_saturates() -> None:
    got = interpret_alu(Ops.CAST, dtypes.fp8e4m3, -1e6)
    assert got == -448.0


# ---- ALU ops against numpy ----

INT_DTYPES = [
    dtypes.int8,
    dtypes.uint8,
    dtypes.int16,
    dtypes.uint16,
    dtypes.int32,
    dtypes.uint32,
    dtypes.int64,
    dtypes.uint64,
]
FLOAT_DTYPES = [dtypes.float16, dtypes.float32, dtypes.float64]
SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, np.nan, 1e-45, 65504.0, 3.4e38, -2.5, 1e30]


def _int_values(d: DType, n: int, seed: int) -> npt.NDArray[Any]:
    npd = to_np_dtype(d)
    assert npd is not None
    info = np.iinfo(npd)
    rng = np.random.default_rng(seed)
    edge = np.array([info.min, info.max, 0, 1, info.max // 2 + 1], dtype=npd)
    small = rng.integers(-20 if info.min < 0 else 0, 20, size=n, dtype=npd)
    return np.concatenate([edge, small, rng.integers(info.min, info.max, size=n, dtype=npd, endpoint=True)])


def _float_values(d: DType, n: int, seed: int) -> npt.NDArray[Any]:
    npd = to_np_dtype(d)
    assert npd is not None
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        return np.concatenate([np.array(SPECIALS), rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)]).astype(npd)


def _run_alu(op: Ops, d: DType, *arrays: npt.NDArray[Any]) -> list[Any]:
    return [interpret_alu(op, d, *args) for args in zip(*(a.tolist() for a in arrays))]


def _assert_same_floats(got: list[Any], expected: npt.NDArray[Any]) -> None:
    g = np.array(got, dtype=expected.dtype)
    both_nan = np.isnan(g) & np.isnan(expected)
    same = (g == expected) & (np.signbit(g) == np.signbit(expected))
    bad = ~(both_nan | same)
    assert not bad.any(), f"got {g[bad]} expected {expected[bad]}"


NP_INT_BINARY: dict[Ops, Callable[..., Any]] = {
    Ops.ADD: np.add,
    Ops.SUB: np.subtract,
    Ops.MUL: np.multiply,
    Ops.MAX: np.maximum,
    Ops.AND: np.bitwise_and,
    Ops.OR: np.bitwise_or,
    Ops.XOR: np.bitwise_xor,
}
NP_COMPARE: dict[Ops, Callable[..., Any]] = {Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal}


@pytest.mark.parametrize("op", list(NP_INT_BINARY), ids=lambda o: o.name)
@pytest.mark.parametrize("d", INT_DTYPES, ids=lambda d: d.name)
def test_int_binary_op_wraps_like_numpy(op: Ops, d: DType) -> None:
    a, b = _int_values(d, 50, 4), _int_values(d, 50, 5)[::-1]
    got = _run_alu(op, d, a, b)
    assert got == NP_INT_BINARY[op](a, b).tolist()


@pytest.mark.parametrize("op", list(NP_COMPARE), ids=lambda o: o.name)
@pytest.mark.parametrize("d", INT_DTYPES + FLOAT_DTYPES, ids=lambda d: d.name)
def test_comparison_matches_numpy_including_nan(op: Ops, d: DType) -> None:
    vals = _float_values(d, 30, 6) if dtypes.is_float(d) else _int_values(d, 30, 6)
    a, b = np.repeat(vals, 3), np.concatenate([vals, vals[::-1], np.roll(vals, 1)])
    assert _run_alu(op, dtypes.bool, a, b) == NP_COMPARE[op](a, b).tolist()


@pytest.mark.parametrize("d", INT_DTYPES, ids=lambda d: d.name)
def test_idiv_mod_truncate_like_c_against_numpy_fmod(d: DType) -> None:
    a, b = _int_values(d, 60, 7), _int_values(d, 60, 8)[::-1]
    ok = (b != 0) & ~((a == np.iinfo(a.dtype).min) & (b == -1) if np.iinfo(a.dtype).min < 0 else False)
    a, b = a[ok], b[ok]
    rem = np.fmod(a, b)  # C remainder: the sign of the dividend
    assert _run_alu(Ops.MOD, d, a, b) == rem.tolist()
    assert _run_alu(Ops.IDIV, d, a, b) == ((a - rem) // b).tolist()


@pytest.mark.parametrize("op", [Ops.SHL, Ops.SHR], ids=lambda o: o.name)
@pytest.mark.parametrize("d", INT_DTYPES, ids=lambda d: d.name)
def test_shift_matches_numpy(op: Ops, d: DType) -> None:
    a = _int_values(d, 40, 9)
    b = np.random.default_rng(10).integers(0, 8 * d.itemsize, size=len(a)).astype(a.dtype)
    expected = (np.left_shift if op is Ops.SHL else np.right_shift)(a, b)
    assert _run_alu(op, d, a, b) == expected.tolist()


NP_FLOAT: dict[Ops, Callable[..., Any]] = {
    Ops.ADD: np.add,
    Ops.SUB: np.subtract,
    Ops.MUL: np.multiply,
    Ops.FDIV: np.divide,
    Ops.SQRT: np.sqrt,
    Ops.RECIPROCAL: np.reciprocal,
    Ops.NEG: np.negative,
    Ops.TRUNC: np.trunc,
}


@pytest.mark.parametrize("op", list(NP_FLOAT), ids=lambda o: o.name)
@pytest.mark.parametrize("d", FLOAT_DTYPES, ids=lambda d: d.name)
def test_float_op_bit_exact_with_numpy(op: Ops, d: DType) -> None:
    vals = _float_values(d, 40, 11)
    unary = op in (Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC)
    args = (vals,) if unary else (np.repeat(vals, 2), np.concatenate([vals[::-1], np.roll(vals, 3)]))
    with np.errstate(all="ignore"):
        expected = NP_FLOAT[op](*args)
    _assert_same_floats(_run_alu(op, d, *args), expected)


@pytest.mark.parametrize("op", [Ops.EXP2, Ops.LOG2, Ops.SIN], ids=lambda o: o.name)
@pytest.mark.parametrize("d", FLOAT_DTYPES, ids=lambda d: d.name)
def test_transcendental_within_one_ulp_of_float64_numpy(op: Ops, d: DType) -> None:
    vals = _float_values(d, 40, 12)
    fn = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin}[op]
    with np.errstate(all="ignore"):
        expected = fn(vals.astype(np.float64)).astype(vals.dtype)
    got = np.array(_run_alu(op, d, vals), dtype=vals.dtype)
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(got)], expected[~finite & ~np.isnan(expected)])
    ulps = np.abs(got[finite].astype(np.float64) - expected[finite]) / np.spacing(np.abs(expected[finite]))
    assert ulps.max(initial=0) <= 1


@pytest.mark.parametrize("d", FLOAT_DTYPES, ids=lambda d: d.name)
def test_float_max_non_nan_matches_numpy(d: DType) -> None:
    vals = _float_values(d, 40, 13)
    vals = vals[~np.isnan(vals) & (vals != 0)]
    a, b = vals, vals[::-1]
    _assert_same_floats(_run_alu(Ops.MAX, d, a, b), np.maximum(a, b))


@pytest.mark.parametrize("d", FLOAT_DTYPES, ids=lambda d: d.name)
def test_mulacc_rounds_product_then_sum(d: DType) -> None:
    vals = _float_values(d, 30, 14)
    a, b, c = vals, np.roll(vals, 1), np.roll(vals, 2)
    with np.errstate(all="ignore"):
        expected = a * b + c  # numpy rounds each op to the dtype
    _assert_same_floats(_run_alu(Ops.MULACC, d, a, b, c), expected)


def test_mulacc_int_wraps() -> None:
    assert interpret_alu(Ops.MULACC, dtypes.int8, 100, 2, 1) == -55


def test_where_selects_lanewise() -> None:
    assert interpret_alu(Ops.WHERE, dtypes.int32, True, 1, 2) == 1
    assert interpret_alu(Ops.WHERE, dtypes.int32.vec(2), (True, False), (1, 1), (2, 2)) == (1, 2)


def test_bool_logic_matches_numpy() -> None:
    a = np.array([False, False, True, True])
    b = np.array([False, True, False, True])
    assert _run_alu(Ops.AND, dtypes.bool, a, b) == (a & b).tolist()
    assert _run_alu(Ops.OR, dtypes.bool, a, b) == (a | b).tolist()
    assert _run_alu(Ops.XOR, dtypes.bool, a, b) == (a ^ b).tolist()
    assert _run_alu(Ops.CMPNE, dtypes.bool, a, b) == (a != b).tolist()


def test_float32_rounds_after_every_op() -> None:
    assert interpret_alu(Ops.ADD, dtypes.float32, 1.0, 2.0**-24) == 1.0  # a tie: to even
    assert interpret_alu(Ops.ADD, dtypes.float64, 1.0, 2.0**-24) == 1.0 + 2.0**-24
    assert interpret_alu(Ops.MUL, dtypes.float32, 3.0e38, 10.0) == math.inf
    assert interpret_alu(Ops.ADD, dtypes.float16, 65504.0, 16.0) == math.inf


# ---- C edge cases ----


@pytest.mark.parametrize("a", range(-9, 10))
@pytest.mark.parametrize("b", [-4, -3, -1, 1, 2, 5])
def test_idiv_mod_negative_operands_truncate_toward_zero(a: int, b: int) -> None:
    q = math.trunc(a / b)
    assert interpret_alu(Ops.IDIV, dtypes.int32, a, b) == q
    assert interpret_alu(Ops.MOD, dtypes.int32, a, b) == a - b * q


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint64], ids=str)
@pytest.mark.parametrize("a", [5, 0, -5, "min", "max"])
def test_int_division_by_zero_is_zero_and_remainder_the_dividend(dtype: DType, a: int | str) -> None:
    """xgrad defines what C leaves undefined (x86 traps): x IDIV 0 is 0, x MOD 0 is x, for every int dtype."""
    value = dtypes.min(dtype) if a == "min" else dtypes.max(dtype) if a == "max" else a
    if dtypes.is_unsigned(dtype) and isinstance(value, int) and value < 0:
        value += 1 << (8 * dtype.itemsize)
    assert interpret_alu(Ops.IDIV, dtype, value, 0) == 0
    assert interpret_alu(Ops.MOD, dtype, value, 0) == value


@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64], ids=str)
def test_int_division_of_the_minimum_by_minus_one_wraps(dtype: DType) -> None:
    lo = dtypes.min(dtype)
    assert interpret_alu(Ops.IDIV, dtype, lo, -1) == lo
    assert interpret_alu(Ops.MOD, dtype, lo, -1) == 0


@pytest.mark.parametrize("op", [Ops.SHL, Ops.SHR], ids=lambda o: o.name)
@pytest.mark.parametrize("amount", [-1, 32, 40])
def test_shift_by_bit_width_or_negative_raises(op: Ops, amount: int) -> None:
    with pytest.raises(UndefinedBehaviorError, match="undefined"):
        interpret_alu(op, dtypes.int32, 1, amount)


def test_shr_arithmetic_for_signed_logical_for_unsigned() -> None:
    assert interpret_alu(Ops.SHR, dtypes.int8, -128, 1) == -64
    assert interpret_alu(Ops.SHR, dtypes.uint8, 128, 1) == 64
    assert interpret_alu(Ops.SHL, dtypes.uint8, 0xFF, 4) == 0xF0


def test_float_division_by_zero_follows_ieee() -> None:
    assert interpret_alu(Ops.FDIV, dtypes.float32, 1.0, 0.0) == math.inf
    assert interpret_alu(Ops.FDIV, dtypes.float32, 1.0, -0.0) == -math.inf
    assert interpret_alu(Ops.FDIV, dtypes.float32, -1.0, 0.0) == -math.inf
    assert math.isnan(interpret_alu(Ops.FDIV, dtypes.float32, 0.0, 0.0))
    assert interpret_alu(Ops.RECIPROCAL, dtypes.float32, -0.0) == -math.inf


def test_transcendental_edge_values() -> None:
    f32 = dtypes.float32
    assert interpret_alu(Ops.LOG2, f32, 0.0) == -math.inf
    assert interpret_alu(Ops.LOG2, f32, -0.0) == -math.inf
    assert math.isnan(interpret_alu(Ops.LOG2, f32, -1.0))
    assert math.isnan(interpret_alu(Ops.SQRT, f32, -1.0))
    assert math.copysign(1.0, interpret_alu(Ops.SQRT, f32, -0.0)) == -1.0
    assert interpret_alu(Ops.EXP2, f32, 200.0) == math.inf
    assert interpret_alu(Ops.EXP2, dtypes.float64, 5000.0) == math.inf
    assert interpret_alu(Ops.EXP2, f32, -math.inf) == 0.0
    assert math.isnan(interpret_alu(Ops.SIN, f32, math.inf))
    assert math.copysign(1.0, interpret_alu(Ops.TRUNC, f32, -0.5)) == -1.0


def test_float_only_op_on_int_dtype_raises() -> None:
    with pytest.raises(TypeError, match="float dtypes only"):
        interpret_alu(Ops.SQRT, dtypes.int32, 4)
    with pytest.raises(TypeError, match="int dtypes only"):
        interpret_alu(Ops.IDIV, dtypes.float32, 4.0, 2.0)


# ---- casts and bitcasts ----

CAST_CASES = [
    (dtypes.float32, dtypes.int32, [0.0, -0.0, 1.5, -1.5, 2.9, -2.9, 1e9, -2147483648.0]),
    (dtypes.float32, dtypes.uint8, [0.0, -0.9, 255.9, 3.5]),
    (dtypes.int32, dtypes.float32, [0, 1, -1, 16777217, -16777219, 2**31 - 1]),
    (dtypes.int64, dtypes.float32, [2**60 + 2**36 + 1, -(2**60 + 2**36 + 1), 2**63 - 1, 2**24 + 1]),
    (dtypes.uint64, dtypes.float32, [2**64 - 1, 2**53 + 1, 2**63 + 2**39 + 1]),
    (dtypes.int64, dtypes.float64, [2**53 + 1, 2**63 - 1, -(2**62 + 1)]),
    (dtypes.float32, dtypes.float16, [1.0, 1.0004883, 65504.0, 65520.0, 1e5, 1e-8, -3.0e-5, np.inf, np.nan]),
    (dtypes.float64, dtypes.float32, [1.0 + 2**-24, 1.0 + 2**-24 + 2**-50, 3.5e38, -1e-46]),
    (dtypes.float16, dtypes.float32, [0.5, -65504.0, 6e-8]),
    (dtypes.int32, dtypes.int8, [127, 128, -129, 300, -(2**31)]),
    (dtypes.uint32, dtypes.int16, [2**32 - 1, 32768, 65535]),
    (dtypes.int8, dtypes.uint64, [-1, -128, 5]),
    (dtypes.float32, dtypes.bool, [0.0, -0.0, 0.5, np.nan, -np.inf]),
    (dtypes.int32, dtypes.bool, [0, 1, -7]),
    (dtypes.bool, dtypes.float32, [True, False]),
    (dtypes.bool, dtypes.int32, [True, False]),
]


@pytest.mark.parametrize(("src", "dst", "values"), CAST_CASES, ids=lambda x: getattr(x, "name", ""))
def test_cast_matches_numpy_astype(src: DType, dst: DType, values: list[Any]) -> None:
    src_np, dst_np = to_np_dtype(src), to_np_dtype(dst)
    assert src_np is not None and dst_np is not None
    with np.errstate(all="ignore"):
        arr = np.array(values, dtype=src_np) if dtypes.is_int(src) else np.array(values).astype(src_np)
        expected = arr.astype(dst_np)
    got = _run_alu(Ops.CAST, dst, arr)
    if dtypes.is_float(dst):
        _assert_same_floats(got, expected)
    else:
        assert got == expected.tolist()


@pytest.mark.parametrize("value", [math.nan, math.inf, 2147483648.0, -2147483649.0])
def test_cast_float_to_int_out_of_range_raises(value: float) -> None:
    with pytest.raises(UndefinedBehaviorError, match="int32"):
        interpret_alu(Ops.CAST, dtypes.int32, value)


def test_cast_negative_float_to_unsigned_raises() -> None:
    with pytest.raises(UndefinedBehaviorError, match="uint8"):
        interpret_alu(Ops.CAST, dtypes.uint8, -1.0)


def test_cast_float32_to_bf16_rounds_to_nearest_even() -> None:
    x = np.array([1.00390625, 1.01171875, -3.3e38, 3.4e38, 1e-40, 123.456], dtype=np.float32)
    expected = x.astype(ml_dtypes.bfloat16).astype(np.float64).tolist()
    assert _run_alu(Ops.CAST, dtypes.bfloat16, x) == expected


@pytest.mark.parametrize(
    ("src", "dst", "value"),
    [
        (dtypes.float32, dtypes.int32, 1.0),
        (dtypes.int32, dtypes.float32, 0x7F800001),
        (dtypes.uint16, dtypes.float16, 0x7BFF),
        (dtypes.float64, dtypes.int64, -2.5),
        (dtypes.int8, dtypes.uint8, -1),
        (dtypes.float32.vec(2), dtypes.uint64, (1.0, -2.0)),
        (dtypes.uint64, dtypes.int32.vec(2), 0x1234567880000000),
    ],
    ids=lambda x: repr(x),
)
def test_bitcast_reinterprets_bytes_like_numpy_view(src: DType, dst: DType, value: Any) -> None:
    src_np, dst_np = to_np_dtype(src), to_np_dtype(dst)
    assert src_np is not None and dst_np is not None
    arr = np.array(value if isinstance(value, tuple) else [value], dtype=src_np)
    expected = arr.view(dst_np).tolist()
    got = bitcast_value(src, dst, value)
    got_list = list(got) if isinstance(got, tuple) else [got]
    if dtypes.is_float(dst) and math.isnan(expected[0]):
        assert math.isnan(got_list[0])
    else:
        assert got_list == expected


def test_bitcast_size_mismatch_raises() -> None:
    with pytest.raises(ProgramError, match="sizes differ"):
        bitcast_value(dtypes.float32, dtypes.int64, 1.0)


def test_bitcast_in_program_float_to_int_bits() -> None:
    out = _param(0, dtypes.int32)
    st = out.index(_idx(0)).store(UOp.const(dtypes.float32, -2.0).bitcast(dtypes.int32))
    bufs = [_buf(np.zeros(1, np.int32))]
    run_program(_prog(st), bufs)
    assert _read(bufs[0], np.int32)[0] == np.array([-2.0], np.float32).view(np.int32)[0]


# ---- the PYTHON device ----


def test_python_device_allocator_copies_and_offsets() -> None:
    dev = PythonDevice("PYTHON")
    alloc = dev.allocator
    h = alloc.alloc(16)
    alloc.copyin(h, np.arange(4, dtype=np.float32).data)
    view = alloc.offset(h, 4, 8)
    out = np.zeros(2, np.float32)
    alloc.copyout(out.data, view)
    np.testing.assert_array_equal(out, [1, 2])
    assert bytes(alloc.as_memoryview(h)) == np.arange(4, dtype=np.float32).tobytes()
    with pytest.raises(ValueError, match="outside a buffer"):
        alloc.offset(h, 12, 8)
    with pytest.raises(ValueError, match="copyin of 4 bytes"):
        alloc.copyin(h, memoryview(b"1234"))
    alloc.free(h, 16)


def test_python_device_run_linear_checks_global_size() -> None:
    dev = PythonDevice("PYTHON")
    a = np.arange(4, dtype=np.float32)
    handles = [dev.allocator.alloc(16) for _ in range(3)]
    dev.allocator.copyin(handles[1], a.data)
    dev.allocator.copyin(handles[2], a.data)
    dev.run_linear(_add_program(4), handles, global_size=(4,))
    np.testing.assert_array_equal(_read(dev.allocator.as_memoryview(handles[0]), np.float32), a + a)
    with pytest.raises(ProgramError, match="global_size"):
        dev.run_linear(_add_program(4), handles, global_size=(8,))


def test_python_device_opens_through_plugin_factory() -> None:
    from xgrad_codegen.plugin import _open_python, python_available

    assert python_available() == (True, "")
    dev = _open_python("PYTHON")
    assert isinstance(dev, PythonDevice) and dev.name == "PYTHON" and dev.renderer.name == "PYTHON"


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.float64], ids=str)
def test_max_propagates_nan_from_either_operand(dtype: DType) -> None:
    assert math.isnan(interpret_alu(Ops.MAX, dtype, math.nan, 1.0))
    assert math.isnan(interpret_alu(Ops.MAX, dtype, 1.0, math.nan))
    assert interpret_alu(Ops.MAX, dtype, -math.inf, 2.0) == 2.0
