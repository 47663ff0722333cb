"""Tests of xgrad.dtype against independent oracles: numpy, ml_dtypes (when installed) and hand-written tables."""

from __future__ import annotations

import doctest
import importlib
import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import xgrad.dtype as dtype_module
from xgrad.dtype import (
    AddrSpace,
    DType,
    bf16_bits_to_float,
    can_lossless_cast,
    dtypes,
    float_to_bf16_bits,
    float_to_fp8_bits,
    fp8_bits_to_float,
    from_np_dtype,
    least_upper_dtype,
    least_upper_float,
    sum_acc_dtype,
    to_dtype,
    to_np_dtype,
    truncate,
)
from xgrad.errors import DTypeError
from xgrad.helpers import Context

ml_dtypes: Any = None  # the independent oracle for bfloat16 and fp8, when installed
try:
    ml_dtypes = importlib.import_module("ml_dtypes")
except ImportError:  # pragma: no cover - depends on the environment
    pass

needs_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed (pip install ml_dtypes)")

NUMPY_DTYPES = [d for d in dtypes.all if d.fmt is not None]  # the 12 dtypes numpy has
INTS_AND_BOOL = [dtypes.bool, *dtypes.ints]
IEEE_FLOATS = [dtypes.float16, dtypes.float32, dtypes.float64]


@pytest.fixture(autouse=True)
def default_knobs() -> Iterator[None]:
    """Expected values assume the default knobs, whatever the environment says."""
    with Context(DEFAULT_FLOAT="float32", DEFAULT_INT="int32"):
        yield


