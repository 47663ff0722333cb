"""CRenderer: rendered text structure, and real compile-and-run of hand-built linear programs against numpy."""

from __future__ import annotations

import ctypes
import pathlib
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from xgrad.dtype import DType, dtypes
from xgrad.helpers import CPU_MARCH, dedup
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad_cpu.plugin import COMPILER_CANDIDATES
from xgrad_cpu.renderer import CRenderer

COMPILERS = dedup([path for cc in COMPILER_CANDIDATES if (path := shutil.which(cc))])
needs_cc = pytest.mark.skipif(not COMPILERS, reason="no C compiler (gcc or clang) on PATH")
IDX = dtypes.index
NP: dict[DType, Any] = {
    dtypes.float32: np.float32,
    dtypes.float16: np.float16,
    dtypes.float64: np.float64,
    dtypes.int32: np.int32,
    dtypes.uint32: np.uint32,
    dtypes.uint16: np.uint16,
    dtypes.int64: np.int64,
    dtypes.uint8: np.uint8,
    dtypes.int8: np.int8,
    dtypes.bool: np.bool_,
}


# ---- building and running programs ----
def linear(*items: UOp) -> list[UOp]:
    """A linear program: each item's not-yet-placed sources (depth first), then the item; a SINK at the end."""
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


def compile_kernel(src: str, name: str, tmp_path: pathlib.Path, cc: str = "") -> Any:
    cc = cc or COMPILERS[0]
    c_file, so_file = tmp_path / f"{name}.c", tmp_path / f"{name}_{pathlib.Path(cc).name}.so"
    c_file.write_text(src)
    # the CPU device's target (CI also runs these with CPU_MARCH=x86-64-v3); clang 19's -march=native on some AVX10
    # Xeons warns that it promotes avx10.1-256 to -512, which is about the host, not the source; -Wno-psabi as the
    # device has it: 16-lane helpers on an AVX2 target pass their vectors in memory, which no caller outside sees
    quiet = [*(["-Wno-invalid-feature-combination"] if "clang" in cc else []), "-Wno-psabi"]
    flags = ["-O2", f"-march={CPU_MARCH.value}", "-fPIC", "-shared", "-Wall", "-Werror", *quiet]
    cmd = [cc, *flags, str(c_file), "-o", str(so_file)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{result.stderr}\n{src}"
    fn = getattr(ctypes.CDLL(str(so_file)), name)
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
    fn.restype = None
    return fn


def call(fn: Any, bufs: list[np.ndarray], vars: tuple[int, ...] = (), chunks: tuple[tuple[int, int], ...] = ()) -> None:
    ptrs = (ctypes.c_void_p * len(bufs))(*[b.ctypes.data for b in bufs])
    ints = (ctypes.c_int * max(len(vars), 1))(*vars)
    for start, stop in chunks or ((0, 1),):
        fn(ptrs, ints, start, stop)


def run(
    prog: list[UOp],
    bufs: list[np.ndarray],
    tmp_path: pathlib.Path,
    global_size: int = 1,
    vars: tuple[int, ...] = (),
    name: str = "kernel",
) -> str:
    """Render, compile with every C compiler present, and run over [0, global_size) in two chunks."""
    src = CRenderer().render(name, prog)
    half = global_size // 2
    inputs = [b.copy() for b in bufs]
    first: list[np.ndarray] | None = None
    for cc in COMPILERS:
        work = [b.copy() for b in inputs]
        call(compile_kernel(src, name, tmp_path, cc), work, vars, ((0, half), (half, global_size)))
        if first is None:
            first = work
        else:
            for a, b in zip(first, work):
                if a.dtype == np.float16:  # gcc and clang round half a*b+c differently
                    np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=2e-3, atol=2e-3)
                else:
                    np.testing.assert_array_equal(a, b)
    assert first is not None
    for b, result in zip(bufs, first):
        b[...] = result
    return src


