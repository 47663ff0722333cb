"""Renderer base, CStyleRenderer printing rules and legalize_linear, without any backend."""

from __future__ import annotations

import ctypes
import math
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from xgrad.dtype import DType, dtypes
from xgrad.helpers import prod
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad_codegen.renderer import (
    C_INFIX_OPS,
    CStyleRenderer,
    Renderer,
    RenderState,
    infix_code_for_op,
    legalize_linear,
    pm_split_vector_ops,
    round_float,
)

F = dtypes.float32
IDX = dtypes.index


def linear(*items: UOp) -> list[UOp]:
    out: dict[UOp, None] = {}
    for item in items:
        for u in item.toposort:
            out.setdefault(u, None)
    return [*out, UOp(Ops.SINK, dtypes.void, ())]


def param(i: int, dtype: DType = F) -> UOp:
    return UOp(Ops.PARAM, dtype, (), i)


def end(r: UOp) -> UOp:
    return UOp(Ops.END, dtypes.void, (r,))


def axpy_program() -> list[UOp]:
    """out[i] = x[i] * a + y[i] for i < n, with n a DEFINE_VAR."""
    out, x, y = param(0), param(1), param(2)
    n = UOp.variable("n", 1, 100, dtypes.int32)
    r = UOp(Ops.RANGE, dtypes.int32, (n,), (0, AxisType.LOOP))
    value = x.index(r).load() * UOp.const(F, 2.5) + y.index(r).load()
    return linear(n, r, out.index(r).store(value), end(r))


def test_renderer_base_declares_capabilities_and_no_printer() -> None:
    r = Renderer()
    assert r.supported_ops == frozenset() and r.max_vector_width == 1 and r.legalize is None and not r.has_local
    assert not r.has_shared and r.global_max == () and r.local_max == () and r.max_threads == 1 and r.shared_max == 0
    assert r.tensor_cores == () and not r.supports_scratch and not r.masked_stores and not r.supports_group_reduce
    with pytest.raises(NotImplementedError):
        r.render("k", [])


CAPABILITIES = {
    "max_vector_width": int,
    "masked_stores": bool,
    "supports_scratch": bool,
    "has_local": bool,
    "has_shared": bool,
    "global_max": tuple,
    "local_max": tuple,
    "max_threads": int,
    "shared_max": int,
    "tensor_cores": tuple,
    "supported_ops": frozenset,
    "native_dtypes": frozenset,
}


@pytest.mark.parametrize("arch", [None, "sm_90", "gfx1100", "gfx942"])
def test_every_renderer_declares_every_capability_typed(arch: str | None) -> None:
    """Codegen reads the capabilities as plain attributes (no getattr defaults): each renderer has them all, typed,
    and a GPU declares limits that a workgroup can meet."""
    from xgrad_codegen.pydevice import PythonRenderer

    for r in (PythonRenderer(arch), CStyleRenderer()):
        for name, kind in CAPABILITIES.items():
            assert isinstance(getattr(r, name), kind), (type(r).__name__, name)
    gpu = PythonRenderer(arch)
    assert gpu.has_local == (arch is not None) == gpu.supports_group_reduce
    if arch is not None:
        assert len(gpu.global_max) == len(gpu.local_max) == 3 and gpu.max_threads <= prod(gpu.local_max)
        assert gpu.shared_max >= 16384


def test_codegen_reads_no_capability_through_getattr() -> None:
    import pathlib

    import xgrad_codegen

    for path in pathlib.Path(xgrad_codegen.__file__).parent.glob("*.py"):
        assert "getattr(renderer" not in path.read_text() and "getattr(self.renderer" not in path.read_text(), path


def test_cstyle_supported_ops_come_from_the_table() -> None:
    r = CStyleRenderer()
    assert r.supported_ops == frozenset(CStyleRenderer.code_for_op)
    assert Ops.EXP2 not in r.supported_ops and Ops.MAX in r.supported_ops  # math is per language