def ml_type(d: DType) -> Any:
    assert ml_dtypes is not None
    names = {
        "bfloat16": ml_dtypes.bfloat16,
        "fp8e4m3": ml_dtypes.float8_e4m3fn,
        "fp8e5m2": ml_dtypes.float8_e5m2,
        "fp8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
        "fp8e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    }
    return names[d.name] if d.name in names else to_np_dtype(d)


def np_of(d: DType) -> np.dtype[Any]:
    npd = to_np_dtype(d)
    assert npd is not None
    return npd


# ---- DType value ----
def test_repr_scalar_and_vector() -> None:
    assert repr(dtypes.float32) == "dtypes.float32"
    assert repr(dtypes.half) == "dtypes.float16"
    assert repr(dtypes.float32.vec(4)) == "dtypes.float32.vec(4)"
    assert repr(dtypes.weakint) == "dtypes.weakint"


def test_vec_itemsize_and_scalar_roundtrip() -> None:
    v = dtypes.int16.vec(8)
    assert v.count == 8 and v.itemsize == 16 and v.name == "int16"
    assert v.scalar() is dtypes.int16
    assert dtypes.int16.scalar() is dtypes.int16
    assert dtypes.int16.vec(1) is dtypes.int16
    assert v.min == -32768 and v.max == 32767


def test_vec_raises_on_vector_or_bad_width() -> None:
    with pytest.raises(DTypeError):
        dtypes.float32.vec(4).vec(2)
    with pytest.raises(DTypeError):
        dtypes.float32.vec(0)


def test_dtype_equality_by_value_and_hashable() -> None:
    rebuilt = DType(dtypes.float32.priority, 4, "float32", "f")
    assert rebuilt is dtypes.float32  # interned: equal fields give the same object
    assert rebuilt == dtypes.float32 and hash(rebuilt) == hash(dtypes.float32)
    assert dtypes.float32.vec(4) == dtypes.float32.vec(4)
    assert dtypes.float32.vec(4) != dtypes.float32.vec(2)
    assert len({dtypes.float32, rebuilt, dtypes.float, dtypes.float16}) == 2
    with pytest.raises(AttributeError):
        dtypes.float32.name = "x"  # type: ignore[misc]


def test_ordering_sorts_by_priority() -> None:
    shuffled = [dtypes.float64, dtypes.bool, dtypes.int32, dtypes.float16, dtypes.uint8]
    assert sorted(shuffled) == [dtypes.bool, dtypes.uint8, dtypes.int32, dtypes.float16, dtypes.float64]
    assert dtypes.float32 < dtypes.float32.vec(2)
    assert min(dtypes.floats) == dtypes.fp8e4m3 and max(dtypes.all) == dtypes.float64


def test_aliases_name_the_same_dtype() -> None:
    pairs = {
        "char": "int8",
        "uchar": "uint8",
        "short": "int16",
        "ushort": "uint16",
        "int": "int32",
        "uint": "uint32",
        "long": "int64",
        "ulong": "uint64",
        "half": "float16",
        "float": "float32",
        "double": "float64",
    }
    for alias, name in pairs.items():
        assert getattr(dtypes, alias) is getattr(dtypes, name)
    fields = dtypes.fields()
    assert set(fields) == set(pairs) | {d.name for d in dtypes.all}
    assert "weakint" not in fields and "void" not in fields


def test_groups_partition_concrete_dtypes() -> None:
    assert len(dtypes.all) == 17 and len(set(dtypes.all)) == 17
    assert set(dtypes.all) == {dtypes.bool} | set(dtypes.ints) | set(dtypes.floats)
    assert set(dtypes.ints) == set(dtypes.uints) | set(dtypes.sints)
    assert dtypes.fp8s == dtypes.fp8_ocp + dtypes.fp8_fnuz and len(dtypes.fp8s) == 4
    assert dtypes.weaks == (dtypes.weakint, dtypes.weakfloat)
    assert [m.name for m in AddrSpace] == ["GLOBAL", "LOCAL", "REG", "ALU"]


def test_itemsize_and_fmt_match_numpy() -> None:
    for d in NUMPY_DTYPES:
        assert d.itemsize == np.dtype(d.fmt).itemsize
    for d in (*dtypes.fp8s, dtypes.bfloat16):
        assert d.fmt is None
    assert dtypes.bfloat16.itemsize == 2 and all(d.itemsize == 1 for d in dtypes.fp8s)


def test_min_max_ints_match_numpy_iinfo() -> None:
    for d in dtypes.ints:
        info = np.iinfo(np_of(d))
        assert (d.min, d.max) == (int(info.min), int(info.max))
        assert (dtypes.min(d), dtypes.max(d)) == (d.min, d.max)
    assert (dtypes.bool.min, dtypes.bool.max) == (False, True)
    for d in dtypes.floats:
        assert (d.min, d.max) == (-math.inf, math.inf)
    with pytest.raises(DTypeError):
        _ = dtypes.void.max


def test_predicates_classify_every_dtype() -> None:
    assert all(dtypes.is_float(d) for d in (*dtypes.floats, dtypes.weakfloat))
    assert all(dtypes.is_int(d) for d in (*dtypes.ints, dtypes.weakint, dtypes.index))
    assert not dtypes.is_int(dtypes.bool) and not dtypes.is_float(dtypes.bool) and dtypes.is_bool(dtypes.bool)
    assert [d for d in dtypes.all if dtypes.is_unsigned(d)] == list(dtypes.uints)
    assert [d for d in dtypes.all if dtypes.is_fp8(d)] == list(dtypes.fp8s)
    assert dtypes.is_float(dtypes.half.vec(4)) and dtypes.is_unsigned(dtypes.uint8.vec(2))


def test_finfo_matches_numpy_and_ml_dtypes() -> None:
    for d in IEEE_FLOATS:
        info = np.finfo(np_of(d))
        assert dtypes.finfo(d) == (info.nexp, info.nmant)
    assert dtypes.finfo(dtypes.bfloat16) == (8, 7)
    assert dtypes.finfo(dtypes.fp8e4m3) == (4, 3) and dtypes.finfo(dtypes.fp8e5m2fnuz) == (5, 2)
    if ml_dtypes is not None:
        for d in (*dtypes.fp8s, dtypes.bfloat16):
            info = ml_dtypes.finfo(ml_type(d))
            assert dtypes.finfo(d) == (info.nexp, info.nmant)
    with pytest.raises(DTypeError):
        dtypes.finfo(dtypes.int32)


# ---- promotion ----
def test_least_upper_matches_numpy_for_ints_and_bool() -> None:
    # numpy turns int64 + uint64 into float64; with DEFAULT_FLOAT=float64 our JAX-style answer is the same
    with Context(DEFAULT_FLOAT="float64"):
        for a, b in itertools.product(INTS_AND_BOOL, repeat=2):
            expected = from_np_dtype(np.promote_types(np_of(a), np_of(b)))
            assert least_upper_dtype(a, b) == expected, (a, b)


def test_least_upper_matches_numpy_for_ieee_floats() -> None:
    for a, b in itertools.product([dtypes.bool, *IEEE_FLOATS], repeat=2):
        assert least_upper_dtype(a, b) == from_np_dtype(np.promote_types(np_of(a), np_of(b))), (a, b)


PROMOTION_TABLE = [  # where numpy differs or has no answer (JAX style: the float wins, whatever its size)
    ((dtypes.int64, dtypes.uint64), dtypes.float32),
    ((dtypes.int8, dtypes.uint64), dtypes.float32),
    ((dtypes.int32, dtypes.float16), dtypes.float16),
    ((dtypes.int64, dtypes.float32), dtypes.float32),
    ((dtypes.uint64, dtypes.bfloat16), dtypes.bfloat16),
    ((dtypes.float16, dtypes.bfloat16), dtypes.float32),
    ((dtypes.fp8e4m3, dtypes.float16), dtypes.float16),
    ((dtypes.fp8e5m2fnuz, dtypes.float16), dtypes.float16),
    ((dtypes.fp8e4m3, dtypes.fp8e5m2), dtypes.float16),
    ((dtypes.fp8e4m3, dtypes.fp8e4m3fnuz), dtypes.float16),
    ((dtypes.fp8e4m3, dtypes.bfloat16), dtypes.float32),
    ((dtypes.fp8e5m2, dtypes.float64), dtypes.float64),
    ((dtypes.int32, dtypes.fp8e4m3), dtypes.fp8e4m3),
    ((dtypes.bool, dtypes.fp8e5m2), dtypes.fp8e5m2),
    # a Python scalar takes the dtype of the tensor it meets
    ((dtypes.weakint, dtypes.bool), dtypes.int32),
    ((dtypes.weakint, dtypes.int8), dtypes.int8),
    ((dtypes.weakint, dtypes.uint8), dtypes.uint8),
    ((dtypes.weakint, dtypes.uint64), dtypes.uint64),
    ((dtypes.weakint, dtypes.float16), dtypes.float16),
    ((dtypes.weakint, dtypes.fp8e4m3), dtypes.fp8e4m3),
    ((dtypes.weakfloat, dtypes.bool), dtypes.float32),
    ((dtypes.weakfloat, dtypes.int8), dtypes.float32),
    ((dtypes.weakfloat, dtypes.uint64), dtypes.float32),
    ((dtypes.weakfloat, dtypes.float16), dtypes.float16),
    ((dtypes.weakfloat, dtypes.bfloat16), dtypes.bfloat16),
    ((dtypes.weakfloat, dtypes.fp8e5m2), dtypes.fp8e5m2),
    # weak stays weak only among weaks
    ((dtypes.weakint, dtypes.weakfloat), dtypes.weakfloat),
    ((dtypes.weakint, dtypes.weakint), dtypes.weakint),
    # index arithmetic
    ((dtypes.index, dtypes.int32), dtypes.index),
    ((dtypes.index, dtypes.weakint), dtypes.index),
    ((dtypes.index, dtypes.uint32), dtypes.index),
]


@pytest.mark.parametrize("pair, expected", PROMOTION_TABLE, ids=[f"{a.name}+{b.name}" for (a, b), _ in PROMOTION_TABLE])
def test_least_upper_follows_table_where_numpy_differs(pair: tuple[DType, DType], expected: DType) -> None:
    assert least_upper_dtype(*pair) == expected
    assert least_upper_dtype(*reversed(pair)) == expected


def test_least_upper_weak_results_follow_default_knobs() -> None:
    with Context(DEFAULT_FLOAT="half", DEFAULT_INT="int64"):
        assert least_upper_dtype(dtypes.bool, dtypes.weakint) == dtypes.int64
        assert least_upper_dtype(dtypes.int8, dtypes.weakfloat) == dtypes.float16
        assert least_upper_dtype(dtypes.int64, dtypes.uint64) == dtypes.float16
    # promotions are cached: the same pair under other knob values gets the other answer, before and after
    assert least_upper_dtype(dtypes.int8, dtypes.weakfloat) == dtypes.float32
    with Context(DEFAULT_FLOAT="float64"):
        assert least_upper_dtype(dtypes.int8, dtypes.weakfloat) == dtypes.float64
    assert least_upper_dtype(dtypes.bool, dtypes.weakint) == dtypes.int32
    with Context(DEFAULT_FLOAT="float64"):
        assert sum_acc_dtype(dtypes.weakfloat) == dtypes.float64
    assert sum_acc_dtype(dtypes.weakfloat) == dtypes.float32


def test_least_upper_lattice_has_unique_bound_for_every_pair() -> None:
    upper = dtype_module._UPPER
    for a, b in itertools.product(upper, repeat=2):
        common = upper[a] & upper[b]
        assert len([c for c in common if upper[c] == common]) == 1, (a, b)
        assert least_upper_dtype(a, b) == least_upper_dtype(b, a)


def test_least_upper_priority_agrees_with_lattice() -> None:
    upper = dtype_module._UPPER
    for a in upper:
        assert all(a.priority <= b.priority for b in upper[a]), a


def test_least_upper_is_associative_without_weak_intermediates() -> None:
    # a signed int meeting uint64 lands on weakfloat, made concrete at once (as JAX materialises it), so
    # (int64 + uint64) + float16 = float32 but int64 + (uint64 + float16) = float16: those triples are left out
    concrete = [dtypes.bool, *dtypes.ints, *dtypes.floats]
    for a, b, c in itertools.product(concrete, repeat=3):
        if dtypes.uint64 in (a, b, c) and any(d in dtypes.sints for d in (a, b, c)):
            continue
        whole = least_upper_dtype(a, b, c)
        assert whole == least_upper_dtype(least_upper_dtype(a, b), c) == least_upper_dtype(a, least_upper_dtype(b, c))


def test_least_upper_vectors_and_errors() -> None:
    assert least_upper_dtype(dtypes.int8.vec(4), dtypes.uint8.vec(4)) == dtypes.int16.vec(4)
    with pytest.raises(DTypeError):
        least_upper_dtype(dtypes.int8.vec(4), dtypes.int8.vec(2))
    with pytest.raises(DTypeError):
        least_upper_dtype()
    with pytest.raises(DTypeError):
        least_upper_dtype(dtypes.void, dtypes.int8)


def test_least_upper_float_keeps_floats_only() -> None:
    assert least_upper_float(dtypes.bfloat16) == dtypes.bfloat16
    assert least_upper_float(dtypes.int64) == dtypes.float32
    with Context(DEFAULT_FLOAT="float16"):
        assert least_upper_float(dtypes.bool) == dtypes.float16


def test_sum_acc_dtype_widens_small_types() -> None:
    table = {
        dtypes.bool: dtypes.uint32,
        dtypes.uint8: dtypes.uint32,
        dtypes.uint16: dtypes.uint32,
        dtypes.uint32: dtypes.uint32,
        dtypes.uint64: dtypes.uint64,
        dtypes.int8: dtypes.int32,
        dtypes.int16: dtypes.int32,
        dtypes.int32: dtypes.int32,
        dtypes.int64: dtypes.int64,
        dtypes.float16: dtypes.float32,
        dtypes.bfloat16: dtypes.float32,
        dtypes.float32: dtypes.float32,
        dtypes.float64: dtypes.float64,
        **{d: dtypes.float32 for d in dtypes.fp8s},
    }
    assert set(table) == set(dtypes.all)
    for d, acc in table.items():
        assert sum_acc_dtype(d) == acc, d
    assert sum_acc_dtype(dtypes.half.vec(4)) == dtypes.float32.vec(4)


# ---- lossless casts ----
def test_can_lossless_cast_matches_numpy_safe_casting() -> None:
    lossy_in_numpy = {(dtypes.int64, dtypes.float64), (dtypes.uint64, dtypes.float64)}  # numpy calls these safe
    for a, b in itertools.product(NUMPY_DTYPES, repeat=2):
        expected = np.can_cast(np_of(a), np_of(b), "safe") and (a, b) not in lossy_in_numpy
        assert can_lossless_cast(a, b) == expected, (a, b)


def _all_values(d: DType) -> np.ndarray[Any, Any]:
    if dtypes.is_int(d) or d == dtypes.bool:
        return np.arange(d.min, d.max + 1).astype(np_of(d))
    bits = np.arange(2 ** (8 * d.itemsize), dtype=np.uint8 if d.itemsize == 1 else np.uint16)
    return bits.view(ml_type(d))


@needs_ml_dtypes
def test_can_lossless_cast_matches_exhaustive_roundtrip() -> None:
    small = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, *dtypes.fp8s, dtypes.bfloat16]
    targets = [*small, dtypes.float16, dtypes.float32]
    for src in [*small, dtypes.float16]:
        src_vals = _all_values(src)
        for dst in targets:
            with np.errstate(all="ignore"):
                values = src_vals.astype(np.float64)
                back = src_vals.astype(ml_type(dst)).astype(np.float64)
            same = (back == values) | (np.isnan(back) & np.isnan(values))
            assert can_lossless_cast(src, dst) == bool(same.all()), (src, dst)