def elementwise(
    op: Ops, out_dtype: DType, in_dtypes: list[DType], n: int, width: int = 1, offset: int = 0
) -> list[UOp]:
    """out[i] = op(in1[i], in2[i], ...), `width` lanes per iteration starting at element `offset`."""
    out = param(0, out_dtype)
    ins = [param(i + 1, d) for i, d in enumerate(in_dtypes)]
    r = UOp.range(idx(n // width), 0, AxisType.GLOBAL)
    pos = r * idx(width) + idx(offset) if width > 1 or offset else r
    vals = [UOp(Ops.LOAD, p.dtype.vec(width), (UOp(Ops.INDEX, p.dtype.vec(width), (p, pos)),)) for p in ins]
    value = UOp(op, out_dtype.vec(width), tuple(vals))
    store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out_dtype.vec(width), (out, pos)), value))
    return linear(store, end(r))


# ---- the numpy oracle of each op ----
def c_idiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64)) * np.sign(a) * np.sign(b)
    return q.astype(a.dtype)


ORACLE: dict[Ops, Callable[..., np.ndarray]] = {
    Ops.EXP2: np.exp2,
    Ops.LOG2: np.log2,
    Ops.SIN: np.sin,
    Ops.SQRT: np.sqrt,
    Ops.RECIPROCAL: lambda x: (1 / x).astype(x.dtype),
    Ops.NEG: lambda x: np.negative(x),
    Ops.TRUNC: np.trunc,
    Ops.ADD: lambda a, b: (a + b).astype(a.dtype),
    Ops.SUB: lambda a, b: (a - b).astype(a.dtype),
    Ops.MUL: lambda a, b: (a * b).astype(a.dtype),
    Ops.FDIV: lambda a, b: a / b,
    Ops.IDIV: c_idiv,
    Ops.MOD: lambda a, b: (a - c_idiv(a, b) * b).astype(a.dtype),
    Ops.MAX: lambda a, b: np.where(a > b, a, b),
    Ops.CMPLT: lambda a, b: a < b,
    Ops.CMPNE: lambda a, b: a != b,
    Ops.CMPEQ: lambda a, b: a == b,
    Ops.AND: lambda a, b: a & b,
    Ops.OR: lambda a, b: a | b,
    Ops.XOR: lambda a, b: a ^ b,
    Ops.SHL: lambda a, b: (a << b).astype(a.dtype),
    Ops.SHR: lambda a, b: a >> b,
    Ops.WHERE: lambda c, a, b: np.where(c, a, b),
    Ops.MULACC: lambda a, b, c: (a * b + c).astype(a.dtype),
}
FLOAT_OPS = [
    Ops.EXP2,
    Ops.LOG2,
    Ops.SIN,
    Ops.SQRT,
    Ops.RECIPROCAL,
    Ops.NEG,
    Ops.TRUNC,
    Ops.ADD,
    Ops.SUB,
    Ops.MUL,
    Ops.FDIV,
    Ops.MAX,
    Ops.CMPLT,
    Ops.CMPNE,
    Ops.CMPEQ,
    Ops.WHERE,
    Ops.MULACC,
]
INT_OPS = [
    Ops.NEG,
    Ops.ADD,
    Ops.SUB,
    Ops.MUL,
    Ops.IDIV,
    Ops.MOD,
    Ops.MAX,
    Ops.CMPLT,
    Ops.CMPNE,
    Ops.CMPEQ,
    Ops.AND,
    Ops.OR,
    Ops.XOR,
    Ops.SHL,
    Ops.SHR,
    Ops.WHERE,
    Ops.MULACC,
]
BOOL_OPS = [Ops.AND, Ops.OR, Ops.XOR, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE]
CASES = [
    *[(dtypes.float32, op) for op in FLOAT_OPS],
    *[(dtypes.float16, op) for op in FLOAT_OPS],
    *[(dtypes.int32, op) for op in INT_OPS],
    *[(dtypes.uint8, op) for op in INT_OPS],
    *[(dtypes.bool, op) for op in BOOL_OPS],
]
N = 64


