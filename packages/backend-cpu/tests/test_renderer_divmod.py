"""CRenderer's integer division: x86's idiv traps (SIGFPE) on a zero divisor and on MIN / -1, so a divisor whose
bounds allow either goes through a guarded helper giving xgrad's defined results; safe divisors print C's `/`, `%`."""

from __future__ import annotations

import pytest

from xgrad.dtype import DType, dtypes
from xgrad.uop.ops import AxisType, Ops, UOp
from xgrad_cpu.renderer import CRenderer


def _program(dtype: DType, op: Ops, divisor: object) -> str:
    """out[i] = x[i] op divisor(x[i]) over a GLOBAL range of 10, rendered."""
    out, x = UOp(Ops.PARAM, dtype, (), 0), UOp(Ops.PARAM, dtype, (), 1)
    r = UOp.range(UOp.const(dtypes.index, 10), 0, AxisType.GLOBAL)
    value = x.index(r).load()
    b = divisor(value) if callable(divisor) else UOp.const(dtype, divisor)
    store = out.index(r).store(UOp(op, dtype, (value, b)))
    uops: dict[UOp, None] = {}
    for item in (store, UOp(Ops.END, dtypes.void, (r,))):
        for u in item.toposort:
            uops.setdefault(u, None)
    return CRenderer().render("k", [*uops, UOp(Ops.SINK, dtypes.void, ())])


@pytest.mark.parametrize("op", [Ops.IDIV, Ops.MOD], ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint32], ids=str)
def test_divisor_from_data_goes_through_the_guarded_helper(dtype: DType, op: Ops) -> None:
    src = _program(dtype, op, lambda v: v)
    name = f"{op.name.lower()}_{dtype.name}"
    assert "static inline" in src and f"{name}(val0, val0)" in src
    assert "b == 0 ?" in src and ("b == -1" in src) == (not dtypes.is_unsigned(dtype))


@pytest.mark.parametrize("op", [Ops.IDIV, Ops.MOD], ids=lambda o: o.name)
def test_constant_divisor_is_plain_c(op: Ops) -> None:
    src = _program(dtypes.int32, op, 3)
    assert "static inline" not in src and f"(val0{'/' if op is Ops.IDIV else '%'}3)" in src


def test_divisor_bounded_away_from_zero_and_minus_one_is_plain_c() -> None:
    # max(x, 1) lies in [1, MAX]: no trap possible
    src = _program(dtypes.int32, Ops.IDIV, lambda v: v.maximum(UOp.const(dtypes.int32, 1)))
    assert "static inline" not in src and "idiv_int32" not in src