# ---- names, defaults, Python values ----
def test_to_dtype_accepts_names_aliases_and_dtypes() -> None:
    assert to_dtype("float16") is dtypes.float16
    assert to_dtype("half") is dtypes.float16
    assert to_dtype("HALF") is dtypes.float16
    assert to_dtype("int") is dtypes.int32
    assert to_dtype(dtypes.bfloat16) is dtypes.bfloat16
    for name, d in dtypes.fields().items():
        assert to_dtype(name) is d


def test_to_dtype_raises_listing_valid_names_for_unknown_name() -> None:
    with pytest.raises(DTypeError, match="float32") as info:
        to_dtype("float17")
    assert "float17" in str(info.value) and "bfloat16" in str(info.value)
    with pytest.raises(DTypeError):
        to_dtype(3)  # type: ignore[arg-type]


def test_default_dtypes_read_knobs_case_insensitively() -> None:
    assert dtypes.default_float == dtypes.float32 and dtypes.default_int == dtypes.int32
    for name, expected in [("half", dtypes.float16), ("HALF", dtypes.float16), ("bfloat16", dtypes.bfloat16)]:
        with Context(DEFAULT_FLOAT=name):
            assert dtypes.default_float == expected
    with Context(DEFAULT_INT="long"):
        assert dtypes.default_int == dtypes.int64