def make_input(dtype: DType, op: Ops, k: int, rng: np.random.Generator) -> np.ndarray:
    if dtypes.is_bool(dtype):
        return rng.random(N) < 0.5
    if dtypes.is_float(dtype):
        x = rng.normal(0, 3, N)
        if op in (Ops.LOG2, Ops.SQRT) or (op is Ops.FDIV and k == 1):
            x = np.abs(x) + 0.5
        x[:4] = [1.0, -2.5, 0.0, 3.0] if op not in (Ops.LOG2, Ops.SQRT, Ops.FDIV) else x[:4]
        return np.asarray(x, NP[dtype])
    lo, hi = (0, 256) if dtypes.is_unsigned(dtype) else (-100, 101)
    if op in (Ops.SHL, Ops.SHR) and k == 1:
        lo, hi = 0, 8
    x = rng.integers(lo, hi, N)
    if op in (Ops.IDIV, Ops.MOD) and k == 1:
        x[x == 0] = 3
    return np.asarray(x, NP[dtype])


@needs_cc
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{d.name}-{o.name}" for d, o in CASES])
def test_alu_op_matches_numpy(dtype: DType, op: Ops, width: int, tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(op.value)
    arity = 1 if op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC) else 2
    arity = 3 if op in (Ops.WHERE, Ops.MULACC) else arity
    in_dtypes = [dtypes.bool if op is Ops.WHERE and k == 0 else dtype for k in range(arity)]
    out_dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dtype
    ins = [make_input(d, op, k, rng) for k, d in enumerate(in_dtypes)]
    out = np.zeros(N, NP[out_dtype])
    run(elementwise(op, out_dtype, in_dtypes, N, width), [out, *ins], tmp_path, N // width)
    expected = ORACLE[op](*ins)
    if dtypes.is_float(out_dtype):
        tol = 2e-3 if out_dtype == dtypes.float16 else 1e-6
        np.testing.assert_allclose(out.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(out, expected)


@needs_cc
def test_elementwise_add_runs_split_over_start_end(tmp_path: pathlib.Path) -> None:
    a, b = np.arange(10, dtype=np.float32), np.full(10, 0.5, np.float32)
    out = np.zeros(10, np.float32)
    src = run(elementwise(Ops.ADD, dtypes.float32, [dtypes.float32] * 2, 10), [out, a, b], tmp_path, 10)
    np.testing.assert_array_equal(out, a + b)
    assert "for (int ridx0 = start; ridx0 < end; ridx0++) {" in src
    # a call over [3, 5) touches only elements 3 and 4
    out2 = np.zeros(10, np.float32)
    fn = compile_kernel(src, "kernel", tmp_path)
    call(fn, [out2, a, b], chunks=((3, 5),))
    np.testing.assert_array_equal(out2, np.where((np.arange(10) >= 3) & (np.arange(10) < 5), a + b, 0))


def reduction_program(rows: int, cols: int) -> list[UOp]:
    """out[i] = max(0, sum_j x[i*cols+j] * 2): a DEFINE_ACC inside the parallel loop, a REDUCE loop, an epilogue."""
    out, x = param(0, dtypes.float32), param(1, dtypes.float32)
    r = UOp.range(idx(rows), 0, AxisType.GLOBAL)
    acc = UOp(Ops.DEFINE_ACC, dtypes.float32, (UOp.const(dtypes.float32, 0.0),), 0)
    rr = UOp.range(idx(cols), 1, AxisType.REDUCE)
    val = x.index(r * idx(cols) + rr).load() * UOp.const(dtypes.float32, 2.0)
    assign = UOp(Ops.ASSIGN_ACC, dtypes.float32, (acc, acc + val))
    result = acc.maximum(UOp.const(dtypes.float32, 0.0))
    return linear(r, acc, rr, assign, end(rr), out.index(r).store(result), end(r))


@needs_cc
def test_reduction_with_define_acc_matches_numpy(tmp_path: pathlib.Path) -> None:
    x = np.random.default_rng(0).normal(size=(6, 7)).astype(np.float32)
    out = np.zeros(6, np.float32)
    src = run(reduction_program(6, 7), [out, x.reshape(-1)], tmp_path, 6)
    np.testing.assert_allclose(out, np.maximum((x * 2).sum(axis=1), 0), rtol=1e-5, atol=1e-6)
    assert "float acc0 = 0.0f;" in src and "for (int ridx1 = 0; ridx1 < 7; ridx1++) {" in src


@needs_cc
def test_gated_load_and_gated_store(tmp_path: pathlib.Path) -> None:
    # out[i] = i < 5 ? x[i] : 0, stored only where i % 2 == 0
    out, x = param(0, dtypes.float32), param(1, dtypes.float32)
    r = UOp.range(idx(10), 0, AxisType.GLOBAL)
    load = x.index(r, r.lt(idx(5))).load()
    store = out.index(r, (r % idx(2)).eq(idx(0))).store(load + UOp.const(dtypes.float32, 1.0))
    xs = np.arange(10, dtype=np.float32) * 10
    res = np.full(10, -1, np.float32)
    src = run(linear(store, end(r)), [res, xs], tmp_path, 10)
    i = np.arange(10)
    np.testing.assert_array_equal(res, np.where(i % 2 == 0, np.where(i < 5, xs, 0) + 1, -1))
    assert "if (" in src and "?data1[ridx0]:0.0f)" in src


@needs_cc
@pytest.mark.parametrize("width", [2, 3, 4, 8])
def test_vector_load_store_gep_vectorize_unaligned(width: int, tmp_path: pathlib.Path) -> None:
    # out[w*i+1 ...] = reversed lanes of x[w*i+1 ...] * 2, one vector per iteration, at indices that are not aligned
    out, x = param(0, dtypes.float32), param(1, dtypes.float32)
    n = 4
    r = UOp.range(idx(n), 0, AxisType.GLOBAL)
    pos = r * idx(width) + idx(1)
    vec = UOp(Ops.LOAD, dtypes.float32.vec(width), (UOp(Ops.INDEX, dtypes.float32.vec(width), (x, pos)),))
    lanes = [UOp(Ops.GEP, dtypes.float32, (vec,), i) for i in reversed(range(width))]
    value = UOp(Ops.VECTORIZE, dtypes.float32.vec(width), tuple(lanes))
    value = value * UOp(Ops.VECTORIZE, dtypes.float32.vec(width), (UOp.const(dtypes.float32, 2.0),) * width)
    store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, dtypes.float32.vec(width), (out, pos)), value))
    xs = np.arange(n * width + 2, dtype=np.float32)
    res = np.zeros_like(xs)
    src = run(linear(store, end(r)), [res, xs], tmp_path, n)
    expected = np.zeros_like(xs)
    expected[1 : 1 + n * width] = (xs[1 : 1 + n * width].reshape(n, width)[:, ::-1] * 2).reshape(-1)
    np.testing.assert_array_equal(res, expected)
    assert f"typedef float float{width} __attribute__((vector_size(" in src
    assert f"load_float{width}(data1+" in src and f"store_float{width}(data0+" in src