def test_cstyle_default_kernel_is_a_plain_c_function() -> None:
    src = CStyleRenderer().render("axpy", axpy_program())
    assert "void axpy(float* data0, const float* data1, const float* data2, const int n) {" in src
    assert "for (int ridx0 = 0; ridx0 < n; ridx0++) {" in src
    assert "data0[ridx0] = ((val0*2.5f)+val1);" in src


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not on PATH")
def test_cstyle_default_kernel_compiles_and_runs(tmp_path: pathlib.Path) -> None:
    (tmp_path / "k.c").write_text(CStyleRenderer().render("axpy", axpy_program()))
    cmd = ["gcc", "-O2", "-fPIC", "-shared", "-Wall", "-Werror", str(tmp_path / "k.c"), "-o", str(tmp_path / "k.so")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    fn = ctypes.CDLL(str(tmp_path / "k.so")).axpy
    x, y, out = np.arange(8, dtype=np.float32), np.ones(8, np.float32), np.zeros(8, np.float32)
    fn(*(ctypes.c_void_p(a.ctypes.data) for a in (out, x, y)), ctypes.c_int(6))
    np.testing.assert_array_equal(out, np.where(np.arange(8) < 6, x * 2.5 + 1, 0))


def test_value_used_twice_gets_a_name_and_single_use_is_inlined() -> None:
    out, x = param(0), param(1)
    r = UOp.range(UOp.const(IDX, 4), 0, AxisType.LOOP)
    v = x.index(r).load()
    twice = v + UOp.const(F, 1.0)
    src = CStyleRenderer().render("k", linear(out.index(r).store(twice * twice), end(r)))
    assert "const float alu0 = (val0+1.0f);" in src and "data0[ridx0] = (alu0*alu0);" in src


def test_max_operands_are_never_inlined_twice() -> None:
    out, x = param(0), param(1)
    r = UOp.range(UOp.const(IDX, 4), 0, AxisType.LOOP)
    value = (x.index(r).load() * UOp.const(F, 3.0)).maximum(UOp.const(F, 0.0))
    src = CStyleRenderer().render("k", linear(out.index(r).store(value), end(r)))
    assert "const float alu0 = (val0*3.0f);" in src and "((alu0>0.0f||alu0!=alu0)?alu0:0.0f)" in src


def test_expression_is_not_inlined_past_an_assignment() -> None:
    # before = acc + 1 is computed, then acc changes, then `before` is stored: it must hold the old acc
    out = param(0)
    acc = UOp(Ops.DEFINE_ACC, F, (UOp.const(F, 0.0),), 0)
    before = acc + UOp.const(F, 1.0)
    assign = UOp(Ops.ASSIGN_ACC, F, (acc, UOp.const(F, 5.0)))
    prog = linear(acc, before, assign, out.index(UOp.const(IDX, 0)).store(before))
    src = CStyleRenderer().render("k", prog)
    assert src.index("const float alu0 = (acc0+1.0f);") < src.index("acc0 = 5.0f;") < src.index("data0[0] = alu0;")


def test_dead_values_are_not_printed() -> None:
    out, x = param(0), param(1)
    _unused = x.index(UOp.const(IDX, 1)).load()
    prog = [out, x, UOp.const(IDX, 1), x.index(UOp.const(IDX, 1)), _unused]
    prog += linear(out.index(UOp.const(IDX, 0)).store(UOp.const(F, 1.0)))
    assert "data1[1]" not in CStyleRenderer().render("k", prog)


@pytest.mark.parametrize(
    "value,dtype,text",
    [
        (1.0, dtypes.float32, "1.0f"),
        (-2.5, dtypes.float32, "(-2.5f)"),
        (0.1, dtypes.float32, "0.10000000149011612f"),
        (-0.0, dtypes.float32, "(-0.0f)"),
        (math.inf, dtypes.float32, "INFINITY"),
        (-math.inf, dtypes.float32, "(-INFINITY)"),
        (math.nan, dtypes.float32, "NAN"),
        (1e39, dtypes.float32, "INFINITY"),
        (0.1, dtypes.float64, "0.1"),
        (math.inf, dtypes.float64, "((double)INFINITY)"),
        (0.1, dtypes.float16, "((half)0.0999755859375f)"),
        (-1, dtypes.int32, "(-1)"),
        (-(2**31), dtypes.int32, "(-2147483647-1)"),
        (7, dtypes.uint32, "7u"),
        (7, dtypes.int64, "7ll"),
        (7, dtypes.uint64, "7ull"),
        (True, dtypes.bool, "1"),
    ],
)
def test_constants_render_exactly(value: float, dtype: DType, text: str) -> None:
    assert CStyleRenderer().render_const(value, dtype) == text


def test_round_float_rounds_like_numpy() -> None:
    for v in (0.1, 1 / 3, 65520.0, 1e-8, 3.4028235e38 * 1.0000001):
        with np.errstate(over="ignore"):
            assert round_float(v, dtypes.float32) == float(np.float32(v))
            assert round_float(v, dtypes.float16) == float(np.float16(v))


def test_legalize_splits_vector_ops_into_lanes_in_place() -> None:
    out, x = param(0), param(1)
    v4 = F.vec(4)
    r = UOp.range(UOp.const(IDX, 4), 0, AxisType.GLOBAL)
    vec = UOp(Ops.LOAD, v4, (UOp(Ops.INDEX, v4, (x, r * UOp.const(IDX, 4))),))
    mx = UOp(Ops.MAX, v4, (vec, vec))
    prog = linear(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, v4, (out, r * UOp.const(IDX, 4))), mx)), end(r))
    pm = pm_split_vector_ops(frozenset({Ops.MAX}))
    new = legalize_linear(prog, pm)
    assert not any(u.op is Ops.MAX and u.dtype.count > 1 for u in new)
    assert sum(u.op is Ops.MAX for u in new) == 4 and sum(u.op is Ops.GEP for u in new) == 4
    seen: set[UOp] = set()
    for u in new:  # still linear: sources before users
        assert all(s in seen for s in u.src), u.op
        seen.add(u)
    assert new.index(next(u for u in new if u.op is Ops.RANGE)) < new.index(next(u for u in new if u.op is Ops.GEP))
    assert legalize_linear(new, pm) == new  # a fixpoint
    assert legalize_linear(prog, None) is prog