def test_default_dtypes_raise_for_wrong_kind() -> None:
    with Context(DEFAULT_FLOAT="int32"), pytest.raises(DTypeError, match="DEFAULT_FLOAT"):
        _ = dtypes.default_float
    with Context(DEFAULT_INT="float32"), pytest.raises(DTypeError, match="DEFAULT_INT"):
        _ = dtypes.default_int


def test_from_py_scalars_are_weak() -> None:
    assert dtypes.from_py(True) == dtypes.bool
    assert dtypes.from_py(3) == dtypes.weakint
    assert dtypes.from_py(3.5) == dtypes.weakfloat
    assert dtypes.from_py(np.float16(1)) == dtypes.float16
    with pytest.raises(DTypeError, match="str"):
        dtypes.from_py("3")


def test_from_py_nested_lists_get_concrete_defaults() -> None:
    assert dtypes.from_py([[True, False], [False]]) == dtypes.bool
    assert dtypes.from_py([[1, 2], (3, True)]) == dtypes.int32
    assert dtypes.from_py([[1, 2], [3, [4.5]]]) == dtypes.float32
    assert dtypes.from_py([]) == dtypes.float32
    assert dtypes.from_py([[], []]) == dtypes.float32
    with Context(DEFAULT_FLOAT="half", DEFAULT_INT="int64"):
        assert dtypes.from_py([1, 2]) == dtypes.int64
        assert dtypes.from_py([1, 2.0]) == dtypes.float16
        assert dtypes.from_py([]) == dtypes.float16
    assert dtypes.from_py([np.int8(1), 2]) == dtypes.int8
    with pytest.raises(DTypeError):
        dtypes.from_py([1, None])