@needs_cc
def test_gated_vector_load_gives_zero_vector(tmp_path: pathlib.Path) -> None:
    out, x = param(0, dtypes.int32), param(1, dtypes.int32)
    r = UOp.range(idx(4), 0, AxisType.GLOBAL)
    v4 = dtypes.int32.vec(4)
    pos = r * idx(4)
    vec = UOp(Ops.LOAD, v4, (UOp(Ops.INDEX, v4, (x, pos, r.lt(idx(2)))),))
    store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, v4, (out, pos)), vec))
    xs = np.arange(16, dtype=np.int32) + 1
    res = np.full(16, -1, np.int32)
    run(linear(store, end(r)), [res, xs], tmp_path, 4)
    np.testing.assert_array_equal(res, np.where(np.arange(16) < 8, xs, 0))


CASTS = [
    (dtypes.float32, dtypes.int32),
    (dtypes.int32, dtypes.float32),
    (dtypes.float32, dtypes.bool),
    (dtypes.bool, dtypes.float32),
    (dtypes.float32, dtypes.float16),
    (dtypes.float16, dtypes.float32),
    (dtypes.uint8, dtypes.float32),
    (dtypes.int32, dtypes.uint8),
    (dtypes.int32, dtypes.int8),
    (dtypes.float32, dtypes.float64),
    (dtypes.int64, dtypes.int32),
    (dtypes.uint8, dtypes.bool),
]