def test_legalize_does_not_reuse_a_node_from_a_closed_loop() -> None:
    # lane 0 of v (GEP v 0) is needed inside a loop and again after it: it is placed twice, once per scope
    out, x = param(0), param(1)
    v2 = F.vec(2)
    v = UOp(Ops.LOAD, v2, (UOp(Ops.INDEX, v2, (x, UOp.const(IDX, 0))),))
    r = UOp.range(UOp.const(IDX, 2), 0, AxisType.LOOP)
    inner = UOp(Ops.SQRT, v2, (v,))
    s1 = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, v2, (out, r * UOp.const(IDX, 2))), inner))
    after = UOp(Ops.LOG2, v2, (v,))
    prog = [*linear(v), r, *[u for u in linear(s1) if u not in linear(v) and u is not r], end(r)]
    prog = [u for u in prog if u.op is not Ops.SINK]
    s2 = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, v2, (out, UOp.const(IDX, 4))), after))
    prog += [after, UOp.const(IDX, 4), s2.src[0], s2, UOp(Ops.SINK, dtypes.void, ())]
    new = legalize_linear(prog, pm_split_vector_ops(frozenset({Ops.SQRT, Ops.LOG2})))
    gep0 = UOp(Ops.GEP, F, (v,), 0)
    assert new.count(gep0) == 2


class TinyWGSLish(CStyleRenderer):
    """A renderer made only of table entries and hooks: the shape of a ~100 line backend."""

    type_map = {**CStyleRenderer.type_map, F: "f32", dtypes.int32: "i32"}

    def render_declare(self, ctx: RenderState, dtype: DType, name: str, expr: str, mutable: bool) -> str:
        return f"{'var' if mutable else 'let'} {name}: {self.render_dtype(ctx, dtype)} = {expr};"


def test_hooks_change_the_printed_language() -> None:
    src = TinyWGSLish().render("k", axpy_program())
    assert "let val0: f32 = data1[ridx0];" in src and "for (i32 ridx0 = 0;" in src


def test_infix_table_prints_every_binary_c_operator_with_the_given_spacing() -> None:
    tight, spaced = infix_code_for_op(), infix_code_for_op(" ")
    for op, symbol in C_INFIX_OPS.items():
        assert tight[op]("a", "b", dtype=F) == f"(a{symbol}b)"
        assert spaced[op]("a", "b", dtype=F) == f"(a {symbol} b)"
        assert CStyleRenderer.code_for_op[op]("a", "b", dtype=F) == f"(a{symbol}b)"
    assert tight[Ops.MULACC]("a", "b", "c", dtype=F) == "((a*b)+c)"
    assert spaced[Ops.MULACC]("a", "b", "c", dtype=F) == "((a * b) + c)"