# ---- numpy conversion ----
def test_np_dtype_roundtrip_for_numpy_types() -> None:
    for d in NUMPY_DTYPES:
        npd = to_np_dtype(d)
        assert npd is not None and from_np_dtype(npd) == d and from_np_dtype(npd.type) == d
    assert from_np_dtype(np.dtype("int64")) == dtypes.int64  # char 'l', not the 'q' of dtypes.int64.fmt


def test_to_np_dtype_none_for_types_numpy_lacks() -> None:
    assert to_np_dtype(dtypes.bfloat16) is None
    assert all(to_np_dtype(d) is None for d in dtypes.fp8s)
    assert to_np_dtype(dtypes.weakint) == np.dtype("int32") and to_np_dtype(dtypes.weakfloat) == np.dtype("float32")
    with Context(DEFAULT_FLOAT="float64"):
        assert to_np_dtype(dtypes.weakfloat) == np.dtype("float64")


def test_from_np_dtype_raises_naming_unsupported_type() -> None:
    with pytest.raises(DTypeError, match="complex64"):
        from_np_dtype(np.complex64)
    with pytest.raises(DTypeError, match="not a numpy dtype"):
        from_np_dtype("not-a-type")


@needs_ml_dtypes
def test_from_np_dtype_recognises_ml_dtypes() -> None:
    for d in (dtypes.bfloat16, *dtypes.fp8s):
        assert from_np_dtype(np.dtype(ml_type(d))) == d