@needs_cc
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("src_dtype,dst_dtype", CASTS, ids=[f"{a.name}-{b.name}" for a, b in CASTS])
def test_cast_matches_numpy(src_dtype: DType, dst_dtype: DType, width: int, tmp_path: pathlib.Path) -> None:
    rng = np.random.default_rng(1)
    if dtypes.is_bool(src_dtype):
        x = rng.random(N) < 0.5
    elif dtypes.is_float(src_dtype):
        x = np.asarray(rng.normal(0, 50, N), NP[src_dtype])
        x[:3] = [0.0, -0.0, 2.5]
    else:
        x = np.asarray(rng.integers(0 if dtypes.is_unsigned(src_dtype) else -300, 300, N), NP[src_dtype])
    out = np.zeros(N, NP[dst_dtype])
    run(elementwise(Ops.CAST, dst_dtype, [src_dtype], N, width), [out, x], tmp_path, N // width)
    expected = x != 0 if dtypes.is_bool(dst_dtype) else x.astype(NP[dst_dtype])
    np.testing.assert_array_equal(out, expected)


BITCASTS = [
    (dtypes.float32, dtypes.int32),
    (dtypes.int32, dtypes.float32),
    (dtypes.float32, dtypes.uint32),
    (dtypes.float16, dtypes.uint16),
    (dtypes.uint16, dtypes.float16),
    (dtypes.float64, dtypes.int64),
]


@needs_cc
@pytest.mark.parametrize("width", [1, 4])
@pytest.mark.parametrize("src_dtype,dst_dtype", BITCASTS, ids=[f"{a.name}-{b.name}" for a, b in BITCASTS])
def test_bitcast_matches_numpy_view(src_dtype: DType, dst_dtype: DType, width: int, tmp_path: pathlib.Path) -> None:
    x = np.asarray(np.random.default_rng(2).normal(0, 10, N).astype(np.float32).view(np.int32) // 3, np.int64)
    x = x.astype(NP[src_dtype]) if dtypes.is_int(src_dtype) else np.asarray(x, np.float64).astype(NP[src_dtype])
    out = np.zeros(N, NP[dst_dtype])
    run(elementwise(Ops.BITCAST, dst_dtype, [src_dtype], N, width), [out, x], tmp_path, N // width)
    np.testing.assert_array_equal(out.view(np.uint8), x.view(np.uint8))


@needs_cc
def test_define_var_values_come_from_vars_in_program_order(tmp_path: pathlib.Path) -> None:
    # out[i] = sum_{j < n} x[j] + m * i, for i in [0, 4)
    out, x = param(0, dtypes.int32), param(1, dtypes.int32)
    n, m = UOp.variable("n", 1, 10, dtypes.int32), UOp.variable("m", 0, 100, dtypes.int32)
    r = UOp.range(idx(4), 0, AxisType.GLOBAL)
    acc = UOp(Ops.DEFINE_ACC, dtypes.int32, (UOp.const(dtypes.int32, 0),), 0)
    rr = UOp(Ops.RANGE, dtypes.int32, (n,), (1, AxisType.REDUCE))
    assign = UOp(Ops.ASSIGN_ACC, dtypes.int32, (acc, acc + x.index(rr).load()))
    store = out.index(r).store(acc + m * r.cast(dtypes.int32))
    prog = linear(n, m, r, acc, rr, assign, end(rr), store, end(r))
    xs = np.arange(10, dtype=np.int32)
    res = np.zeros(4, np.int32)
    src = run(prog, [res, xs], tmp_path, 4, vars=(6, 100))
    np.testing.assert_array_equal(res, xs[:6].sum() + 100 * np.arange(4))
    assert "const int n = vars[0];" in src and "const int m = vars[1];" in src


SPECIAL_FLOATS = [0.1, -0.0, 1e-45, 3.4e38, 1e39, float("inf"), float("-inf"), float("nan"), 1 / 3, -2.5, 65504.0, 7e-8]


@needs_cc
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.float64])
def test_float_constants_are_exact(dtype: DType, tmp_path: pathlib.Path) -> None:
    out = param(0, dtype)
    stores = [out.index(idx(i)).store(UOp.const(dtype, v)) for i, v in enumerate(SPECIAL_FLOATS)]
    res = np.zeros(len(SPECIAL_FLOATS), NP[dtype])
    with np.errstate(over="ignore"):
        expected = np.array(SPECIAL_FLOATS, np.float64).astype(NP[dtype])
    run(linear(*stores), [res], tmp_path)
    np.testing.assert_array_equal(res.view(np.uint8), expected.view(np.uint8))


@needs_cc
@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.int8, dtypes.uint8])
def test_int_constants_at_the_range_ends(dtype: DType, tmp_path: pathlib.Path) -> None:
    values = [int(dtype.min), int(dtype.max), 0, 1] + ([-1] if not dtypes.is_unsigned(dtype) else [])
    out = param(0, dtype)
    stores = [out.index(idx(i)).store(UOp.const(dtype, v)) for i, v in enumerate(values)]
    res = np.zeros(len(values), {dtypes.uint64: np.uint64}.get(dtype, NP.get(dtype)))
    run(linear(*stores), [res], tmp_path)
    assert res.tolist() == values


