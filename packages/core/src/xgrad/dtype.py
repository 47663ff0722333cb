"""Data types: the `DType` value, the `dtypes` namespace, type promotion, and host-side value conversion.

Vectors (`DType.vec`) exist for codegen only; user-facing tensors always have scalar, concrete dtypes.
"""

from __future__ import annotations

import enum
import functools
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from xgrad.errors import DTypeError
from xgrad.helpers import DEFAULT_FLOAT, DEFAULT_INT


class _Interned(type):
    """Builds each distinct DType once: equal dtypes are one object, so comparing and hashing them (in every UOp
    lookup) is the interpreter's identity test and address hash instead of Python methods."""

    _made: dict[tuple[Any, ...], DType] = {}

    def __call__(
        cls, priority: int, itemsize: int, name: str, fmt: str | None, count: int = 1, _scalar: DType | None = None
    ) -> DType:
        key = (priority, itemsize, name, fmt, count, _scalar)
        if (made := _Interned._made.get(key)) is None:
            made = _Interned._made[key] = super().__call__(*key)
        return made


@dataclass(frozen=True, eq=False)
class DType(metaclass=_Interned):
    """A scalar (count 1) or, for codegen, a vector (count > 1) data type. Interned: `DType(...)` with the same fields
    returns the same object (unpickling too), so `==` and `hash` are by identity.

    >>> dtypes.float32.vec(4).itemsize, dtypes.float32.vec(4).scalar(), dtypes.float32.vec(4) is dtypes.float32.vec(4)
    (16, dtypes.float32, True)
    """

    priority: int
    itemsize: int
    name: str
    fmt: str | None
    count: int = 1
    _scalar: DType | None = field(default=None, repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        return (DType, (self.priority, self.itemsize, self.name, self.fmt, self.count, self._scalar))

    def vec(self, n: int) -> DType:
        """The vector of `n` lanes of this scalar dtype; `vec(1)` is the dtype itself."""
        if self.count != 1:
            raise DTypeError(f"{self!r} is already a vector; call vec() on {self.scalar()!r} instead")
        if n < 1:
            raise DTypeError(f"vector width must be >= 1, got {n}")
        if n == 1:
            return self
        return DType(self.priority, self.itemsize * n, self.name, None, n, self)

    def scalar(self) -> DType:
        """The scalar dtype of a vector (a scalar returns itself)."""
        return self if self._scalar is None else self._scalar

    @property
    def min(self) -> int | float:
        """Smallest value: the integer range bound, False for bool, -inf for floats."""
        return _dtype_min(self.scalar())

    @property
    def max(self) -> int | float:
        """Largest value: the integer range bound, True for bool, inf for floats."""
        return _dtype_max(self.scalar())

    def __repr__(self) -> str:
        if self.count == 1:
            return f"dtypes.{self.name}"
        return f"dtypes.{self.name}.vec({self.count})"

    def __str__(self) -> str:
        """tinygrad's spelling, the C-style alias where there is one: `str(dtypes.float32) == "dtypes.float"`
        (`repr` keeps the sized name, `dtypes.float32`)."""
        name = _C_NAMES.get(self.name, self.name)
        return f"dtypes.{name}" if self.count == 1 else f"dtypes.{name}.vec({self.count})"

    def _sort_key(self) -> tuple[int, int, str, int]:
        return (self.priority, self.itemsize, self.name, self.count)

    def __lt__(self, other: DType) -> bool:
        return self._sort_key() < other._sort_key()


class AddrSpace(enum.Enum):
    """Where a buffer lives in a kernel."""

    GLOBAL = enum.auto()
    LOCAL = enum.auto()
    REG = enum.auto()
    ALU = enum.auto()


# ---- predicates (module level so their annotations do not meet the `dtypes.bool`/`int`/`float` attributes) ----
def _is_float(d: DType) -> bool:
    return d.scalar() in _FLOAT_SET


def _is_int(d: DType) -> bool:
    return d.scalar() in _INT_SET


def _is_unsigned(d: DType) -> bool:
    return d.scalar() in _UINT_SET


def _is_bool(d: DType) -> bool:
    return d.scalar() == dtypes.bool


def _is_fp8(d: DType) -> bool:
    return d.scalar() in dtypes.fp8s


def _dtype_min(d: DType) -> int | float:
    d = d.scalar()
    if _is_bool(d):
        return False
    if _is_int(d):
        return 0 if _is_unsigned(d) else -(1 << (8 * d.itemsize - 1))
    if _is_float(d):
        return -math.inf
    raise DTypeError(f"{d!r} has no value range")


def _dtype_max(d: DType) -> int | float:
    d = d.scalar()
    if _is_bool(d):
        return True
    if _is_int(d):
        return (1 << (8 * d.itemsize)) - 1 if _is_unsigned(d) else (1 << (8 * d.itemsize - 1)) - 1
    if _is_float(d):
        return math.inf
    raise DTypeError(f"{d!r} has no value range")


def _from_py(x: Any) -> DType:
    """dtype of a Python value: bool -> bool, int -> weakint, float -> weakfloat; a (nested) list or tuple gets the
    least upper dtype of its elements with weak results made concrete (ints -> default_int, floats -> default_float;
    an empty list -> default_float).

    >>> dtypes.from_py(3), dtypes.from_py([[1, 2], [3, 4.5]]), dtypes.from_py([True, False])
    (dtypes.weakint, dtypes.float32, dtypes.bool)
    """
    if not isinstance(x, (list, tuple)):
        return _leaf_dtype(x)
    leaves: set[DType] = set()
    stack: list[Any] = [x]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            leaves.add(_leaf_dtype(item))
    if not leaves:
        return _default_float()
    return _concrete(least_upper_dtype(*leaves))


def _leaf_dtype(x: Any) -> DType:
    if isinstance(x, bool):
        return dtypes.bool
    if isinstance(x, int):
        return dtypes.weakint
    if isinstance(x, float):
        return dtypes.weakfloat
    if isinstance(x, np.generic):
        return from_np_dtype(x.dtype)
    raise DTypeError(f"cannot infer a dtype from {type(x).__name__} value {x!r}; use bool, int, float or lists of them")


def _finfo(d: DType) -> tuple[int, int]:
    """(exponent bits, mantissa bits) of a float dtype.

    >>> dtypes.finfo(dtypes.bfloat16)
    (8, 7)
    """
    d = _concrete(d.scalar())
    if not _is_float(d):
        raise DTypeError(f"finfo needs a float dtype, got {d!r}")
    return (_FORMATS[d.name].exp, _FORMATS[d.name].mant)


def _default_float() -> DType:
    """The dtype of Python floats in tensors, from the DEFAULT_FLOAT knob (names like "float32", "half", "HALF"); read
    and set as `dtypes.default_float`."""
    d = to_dtype(DEFAULT_FLOAT.value)
    if not _is_float(d):
        raise DTypeError(
            f"DEFAULT_FLOAT={DEFAULT_FLOAT.value!r} is not a float dtype; use e.g. float32, half, bfloat16"
        )
    return d


def _default_int() -> DType:
    """The dtype of Python ints in tensors, from the DEFAULT_INT knob (names like "int32", "long")."""
    d = to_dtype(DEFAULT_INT.value)
    if not _is_int(d):
        raise DTypeError(f"DEFAULT_INT={DEFAULT_INT.value!r} is not an int dtype; use e.g. int32, int64")
    return d


def _fields() -> dict[str, DType]:
    """Every user-nameable dtype: the 17 concrete names and their C-style aliases."""
    return {**{d.name: d for d in dtypes.all}, **_ALIASES}


class _DTypesNamespace(type):
    """`dtypes.default_float` and `dtypes.default_int` read as DType values and assign like attributes, as in
    tinygrad (`dtypes.default_float = dtypes.half`); both are views of the DEFAULT_FLOAT/DEFAULT_INT knobs, so
    `Context(DEFAULT_FLOAT="half")` and the environment set the same thing."""

    @property
    def default_float(cls) -> DType:
        return _default_float()

    @default_float.setter
    def default_float(cls, d: DType) -> None:
        if not isinstance(d, DType) or not _is_float(d) or d in dtypes.weaks:
            raise DTypeError(f"dtypes.default_float must be a float dtype like dtypes.half, got {d!r}")
        DEFAULT_FLOAT.value = d.name

    @property
    def default_int(cls) -> DType:
        return _default_int()

    @default_int.setter
    def default_int(cls, d: DType) -> None:
        if not isinstance(d, DType) or not _is_int(d) or d in (dtypes.weakint, dtypes.index):
            raise DTypeError(f"dtypes.default_int must be an int dtype like dtypes.int64, got {d!r}")
        DEFAULT_INT.value = d.name


class dtypes(metaclass=_DTypesNamespace):  # noqa: N801 -- the public name is lowercase, like a module
    """Namespace of every dtype, the dtype groups and the dtype predicates; `dtypes.default_float` and
    `dtypes.default_int` are the current defaults (assignable).

    >>> dtypes.half, dtypes.is_float(dtypes.half), dtypes.int.max, dtypes.default_float
    (dtypes.float16, True, 2147483647, dtypes.float32)
    """

    void: Final = DType(-1, 0, "void", None)
    bool: Final = DType(0, 1, "bool", "?")
    weakint: Final = DType(1, 8, "weakint", None)  # a Python int: takes the dtype of the tensor it meets
    int8: Final = DType(2, 1, "int8", "b")
    uint8: Final = DType(3, 1, "uint8", "B")
    int16: Final = DType(4, 2, "int16", "h")
    uint16: Final = DType(5, 2, "uint16", "H")
    int32: Final = DType(6, 4, "int32", "i")
    uint32: Final = DType(7, 4, "uint32", "I")
    int64: Final = DType(8, 8, "int64", "q")
    uint64: Final = DType(9, 8, "uint64", "Q")
    index: Final = DType(10, 8, "index", None)  # index arithmetic in kernels; renderers print it as int
    weakfloat: Final = DType(11, 8, "weakfloat", None)  # a Python float: takes the dtype of the tensor it meets
    fp8e4m3: Final = DType(12, 1, "fp8e4m3", None)
    fp8e5m2: Final = DType(13, 1, "fp8e5m2", None)
    fp8e4m3fnuz: Final = DType(14, 1, "fp8e4m3fnuz", None)
    fp8e5m2fnuz: Final = DType(15, 1, "fp8e5m2fnuz", None)
    float16: Final = DType(16, 2, "float16", "e")
    bfloat16: Final = DType(17, 2, "bfloat16", None)
    float32: Final = DType(18, 4, "float32", "f")
    float64: Final = DType(19, 8, "float64", "d")

    char: Final = int8
    uchar: Final = uint8
    short: Final = int16
    ushort: Final = uint16
    int: Final = int32
    uint: Final = uint32
    long: Final = int64
    ulong: Final = uint64
    half: Final = float16
    float: Final = float32
    double: Final = float64

    fp8_ocp: Final = (fp8e4m3, fp8e5m2)
    fp8_fnuz: Final = (fp8e4m3fnuz, fp8e5m2fnuz)
    fp8s: Final = fp8_ocp + fp8_fnuz
    floats: Final = (*fp8s, float16, bfloat16, float32, float64)
    uints: Final = (uint8, uint16, uint32, uint64)
    sints: Final = (int8, int16, int32, int64)
    ints: Final = (int8, uint8, int16, uint16, int32, uint32, int64, uint64)
    weaks: Final = (weakint, weakfloat)
    all: Final = (bool, *ints, *floats)

    is_float = staticmethod(_is_float)
    is_int = staticmethod(_is_int)  # weakint and index count as ints
    is_unsigned = staticmethod(_is_unsigned)
    is_bool = staticmethod(_is_bool)
    is_fp8 = staticmethod(_is_fp8)
    from_py = staticmethod(_from_py)
    finfo = staticmethod(_finfo)
    max = staticmethod(_dtype_max)
    min = staticmethod(_dtype_min)
    fields = staticmethod(_fields)


_FLOAT_SET: Final = frozenset((*dtypes.floats, dtypes.weakfloat))
_INT_SET: Final = frozenset((*dtypes.ints, dtypes.weakint, dtypes.index))
_UINT_SET: Final = frozenset(dtypes.uints)
_ALIASES: Final[dict[str, DType]] = {
    k: v for k, v in vars(dtypes).items() if isinstance(v, DType) and k != v.name and not k.startswith("_")
}
_C_NAMES: Final[dict[str, str]] = {v.name: k for k, v in _ALIASES.items() if k not in ("half", "float", "double")} | {
    "float16": "half",
    "float32": "float",
    "float64": "double",
}
# every user-nameable dtype by name and alias (tinygrad's table; no void, index or weak dtypes)
DTYPES_DICT: Final[dict[str, DType]] = _fields()
INVERSE_DTYPES_DICT: Final[dict[str, str]] = {d.name: _C_NAMES.get(d.name, d.name) for d in dtypes.all}

# ---- promotion lattice (JAX style) ----
# `a -> b` means b is the least dtype directly above a; least_upper_dtype is the least common upper bound.
#
#   bool      -> weakint
#   weakint   -> int8, uint8
#   uint8     -> int16, uint16        int8  -> int16
#   uint16    -> int32, uint32        int16 -> int32
#   uint32    -> int64, uint64        int32 -> int64
#   uint64    -> weakfloat            int64 -> index -> weakfloat
#   weakfloat -> fp8e4m3, fp8e5m2, fp8e4m3fnuz, fp8e5m2fnuz, bfloat16
#   fp8 (all) -> float16
#   float16   -> float32              bfloat16 -> float32 -> float64
#
# Results, in words:
#   int + uint of the same size -> next larger signed int (int8+uint8 -> int16, int32+uint32 -> int64);
#   int64 + uint64 (or any signed int + uint64) -> weakfloat, which becomes default_float (JAX's answer).
#   any int or bool + any float -> that float (int32 + float16 -> float16, unlike numpy).
#   float16 + bfloat16 -> float32; fp8 + float16 -> float16; two different fp8 formats -> float16 (it holds every
#   fp8 value exactly); fp8 + bfloat16 -> float32 (fp8 sits only under float16, which keeps this a lattice).
#   a weak result with any concrete input becomes concrete at once (weakint -> default_int, weakfloat ->
#   default_float): bool + weakint -> default_int, bool/int + weakfloat -> default_float; only among weaks does it stay
#   weak (weakint + weakfloat -> weakfloat). So (int64 + uint64) + float16 is default_float, while promoting all three
#   at once gives float16: pass every dtype to one least_upper_dtype call when the order must not matter.
_PROMO_EDGES: Final[dict[DType, tuple[DType, ...]]] = {
    dtypes.bool: (dtypes.weakint,),
    dtypes.weakint: (dtypes.int8, dtypes.uint8),
    dtypes.uint8: (dtypes.int16, dtypes.uint16),
    dtypes.uint16: (dtypes.int32, dtypes.uint32),
    dtypes.uint32: (dtypes.int64, dtypes.uint64),
    dtypes.uint64: (dtypes.weakfloat,),
    dtypes.int8: (dtypes.int16,),
    dtypes.int16: (dtypes.int32,),
    dtypes.int32: (dtypes.int64,),
    dtypes.int64: (dtypes.index,),
    dtypes.index: (dtypes.weakfloat,),
    dtypes.weakfloat: (*dtypes.fp8s, dtypes.bfloat16),
    dtypes.fp8e4m3: (dtypes.float16,),
    dtypes.fp8e5m2: (dtypes.float16,),
    dtypes.fp8e4m3fnuz: (dtypes.float16,),
    dtypes.fp8e5m2fnuz: (dtypes.float16,),
    dtypes.float16: (dtypes.float32,),
    dtypes.bfloat16: (dtypes.float32,),
    dtypes.float32: (dtypes.float64,),
    dtypes.float64: (),
}


def _upper_set(d: DType) -> frozenset[DType]:
    seen = {d}
    todo = [d]
    while todo:
        for up in _PROMO_EDGES[todo.pop()]:
            if up not in seen:
                seen.add(up)
                todo.append(up)
    return frozenset(seen)


_UPPER: Final[dict[DType, frozenset[DType]]] = {d: _upper_set(d) for d in _PROMO_EDGES}


def _concrete(d: DType) -> DType:
    if d == dtypes.weakint:
        return _default_int()
    if d == dtypes.weakfloat:
        return _default_float()
    return d


def strong_dtype(d: DType) -> DType:
    """The concrete dtype a weak one becomes (weakint -> default_int, weakfloat -> default_float); others as they are.

    >>> strong_dtype(dtypes.weakfloat), strong_dtype(dtypes.weakint), strong_dtype(dtypes.half)
    (dtypes.float32, dtypes.int32, dtypes.float16)
    """
    return _concrete(d.scalar()).vec(d.count)


class InvalidType:
    """The value of an element nothing has written (`Tensor.invalids`): one object, `Invalid`; `InvalidType()` and
    unpickling both return it."""

    _the: InvalidType | None = None

    def __new__(cls) -> InvalidType:
        if cls._the is None:
            cls._the = super().__new__(cls)
        return cls._the

    def __reduce__(self) -> tuple[Any, ...]:
        return (InvalidType, ())

    def __repr__(self) -> str:
        return "Invalid"


Invalid: Final = InvalidType()


def least_upper_dtype(*ds: DType) -> DType:
    """The dtype all of `ds` promote to (see the lattice above). Weak dtypes stay weak only if every input is weak.

    >>> least_upper_dtype(dtypes.int8, dtypes.uint8), least_upper_dtype(dtypes.float16, dtypes.bfloat16)
    (dtypes.int16, dtypes.float32)
    >>> least_upper_dtype(dtypes.uint8, dtypes.weakint), least_upper_dtype(dtypes.bool, dtypes.weakint)
    (dtypes.uint8, dtypes.int32)
    """
    if not ds:
        raise DTypeError("least_upper_dtype needs at least one dtype")
    if all(d is ds[0] for d in ds) and ds[0].scalar() in _UPPER:  # the common case: one dtype
        return ds[0]
    # the next most common: a tensor and a Python number (a weak dtype), in every elementwise op with a constant
    return _least_upper(ds, DEFAULT_INT.value, DEFAULT_FLOAT.value)


@functools.cache
def _least_upper(ds: tuple[DType, ...], default_int: str, default_float: str) -> DType:
    """least_upper_dtype of `ds` while DEFAULT_INT and DEFAULT_FLOAT have these values (a weak result becomes one of
    them: they are part of the key). Errors (an invalid knob value) are raised again each time, not cached."""
    counts = {d.count for d in ds}
    if len(counts) != 1:
        raise DTypeError(f"cannot promote vectors of different widths: {ds}")
    scalars = tuple(d.scalar() for d in ds)
    result = _lattice_join(scalars)
    if not all(d in dtypes.weaks for d in scalars):
        result = _concrete(result)  # reads the DEFAULT_INT/DEFAULT_FLOAT knobs
    return result.vec(counts.pop())


@functools.cache
def _lattice_join(scalars: tuple[DType, ...]) -> DType:
    for d in scalars:
        if d not in _UPPER:
            raise DTypeError(f"{d!r} takes no part in type promotion")
    common = _UPPER[scalars[0]]
    for d in scalars[1:]:
        common = common & _UPPER[d]
    least = [c for c in common if _UPPER[c] == common]
    assert len(least) == 1, f"promotion lattice has no unique least upper bound for {scalars}"
    return least[0]


def least_upper_float(d: DType) -> DType:
    """`d` if it is a float dtype, else default_float.

    >>> least_upper_float(dtypes.int8), least_upper_float(dtypes.half)
    (dtypes.float32, dtypes.float16)
    """
    return d if _is_float(d) else _default_float()


def sum_acc_dtype(d: DType) -> DType:
    """Accumulator dtype for sums: bool and small uints -> uint32, small ints -> int32, small floats -> float32.

    >>> sum_acc_dtype(dtypes.uint8), sum_acc_dtype(dtypes.int16), sum_acc_dtype(dtypes.bfloat16)
    (dtypes.uint32, dtypes.int32, dtypes.float32)
    """
    return _sum_acc(d, DEFAULT_INT.value, DEFAULT_FLOAT.value)


@functools.cache
def _sum_acc(d: DType, default_int: str, default_float: str) -> DType:
    """sum_acc_dtype of `d` while DEFAULT_INT and DEFAULT_FLOAT have these values (a weak `d` becomes one of them),
    cached like `_least_upper`: every sum and matmul asks."""
    s = _concrete(d.scalar())
    if _is_bool(s) or _is_unsigned(s):
        acc = least_upper_dtype(s, dtypes.uint32)
    elif _is_int(s):
        acc = least_upper_dtype(s, dtypes.int32)
    elif _is_float(s):
        acc = least_upper_dtype(s, dtypes.float32)
    else:
        raise DTypeError(f"cannot sum values of {d!r}")
    return acc.vec(d.count)


def _int_bits(d: DType) -> int:
    """Bits of magnitude an int dtype needs (sign excluded)."""
    return 8 * d.itemsize if _is_unsigned(d) else 8 * d.itemsize - 1


def can_lossless_cast(src: DType, dst: DType) -> bool:
    """True if every value of `src` is exactly representable in `dst` (weak dtypes count as their defaults,
    index as int64).

    >>> can_lossless_cast(dtypes.uint8, dtypes.int16), can_lossless_cast(dtypes.int32, dtypes.float32)
    (True, False)
    """
    src = _concrete(src.scalar())
    dst = _concrete(dst.scalar())
    src = dtypes.int64 if src == dtypes.index else src
    dst = dtypes.int64 if dst == dtypes.index else dst
    if src == dst:
        return True
    if dtypes.void in (src, dst):
        return False
    if _is_bool(src):
        return True
    if _is_bool(dst):
        return False
    if _is_int(src) and _is_int(dst):
        if _is_unsigned(src) or not _is_unsigned(dst):
            return _int_bits(src) <= _int_bits(dst)
        return False
    if _is_int(src):  # int -> float: the float significand must hold every value
        return _int_bits(src) <= _FORMATS[dst.name].mant + 1
    if _is_int(dst):
        return False
    s = _FORMATS[src.name]
    t = _FORMATS[dst.name]
    if s.has_inf and not t.has_inf:
        return False
    return t.mant >= s.mant and t.max_finite >= s.max_finite and t.min_subnormal <= s.min_subnormal


def to_dtype(x: DType | str) -> DType:
    """A DType from itself or from a name (case-insensitive, aliases allowed).

    >>> to_dtype("half"), to_dtype("int"), to_dtype(dtypes.bool)
    (dtypes.float16, dtypes.int32, dtypes.bool)
    """
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        names = _fields()
        if (d := names.get(x.lower())) is not None:
            return d
        raise DTypeError(f"unknown dtype name {x!r}; valid names: {', '.join(sorted(names))}")
    raise DTypeError(f"expected a DType or a dtype name, got {type(x).__name__} {x!r}")


# ---- numpy conversion (numpy is used for I/O only) ----
_NP_EXTENSION_NAMES: Final[dict[str, DType]] = {
    "bfloat16": dtypes.bfloat16,
    "float8_e4m3fn": dtypes.fp8e4m3,
    "float8_e5m2": dtypes.fp8e5m2,
    "float8_e4m3fnuz": dtypes.fp8e4m3fnuz,
    "float8_e5m2fnuz": dtypes.fp8e5m2fnuz,
}


def to_np_dtype(d: DType) -> np.dtype[Any] | None:
    """The numpy dtype of `d`; None for bfloat16, fp8 and void. Weak dtypes map to the defaults, index to int64.

    >>> to_np_dtype(dtypes.half), to_np_dtype(dtypes.bfloat16)
    (dtype('float16'), None)
    """
    s = _concrete(d.scalar())
    s = dtypes.int64 if s == dtypes.index else s
    return None if s.fmt is None else np.dtype(s.fmt)


_FROM_NP: dict[Any, DType] = {}  # numpy dtype -> the DType found for it


def from_np_dtype(np_dtype: Any) -> DType:
    """The DType of a numpy dtype (or scalar type); ml_dtypes' bfloat16 and float8 types are recognised by name.

    >>> from_np_dtype(np.int16), from_np_dtype(np.dtype("float64"))
    (dtypes.int16, dtypes.float64)
    """
    try:
        npd = np.dtype(np_dtype)
    except TypeError:
        raise DTypeError(f"{np_dtype!r} is not a numpy dtype") from None
    if (hit := _FROM_NP.get(npd)) is not None:  # numpy's dtype.name is Python code: ~10 us a Tensor(ndarray)
        return hit
    if npd.name in _NP_EXTENSION_NAMES:
        found = _FROM_NP[npd] = _NP_EXTENSION_NAMES[npd.name]
        return found
    for d in dtypes.all:
        if d.fmt is not None and np.dtype(d.fmt) == npd:
            _FROM_NP[npd] = d
            return d
    supported = ", ".join(d.name for d in dtypes.all if d.fmt is not None)
    raise DTypeError(f"numpy dtype {npd.name} is not supported; supported: {supported} (and ml_dtypes bfloat16/float8)")


_to_np_dtype = to_np_dtype
_from_np_dtype = from_np_dtype


# ---- host-side bfloat16 / fp8 encoding ----
@dataclass(frozen=True)
class _Format:
    """A small binary float format. `fnuz`: no -0, no inf, 0x80 is the one NaN (bias one larger than usual).
    Without inf and not fnuz (OCP e4m3): all-ones exponent and mantissa is NaN, the rest of that binade is finite."""

    exp: int
    mant: int
    bias: int
    has_inf: bool
    fnuz: bool
    saturate: bool  # conversion clamps overflow (and inf) to +-max_finite instead of producing inf/NaN

    @property
    def max_finite(self) -> float:
        top = (1 << self.exp) - 1
        if self.has_inf:
            return math.ldexp(2 - math.ldexp(1.0, -self.mant), top - 1 - self.bias)
        mant_max = (1 << self.mant) - (1 if self.fnuz else 2)
        return math.ldexp(1 + math.ldexp(mant_max, -self.mant), top - self.bias)

    @property
    def min_subnormal(self) -> float:
        return math.ldexp(1.0, 1 - self.bias - self.mant)


_FORMATS: Final[dict[str, _Format]] = {
    "fp8e4m3": _Format(4, 3, 7, has_inf=False, fnuz=False, saturate=True),
    "fp8e5m2": _Format(5, 2, 15, has_inf=True, fnuz=False, saturate=True),
    "fp8e4m3fnuz": _Format(4, 3, 8, has_inf=False, fnuz=True, saturate=True),
    "fp8e5m2fnuz": _Format(5, 2, 16, has_inf=False, fnuz=True, saturate=True),
    "float16": _Format(5, 10, 15, has_inf=True, fnuz=False, saturate=False),
    "bfloat16": _Format(8, 7, 127, has_inf=True, fnuz=False, saturate=False),
    "float32": _Format(8, 23, 127, has_inf=True, fnuz=False, saturate=False),
    "float64": _Format(11, 52, 1023, has_inf=True, fnuz=False, saturate=False),
}


def _encode(x: npt.ArrayLike, f: _Format) -> npt.NDArray[np.int64]:
    """Round float values to the nearest `f` value (ties to even) in one step and return its bit patterns."""
    with np.errstate(invalid="ignore"):  # signalling NaNs warn when widened; they become quiet NaNs below
        v = np.asarray(x, dtype=np.float64)
    sign = np.signbit(v).astype(np.int64) << (f.exp + f.mant)
    a = np.abs(v)
    finite = np.isfinite(a)
    a = np.where(finite, a, 0.0)
    emin = 1 - f.bias
    _, k = np.frexp(a)
    ulp = np.ldexp(1.0, np.maximum(k - 1, emin) - f.mant)
    mag = np.rint(a / ulp) * ulp  # exact: a power-of-two scale, one rounding
    overflow = (mag > f.max_finite) | np.isinf(v)
    mag = np.where(overflow, f.max_finite, mag)
    _, k = np.frexp(mag)
    normal = mag >= 2.0**emin
    exp_field = np.where(normal, k - 1 + f.bias, 0)
    frac = np.where(normal, np.ldexp(mag, -(k - 1)) - 1.0, np.ldexp(mag, -emin))
    bits = sign | (exp_field.astype(np.int64) << f.mant) | np.rint(np.ldexp(frac, f.mant)).astype(np.int64)
    all_ones_exp = (2**f.exp - 1) << f.mant
    if not f.saturate:
        bits = np.where(overflow, sign | all_ones_exp, bits)
    if f.fnuz:
        nan_bits = np.int64(1 << (f.exp + f.mant))
        bits = np.where(bits == nan_bits, 0, bits)  # no negative zero
        return np.where(np.isnan(v), nan_bits, bits)
    quiet_nan = all_ones_exp | (2**f.mant - 1 if not f.has_inf else 1 << (f.mant - 1))
    return np.where(np.isnan(v), sign | quiet_nan, bits)


def _decode(bits: npt.ArrayLike, f: _Format) -> npt.NDArray[np.float64]:
    """The float64 values of `f` bit patterns."""
    b = np.asarray(bits).astype(np.int64)
    sign_bit = 1 << (f.exp + f.mant)
    exp_field = (b >> f.mant) & (2**f.exp - 1)
    mant = b & (2**f.mant - 1)
    normal_val = np.ldexp(1.0 + np.ldexp(mant.astype(np.float64), -f.mant), exp_field - f.bias)
    sub_val = np.ldexp(mant.astype(np.float64), 1 - f.bias - f.mant)
    mag = np.where(exp_field == 0, sub_val, normal_val)
    top = exp_field == 2**f.exp - 1
    if f.fnuz:
        nan = b == sign_bit
    elif f.has_inf:
        mag = np.where(top & (mant == 0), np.inf, mag)
        nan = top & (mant != 0)
    else:
        nan = top & (mant == 2**f.mant - 1)
    val = np.where((b & sign_bit) != 0, -mag, mag)
    return np.where(nan, np.nan, val)


def _fp8_format(dtype: DType) -> _Format:
    if not _is_fp8(dtype):
        raise DTypeError(f"expected an fp8 dtype ({', '.join(d.name for d in dtypes.fp8s)}), got {dtype!r}")
    return _FORMATS[dtype.name]


def float_to_bf16_bits(arr: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """bfloat16 bit patterns of float values, rounded to nearest even (overflow -> inf, NaN stays NaN).

    >>> float_to_bf16_bits(np.array([1.0, 1.00390625], dtype=np.float32))
    array([16256, 16256], dtype=uint16)
    """
    return _encode(arr, _FORMATS["bfloat16"]).astype(np.uint16)


def bf16_bits_to_float(arr: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """float32 values of bfloat16 bit patterns (exact).

    >>> bf16_bits_to_float(np.array([0x3F80, 0xC000], dtype=np.uint16))
    array([ 1., -2.], dtype=float32)
    """
    return (np.asarray(arr).astype(np.uint32) << 16).view(np.float32)


def float_to_fp8_bits(arr: npt.ArrayLike, dtype: DType) -> npt.NDArray[np.uint8]:
    """fp8 bit patterns of float values, rounded to nearest even with OCP saturation: finite values beyond the
    format's max and +-inf become +-max; NaN becomes NaN (0x80 for the fnuz formats, which have no -0).

    >>> float_to_fp8_bits(np.array([1.0, 1000.0, -np.inf], dtype=np.float32), dtypes.fp8e4m3)
    array([ 56, 126, 254], dtype=uint8)
    """
    return _encode(arr, _fp8_format(dtype)).astype(np.uint8)


def fp8_bits_to_float(arr: npt.ArrayLike, dtype: DType) -> npt.NDArray[np.float32]:
    """float32 values of fp8 bit patterns (exact).

    >>> fp8_bits_to_float(np.array([0x38, 0x7E, 0x7F], dtype=np.uint8), dtypes.fp8e4m3)
    array([  1., 448.,  nan], dtype=float32)
    """
    return _decode(arr, _fp8_format(dtype)).astype(np.float32)


def _wrap_int(bits: int, signed: bool) -> Callable[[Any], Any]:
    def wrap(x: Any) -> int:
        if isinstance(x, float) and not math.isfinite(x):
            raise DTypeError(f"cannot convert {x} to a {'' if signed else 'u'}int{bits}")
        v = int(x) % (1 << bits)
        return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v

    return wrap


def _struct_round(fmt: str) -> Callable[[Any], Any]:
    def round_(x: Any) -> float:
        try:
            return float(struct.unpack(fmt, struct.pack(fmt, float(x)))[0])
        except OverflowError:
            return math.copysign(math.inf, float(x))

    return round_


def _format_round(f: _Format) -> Callable[[Any], Any]:
    def round_(x: Any) -> float:
        return float(_decode(_encode([float(x)], f), f)[0])

    return round_


def float_to_fp16(x: float) -> float:
    """`x` rounded to the nearest float16 value (ties to even; beyond the range, +-inf).

    >>> float_to_fp16(1.0001), float_to_fp16(70000.0)
    (1.0, inf)
    """
    return float(_struct_round("e")(x))


def float_to_bf16(x: float) -> float:
    """`x` rounded to the nearest bfloat16 value (ties to even; beyond the range, +-inf; NaN stays NaN).

    >>> float_to_bf16(1.00390625), float_to_bf16(3.0078125)
    (1.0, 3.0)
    """
    return float(_format_round(_FORMATS["bfloat16"])(x))


def float_to_fp8(x: float, dtype: DType) -> int:
    """The fp8 bit pattern (0..255) of `x` in fp8 `dtype`, rounded to nearest even and saturating at the format's
    largest finite value (see `float_to_fp8_bits`).

    >>> float_to_fp8(1.0, dtypes.fp8e4m3), float_to_fp8(-1000.0, dtypes.fp8e4m3)
    (56, 254)
    """
    return int(float_to_fp8_bits([float(x)], dtype)[0])


def fp8_to_float(x: int, dtype: DType) -> float:
    """The value of fp8 bit pattern `x` (0..255) in fp8 `dtype`.

    >>> fp8_to_float(56, dtypes.fp8e4m3), fp8_to_float(0x7E, dtypes.fp8e4m3)
    (1.0, 448.0)
    """
    return float(_decode([int(x)], _fp8_format(dtype))[0])


class _Truncate:
    """`truncate(d)` or, as in tinygrad, `truncate[d]`: a function mapping a Python number to the nearest value `d`
    holds: two's complement wraparound for ints, round-to-nearest-even for floats (fp8 saturates), bool(x) for bool.
    Used by constant folding.

    >>> truncate(dtypes.int8)(200), truncate(dtypes.uint8)(-1), truncate[dtypes.bool](2)
    (-56, 255, True)
    >>> truncate(dtypes.float16)(1.0001), truncate(dtypes.fp8e4m3)(1000.0)
    (1.0, 448.0)
    """

    def __call__(self, d: DType) -> Callable[[Any], Any]:
        return _truncate(d)

    def __getitem__(self, d: DType) -> Callable[[Any], Any]:
        return _truncate(d)


truncate: Final = _Truncate()


def _truncate(d: DType) -> Callable[[Any], Any]:
    s = d.scalar()
    if s == dtypes.bool:
        return bool
    if s == dtypes.weakint:
        return int
    if s in (dtypes.weakfloat, dtypes.float64):
        return float
    if _is_int(s):
        return _wrap_int(8 * s.itemsize, not _is_unsigned(s))
    if s in (dtypes.float32, dtypes.float16):
        return _struct_round(s.fmt or "")
    if _is_float(s):
        return _format_round(_FORMATS[s.name])
    raise DTypeError(f"no values to truncate to in {d!r}")