# ---- bfloat16 / fp8 bits ----
def _tricky_float32(rng: np.random.Generator, grid: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Random float32 values plus the midpoints of a sorted grid of representable values and their neighbours."""
    grid = np.unique(grid[np.isfinite(grid)].astype(np.float32))
    mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e38, -1e38, 1e-45, -1e-45, 1e-40], np.float32)
    random_bits = rng.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(20000) * 2.0 ** rng.integers(-30, 30, 20000)).astype(np.float32)
    return np.concatenate([grid, mids, near, specials, random_bits, scaled])


@needs_ml_dtypes
def test_bf16_decode_all_patterns_matches_ml_dtypes() -> None:
    bits = np.arange(2**16, dtype=np.uint16)
    ours = bf16_bits_to_float(bits)
    ref = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(ours, ref)  # NaNs compare equal positionally


@needs_ml_dtypes
def test_bf16_encode_rounds_like_ml_dtypes() -> None:
    grid = np.arange(2**16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    x = _tricky_float32(np.random.default_rng(0), grid)
    ours = float_to_bf16_bits(x)
    with np.errstate(invalid="ignore"):  # signalling NaNs among the random bit patterns
        ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(ours[~nan], ref[~nan])
    assert np.isnan(bf16_bits_to_float(ours[nan])).all()


def test_bf16_known_values() -> None:
    x = np.array([1.0, -2.0, 1.00390625, 1.01171875, 3.4e38, np.inf, 1e-45], dtype=np.float32)
    assert float_to_bf16_bits(x).tolist() == [0x3F80, 0xC000, 0x3F80, 0x3F82, 0x7F80, 0x7F80, 0x0000]
    assert bf16_bits_to_float(np.array([0x3F80, 0x7F80, 0x0001], np.uint16)).tolist() == [1.0, math.inf, 2.0**-133]


FP8_MAX = {dtypes.fp8e4m3: 448.0, dtypes.fp8e5m2: 57344.0, dtypes.fp8e4m3fnuz: 240.0, dtypes.fp8e5m2fnuz: 57344.0}


@needs_ml_dtypes
@pytest.mark.parametrize("d", dtypes.fp8s, ids=lambda d: d.name)
def test_fp8_decode_all_patterns_matches_ml_dtypes(d: DType) -> None:
    bits = np.arange(256, dtype=np.uint8)
    ours = fp8_bits_to_float(bits, d)
    ref = bits.view(ml_type(d)).astype(np.float32)
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(np.signbit(ours[ours == 0]), np.signbit(ref[ref == 0]))
    assert ours[np.isfinite(ours)].max() == FP8_MAX[d]


@needs_ml_dtypes
@pytest.mark.parametrize("d", dtypes.fp8s, ids=lambda d: d.name)
def test_fp8_encode_matches_ml_dtypes_with_saturation(d: DType) -> None:
    grid = fp8_bits_to_float(np.arange(256, dtype=np.uint8), d)
    x = _tricky_float32(np.random.default_rng(1), grid)
    ours = float_to_fp8_bits(x, d)
    nan = np.isnan(x)
    # ml_dtypes does not saturate (overflow -> inf or NaN); OCP saturation equals clipping to +-max first
    clipped = np.clip(x, -FP8_MAX[d], FP8_MAX[d])
    with np.errstate(invalid="ignore"):  # signalling NaNs among the random bit patterns
        ref = clipped.astype(ml_type(d)).view(np.uint8)
    np.testing.assert_array_equal(ours[~nan], ref[~nan])
    assert np.isnan(fp8_bits_to_float(ours[nan], d)).all()
    assert np.isfinite(fp8_bits_to_float(ours[~nan], d)).all()


def test_fp8_known_values() -> None:
    x = np.array([1.0, -0.0, 448.0, 464.0, 480.0, 1e9, -np.inf, 2.0**-9, 2.0**-10, 3 * 2.0**-10, np.nan], np.float32)
    expected = [0x38, 0x80, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x01, 0x00, 0x02, 0x7F]
    assert float_to_fp8_bits(x, dtypes.fp8e4m3).tolist() == expected
    assert float_to_fp8_bits(np.array([1.0, 57344.0, np.inf, 2.0**-16], np.float32), dtypes.fp8e5m2).tolist() == [
        0x3C,
        0x7B,
        0x7B,
        0x01,
    ]
    fnuz = float_to_fp8_bits(np.array([1.0, -0.0, -(2.0**-12), np.nan, 300.0], np.float32), dtypes.fp8e4m3fnuz)
    assert fnuz.tolist() == [0x40, 0x00, 0x00, 0x80, 0x7F]
    decoded = fp8_bits_to_float(np.array([0x7C, 0x7E, 0x80], np.uint8), dtypes.fp8e5m2)
    assert decoded[0] == np.inf and np.isnan(decoded[1]) and decoded[2] == 0 and np.signbit(decoded[2])
    assert np.isnan(fp8_bits_to_float(np.array([0x80], np.uint8), dtypes.fp8e5m2fnuz)).all()


def test_fp8_conversion_rejects_other_dtypes() -> None:
    with pytest.raises(DTypeError, match="fp8"):
        float_to_fp8_bits(np.zeros(2, np.float32), dtypes.float16)


# ---- truncate ----
def test_truncate_wraps_ints_like_numpy() -> None:
    values = [0, 1, -1, 127, 128, -129, 255, 256, 2**31, -(2**31) - 1, 2**63, 2**64 + 5, -(2**70) + 3]
    for d in dtypes.ints:
        fn = truncate(d)
        for v in values:
            expected = int(np.array(v % 2**64, dtype=np.uint64).astype(np_of(d)))
            assert fn(v) == expected, (d, v)
    assert truncate(dtypes.int8)(-3.7) == -3 and truncate(dtypes.uint8)(300.5) == 44


def test_truncate_rounds_floats_like_numpy() -> None:
    rng = np.random.default_rng(2)
    values = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.integers(-10, 10, 2000), [1e6, -1e300, 65519.9]])
    for d in (dtypes.float16, dtypes.float32):
        fn = truncate(d)
        with np.errstate(over="ignore"):
            expected = values.astype(np_of(d)).astype(np.float64)
        assert [fn(v) for v in values] == expected.tolist(), d
    assert truncate(dtypes.float64)(1 / 3) == 1 / 3 and truncate(dtypes.weakint)(5) == 5


@needs_ml_dtypes
def test_truncate_bf16_and_fp8_match_float32_conversion() -> None:
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(2000) * 2.0 ** rng.integers(-20, 20, 2000)).astype(np.float32)
    for d in (dtypes.bfloat16, *dtypes.fp8s):
        clipped = np.clip(values, -FP8_MAX[d], FP8_MAX[d]) if d in FP8_MAX else values
        expected = clipped.astype(ml_type(d)).astype(np.float64).tolist()
        fn = truncate(d)
        assert [fn(float(v)) for v in values] == expected, d


def test_truncate_rounds_float64_once() -> None:
    # 1 + 2**-8 + 2**-30 lies above the bf16 midpoint; rounding through float32 first would land on the tie, then 1.0
    assert truncate(dtypes.bfloat16)(1 + 2**-8 + 2**-30) == 1 + 2**-7
    assert truncate(dtypes.fp8e4m3)(1e9) == 448.0 and truncate(dtypes.fp8e5m2)(-math.inf) == -57344.0
    assert truncate(dtypes.float16)(1e6) == math.inf and truncate(dtypes.float32)(-1e300) == -math.inf
    assert math.isnan(truncate(dtypes.fp8e4m3fnuz)(math.nan))


def test_truncate_bool_and_errors() -> None:
    assert truncate(dtypes.bool)(2) is True and truncate(dtypes.bool)(0.0) is False
    assert truncate(dtypes.int32.vec(4))(2**31) == -(2**31)
    with pytest.raises(DTypeError):
        truncate(dtypes.int8)(math.nan)
    with pytest.raises(DTypeError):
        truncate(dtypes.void)


def test_docstring_examples_run() -> None:
    result = doctest.testmod(dtype_module, extraglobs={"np": np})
    assert result.attempted > 10 and result.failed == 0