@needs_cc
def test_narrow_int_arithmetic_wraps_like_numpy(tmp_path: pathlib.Path) -> None:
    # (a*b) >> 1 in uint16: the product must wrap to 16 bits before the shift, and must not overflow int
    a, b = param(1, dtypes.uint16), param(2, dtypes.uint16)
    out = param(0, dtypes.uint16)
    r = UOp.range(idx(4), 0, AxisType.GLOBAL)
    value = UOp(Ops.SHR, dtypes.uint16, (a.index(r).load() * b.index(r).load(), UOp.const(dtypes.uint16, 1)))
    xs, ys = np.array([65535, 300, 2, 40000], np.uint16), np.array([65535, 300, 3, 3], np.uint16)
    res = np.zeros(4, np.uint16)
    run(linear(out.index(r).store(value), end(r)), [res, xs, ys], tmp_path, 4)
    np.testing.assert_array_equal(res, (xs * ys) >> 1)


# ---- text ----
def test_signature_and_buffer_declarations() -> None:
    src = CRenderer().render("E_4", elementwise(Ops.ADD, dtypes.float32, [dtypes.float32, dtypes.int32], 4))
    assert "void E_4(void** restrict bufs, const int* restrict vars, int start, int end) {" in src
    assert "float* restrict data0 = (float*)bufs[0];" in src
    assert "const float* restrict data1 = (const float*)bufs[1];" in src
    assert "const int* restrict data2 = (const int*)bufs[2];" in src
    assert "typedef" not in src and "#include" not in src


def test_vector_typedefs_only_for_used_types() -> None:
    src = CRenderer().render("k", elementwise(Ops.MUL, dtypes.float32, [dtypes.float32] * 2, 16, width=4))
    assert src.count("typedef") == 1 and "typedef float float4 __attribute__((vector_size(16)));" in src
    assert "load_float4" in src and "store_float4" in src


def test_vector_compare_is_split_into_lanes() -> None:
    src = CRenderer().render("k", elementwise(Ops.CMPLT, dtypes.bool, [dtypes.float32] * 2, 16, width=4))
    assert "typedef unsigned char bool4 __attribute__((vector_size(4)));" in src
    assert "((bool4){(" in src and "[3]<" in src


def test_half_math_goes_through_float() -> None:
    src = CRenderer().render("k", elementwise(Ops.EXP2, dtypes.float16, [dtypes.float16], 4))
    assert "((half)__builtin_exp2f((float)val0))" in src


