"""Remainder folding before the optimizer (`xgrad_codegen.fold`): the folded index equals the original one at every
point of its ranges (checked exhaustively against Python's arithmetic), and sliding-window remainders disappear."""

from __future__ import annotations

import itertools

import pytest

from xgrad.dtype import dtypes
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.pattern import substitute
from xgrad.uop.symbolic import simplify
from xgrad_codegen.fold import fold_indexes

IDX = dtypes.index


def c_mod(a: int, b: int) -> int:
    return a - b * int(a / b)


def value(u: UOp, env: dict[UOp, int]) -> int:
    out = simplify(substitute(u, {r: UOp.const(IDX, v) for r, v in env.items()}))
    assert out.op is Ops.CONST
    return int(out.arg)


def has_mod(u: UOp) -> bool:
    return any(x.op is Ops.MOD for x in u.toposort)


def test_sliding_window_remainder_becomes_a_sum() -> None:
    kh, h = UOp.range(3, 0), UOp.range(56, 1)
    folded = fold_indexes((kh * 59 + h) % 58)
    assert not has_mod(folded)
    for a, b in itertools.product(range(3), range(56)):
        assert value(folded, {kh: a, h: b}) == c_mod(a * 59 + b, 58)


@pytest.mark.parametrize(
    "k,offset,hsize,d",
    [(59, 0, 100, 58), (11, 3, 9, 10), (7, -2, 5, 3), (13, 0, 4, 4), (2, 5, 6, 7)],
)
def test_folded_remainder_matches_c_remainder_everywhere(k: int, offset: int, hsize: int, d: int) -> None:
    r, h = UOp.range(4, 0), UOp.range(hsize, 1)
    expr = (r * k + h + offset) % d
    folded = fold_indexes(expr)
    for a, b in itertools.product(range(4), range(hsize)):
        assert value(folded, {r: a, h: b}) == c_mod(a * k + b + offset, d), (a, b)


def test_remainder_of_a_possibly_negative_dividend_is_left_alone() -> None:
    r = UOp.range(3, 0)
    expr = simplify((r * 59 + -70) % 58)
    assert fold_indexes(expr) is expr


def gated_load(gate: UOp, pos: UOp) -> UOp:
    buf = UOp(Ops.PARAM, dtypes.float32, (), 1)
    return UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, dtypes.float32, (buf, pos, gate)),))


def test_mask_over_a_load_with_the_same_gate_is_dropped() -> None:
    r, h = UOp.range(3, 0), UOp.range(8, 1)
    gate = UOp.const(dtypes.index, 0).lt(r + h).logical_and((r + h).lt(9))
    ld = gated_load(gate, r + h)
    masked = UOp(Ops.WHERE, dtypes.float32, (UOp.const(dtypes.index, 0).lt(r + h), ld, UOp.const(dtypes.float32, 0.0)))
    assert fold_indexes(masked) is ld


def test_mask_with_a_condition_the_gate_lacks_is_kept() -> None:
    r, h = UOp.range(3, 0), UOp.range(8, 1)
    ld = gated_load(UOp.const(dtypes.index, 0).lt(r + h), r + h)
    masked = UOp(Ops.WHERE, dtypes.float32, (h.lt(5), ld, UOp.const(dtypes.float32, 0.0)))
    assert fold_indexes(masked).op is Ops.WHERE