def test_capabilities() -> None:
    r = CRenderer("x86-64-v3")
    assert r.arch == "x86-64-v3" and r.device == "CPU" and not r.has_local
    assert dtypes.bfloat16 not in r.native_dtypes and not any(d in r.native_dtypes for d in dtypes.fp8s)
    assert {dtypes.float16, dtypes.float32, dtypes.bool, dtypes.uint8} <= r.native_dtypes
    assert Ops.POW not in r.supported_ops and {Ops.EXP2, Ops.MULACC, Ops.WHERE, Ops.SHL} <= r.supported_ops
    assert r.legalize is not None


def test_unsupported_dtype_raises_with_a_hint() -> None:
    from xgrad.errors import DTypeError

    with pytest.raises(DTypeError, match="decomposed"):
        CRenderer().render("k", elementwise(Ops.ADD, dtypes.bfloat16, [dtypes.bfloat16] * 2, 4))


@needs_cc
def test_scratch_param_is_a_local_aligned_array(tmp_path: pathlib.Path) -> None:
    """A scratch PARAM (negative arg, CONST size; see xgrad_codegen.pack) is a local array: filled in one loop and
    read back reversed in the next, it never touches `bufs`."""
    out, x = param(0, dtypes.float32), param(1, dtypes.float32)
    scratch = UOp(Ops.PARAM, dtypes.float32, (idx(8),), -1)
    r0 = UOp.range(idx(8), 0, AxisType.LOOP)
    fill = UOp(Ops.STORE, dtypes.void, (scratch.index(r0), x.index(r0).load() * UOp.const(dtypes.float32, 2.0)))
    r1 = UOp.range(idx(8), 1, AxisType.LOOP)
    read = scratch.index(idx(7) - r1).load()
    prog = linear(fill, end(r0), out.index(r1).store(read), end(r1))
    bufs = [np.zeros(8, np.float32), np.arange(8, dtype=np.float32)]
    src = run(prog, bufs, tmp_path)
    assert "float pack0[8] __attribute__((aligned(64)));" in src and "bufs[-" not in src
    np.testing.assert_array_equal(bufs[0], np.arange(8, dtype=np.float32)[::-1] * 2)


EXP2_SPECIAL = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, -126.5, -149.0, -149.5, -150.0, -160.0, 127.99, 128.0, 200.0]


@needs_cc
@pytest.mark.parametrize("width", [1, 4, 8, 16])
def test_float32_exp2_is_within_one_ulp_and_keeps_special_values(width: int, tmp_path: pathlib.Path) -> None:
    x = np.concatenate([np.linspace(-155, 130, 4000), EXP2_SPECIAL]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % width, np.float32)])
    out = np.zeros_like(x)
    src = run(
        elementwise(Ops.EXP2, dtypes.float32, [dtypes.float32], len(x), width), [out, x], tmp_path, len(x) // width
    )
    assert f"exp2_float{width if width > 1 else ''}(" in src and "__builtin_exp2f" not in src
    with np.errstate(over="ignore"):
        ref = np.exp2(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out, ref, rtol=1.5e-7, atol=1e-44)


@needs_cc
def test_float32_exp2_gives_the_same_bits_on_scalar_and_vector_lanes(tmp_path: pathlib.Path) -> None:
    """The scalar helper and every vector width compute one function: a value recomputed on another lane (or in
    another kernel) compares equal to itself."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-155, 130, 4000), rng.uniform(-1, 1, 4000), EXP2_SPECIAL]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % 16, np.float32)])
    results = []
    for width in (1, 3, 4, 8, 16):
        out = np.zeros_like(x)
        n = len(x) - len(x) % width  # 3 lanes leave a tail: the rest stays 0 in every result
        prog = elementwise(Ops.EXP2, dtypes.float32, [dtypes.float32], n, width)
        run(prog, [out, x], tmp_path, n // width, name=f"exp2_w{width}")
        results.append(out[: len(x) - len(x) % 3])
    for width, out in zip((3, 4, 8, 16), results[1:]):
        assert np.array_equal(out.view(np.uint32), results[0].view(np.uint32)), f"{width} lanes"
