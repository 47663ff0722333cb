"""The PYTHON reference executor: a pure-Python interpreter of linear programs, the executable definition of every op.

In: a linear program (stage 3 of `xgrad.uop.ops`), a list of UOps in execution order ending in a SINK, plus raw byte
buffers and variable values. Out: nothing; STOREs write the buffers. Every backend is compared with this interpreter,
so it favours being obviously right over being fast.

Values: a scalar is a Python `bool` (bool dtype), `int` (int dtypes) or `float` (float dtypes, always holding a value
exactly representable in the dtype); a vector is a tuple of scalars. Every result is rounded to its uop's dtype with C
semantics, except where C is undefined and xgrad defines a result: x IDIV 0 is 0 and x MOD 0 is x, INT_MIN IDIV -1
wraps to INT_MIN (MOD gives 0), and MAX propagates NaN from either operand. What C leaves undefined and xgrad does not
define (shifts by >= the bit width, out-of-range float->int casts) raises `UndefinedBehaviorError`: a program that
does it is a codegen bug.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

import numpy as np

from xgrad.dtype import (
    DType,
    bf16_bits_to_float,
    dtypes,
    float_to_bf16_bits,
    float_to_fp8_bits,
    fp8_bits_to_float,
    truncate,
)
from xgrad.errors import DTypeError, XgradError
from xgrad.uop.ops import AxisType, Ops, UOp


class ProgramError(XgradError):
    """A linear program is malformed (a source used before it is computed, unbalanced RANGE/END, a missing
    variable or buffer) or it accesses memory out of bounds. Either way it is a codegen bug, not a user error."""


class UndefinedBehaviorError(XgradError, ArithmeticError):
    """The program did something C leaves undefined (division by zero, too wide a shift, an out-of-range cast)."""


# ---- scalar conversion: rounding to a dtype and C value casts ----
@cache
def _rounder(d: DType) -> Callable[[Any], Any]:
    """The function rounding a Python number to scalar dtype `d`: int wraparound (index is a 64-bit signed int),
    float32/float16 round-to-nearest-even, bf16/fp8 as the dtype helpers do, bool is `!= 0`."""
    return truncate(d.scalar())


def _int_to_float(x: int, d: DType) -> float:
    """Round an int to float dtype `d` in one step (float(x) first would round twice for |x| >= 2**53)."""
    if abs(x) < 2**53 or d in (dtypes.float64, dtypes.weakfloat):
        return float(_rounder(d)(float(x)))
    keep = dtypes.finfo(d)[1] + 1  # significant bits of d
    mag = abs(x)
    shift = mag.bit_length() - keep
    q, r = divmod(mag, 1 << shift)
    half = 1 << (shift - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return float(_rounder(d)(math.copysign(float(q << shift), x)))


def _cast_scalar(d: DType, x: Any) -> Any:
    """C conversion of one value to scalar dtype `d` (what CAST and an implicit store conversion do)."""
    if dtypes.is_bool(d):
        return x != 0  # NaN != 0 is true in C too
    if isinstance(x, bool):
        x = int(x)
    if dtypes.is_int(d):
        if isinstance(x, float):
            if not math.isfinite(x):
                raise UndefinedBehaviorError(f"cast of {x} to {d.name} is undefined in C")
            t = math.trunc(x)
            if d not in (dtypes.weakint,) and not d.min <= t <= d.max:
                raise UndefinedBehaviorError(f"cast of {x} to {d.name} is out of range (undefined in C)")
            return t
        return _rounder(d)(x)
    if dtypes.is_float(d):
        return _int_to_float(x, d) if isinstance(x, int) else _rounder(d)(x)
    raise DTypeError(f"cannot convert {x!r} to {d!r}")


def _lanes(d: DType, fn: Callable[[Any], Any], x: Any) -> Any:
    """Apply a scalar function to each lane of a value of dtype `d`."""
    if d.count == 1:
        return fn(x)
    return tuple(fn(v) for v in _as_lanes(x, d.count, "value"))


def _as_lanes(x: Any, count: int, what: str) -> tuple[Any, ...]:
    if not isinstance(x, tuple) or len(x) != count:
        raise ProgramError(f"expected a {count}-lane vector {what}, got {x!r}")
    return x


def cast_value(d: DType, x: Any) -> Any:
    """CAST: convert `x` (a scalar, or a tuple for vector `d`) to dtype `d` with C semantics."""
    s = d.scalar()
    return _lanes(d, lambda v: _cast_scalar(s, v), x)


# ---- bytes: buffer elements and BITCAST ----
_STRUCT_FMT = {dtypes.index: "q", dtypes.weakint: "q", dtypes.weakfloat: "d"}


def _struct_fmt(d: DType) -> str | None:
    return d.fmt if d.fmt is not None else _STRUCT_FMT.get(d)


def encode(d: DType, values: Sequence[Any]) -> bytes:
    """The bytes of `values` (already of scalar dtype `d`), native byte order."""
    if (fmt := _struct_fmt(d)) is not None:
        return struct.pack(f"={len(values)}{fmt}", *values)
    arr = np.array(values, dtype=np.float64)
    if d == dtypes.bfloat16:
        return float_to_bf16_bits(arr).astype(np.uint16).tobytes()
    if dtypes.is_fp8(d):
        return float_to_fp8_bits(arr, d).astype(np.uint8).tobytes()
    raise DTypeError(f"{d!r} has no memory layout")


def decode(d: DType, data: bytes | memoryview, count: int, offset: int = 0) -> list[Any]:
    """`count` values of scalar dtype `d` read from `data` at byte `offset`."""
    if (fmt := _struct_fmt(d)) is not None:
        return list(struct.unpack_from(f"={count}{fmt}", data, offset))
    if d == dtypes.bfloat16:
        bits16 = np.frombuffer(data, dtype=np.uint16, count=count, offset=offset)
        return [float(v) for v in bf16_bits_to_float(bits16)]
    if dtypes.is_fp8(d):
        bits8 = np.frombuffer(data, dtype=np.uint8, count=count, offset=offset)
        return [float(v) for v in fp8_bits_to_float(bits8, d)]
    raise DTypeError(f"{d!r} has no memory layout")


def bitcast_value(src: DType, dst: DType, x: Any) -> Any:
    """BITCAST: the value of dtype `dst` whose bytes are those of `x` (dtype `src`); the sizes must agree."""
    if src.itemsize != dst.itemsize:
        raise ProgramError(f"BITCAST from {src!r} to {dst!r}: sizes differ ({src.itemsize} vs {dst.itemsize} bytes)")
    lanes = list(_as_lanes(x, src.count, "BITCAST source")) if src.count > 1 else [x]
    out = decode(dst.scalar(), encode(src.scalar(), lanes), dst.count)
    return tuple(out) if dst.count > 1 else out[0]


# ---- ALU: one small function per op, on scalars; `d` is the scalar dtype of the result ----
def _need_float(d: DType, op: Ops) -> None:
    if not dtypes.is_float(d):
        raise DTypeError(f"{op.name} is defined on float dtypes only, got {d!r}")


def _need_int(d: DType, op: Ops) -> None:
    if not dtypes.is_int(d):
        raise DTypeError(f"{op.name} is defined on int dtypes only, got {d!r}")


def _exp2(d: DType, x: float) -> float:
    _need_float(d, Ops.EXP2)
    try:
        return float(2.0**x)
    except OverflowError:
        return math.inf


def _log2(d: DType, x: float) -> float:
    _need_float(d, Ops.LOG2)
    if x == 0:
        return -math.inf
    if x < 0 or math.isnan(x):
        return math.nan
    return math.log2(x)


def _sin(d: DType, x: float) -> float:
    _need_float(d, Ops.SIN)
    return math.sin(x) if math.isfinite(x) else math.nan


def _sqrt(d: DType, x: float) -> float:
    _need_float(d, Ops.SQRT)
    return math.nan if x < 0 else math.sqrt(x)  # sqrt(-0.0) is -0.0


def _fdiv(d: DType, a: float, b: float) -> float:
    _need_float(d, Ops.FDIV)
    if b == 0:
        if a == 0 or math.isnan(a) or math.isnan(b):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _reciprocal(d: DType, x: float) -> float:
    _need_float(d, Ops.RECIPROCAL)
    return _fdiv(d, 1.0, x)


def _trunc(d: DType, x: Any) -> Any:
    if isinstance(x, float) and math.isfinite(x):
        return math.copysign(float(math.trunc(x)), x)  # trunc(-0.5) is -0.0
    return x


def _idiv(d: DType, a: int, b: int) -> int:
    _need_int(d, Ops.IDIV)
    if b == 0:
        return 0  # defined by xgrad (C traps or is undefined)
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q  # truncate toward zero; MIN / -1 is wrapped to MIN by the rounding


def _mod(d: DType, a: int, b: int) -> int:
    _need_int(d, Ops.MOD)
    return a - b * _idiv(d, a, b)  # the sign of the dividend; x MOD 0 is x, MIN MOD -1 is 0


def _max(d: DType, a: Any, b: Any) -> Any:
    return a if a > b or a != a else b  # a NaN in either operand propagates (b's through the failed a > b)


def _bitwise(op: Ops, fn: Callable[[Any, Any], Any]) -> Callable[[DType, Any, Any], Any]:
    def run(d: DType, a: Any, b: Any) -> Any:
        if not (dtypes.is_int(d) or dtypes.is_bool(d)):
            raise DTypeError(f"{op.name} is defined on int and bool dtypes only, got {d!r}")
        return fn(a, b)

    return run


def _shift(op: Ops, fn: Callable[[int, int], int]) -> Callable[[DType, int, int], int]:
    def run(d: DType, a: int, b: int) -> int:
        _need_int(d, op)
        bits = 8 * d.itemsize
        if not 0 <= b < bits:
            raise UndefinedBehaviorError(f"{op.name} of {d.name} by {b} is undefined in C (allowed: 0..{bits - 1})")
        return fn(a, b)  # Python's >> is arithmetic; unsigned values are non-negative, so it is logical for them

    return run


def _mulacc(d: DType, a: Any, b: Any, c: Any) -> Any:
    return _rounder(d)(a * b) + c  # two roundings, like an unfused `a*b+c` in C (see the renderer's fp-contract)


_ALU: dict[Ops, Callable[..., Any]] = {
    Ops.EXP2: _exp2,
    Ops.LOG2: _log2,
    Ops.SIN: _sin,
    Ops.SQRT: _sqrt,
    Ops.RECIPROCAL: _reciprocal,
    Ops.NEG: lambda d, x: -x,
    Ops.TRUNC: _trunc,
    Ops.ADD: lambda d, a, b: a + b,
    Ops.SUB: lambda d, a, b: a - b,
    Ops.MUL: lambda d, a, b: a * b,
    Ops.FDIV: _fdiv,
    Ops.IDIV: _idiv,
    Ops.MOD: _mod,
    Ops.MAX: _max,
    Ops.CMPLT: lambda d, a, b: a < b,  # Python's float comparisons are IEEE: false with NaN, except !=
    Ops.CMPNE: lambda d, a, b: a != b,
    Ops.CMPEQ: lambda d, a, b: a == b,
    Ops.AND: _bitwise(Ops.AND, lambda a, b: a & b),
    Ops.OR: _bitwise(Ops.OR, lambda a, b: a | b),
    Ops.XOR: _bitwise(Ops.XOR, lambda a, b: a ^ b),
    Ops.SHL: _shift(Ops.SHL, lambda a, b: a << b),
    Ops.SHR: _shift(Ops.SHR, lambda a, b: a >> b),
    Ops.WHERE: lambda d, c, a, b: a if c else b,
    Ops.MULACC: _mulacc,
    Ops.CAST: _cast_scalar,
}


def interpret_alu(op: Ops, dtype: DType, *args: Any) -> Any:
    """The value of ALU op `op` (or CAST) with result dtype `dtype` on argument values `args`, rounded to `dtype`.
    Vector dtypes work lane-wise on tuples. BITCAST needs the source dtype: use `bitcast_value`.

    >>> interpret_alu(Ops.IDIV, dtypes.int32, -7, 2), interpret_alu(Ops.ADD, dtypes.uint8, 250, 10)
    (-3, 4)
    """
    if (fn := _ALU.get(op)) is None:
        raise ProgramError(f"{op.name} is not an ALU op the interpreter knows (POW must be decomposed first)")
    s = dtype.scalar()
    rnd = _rounder(s)
    if dtype.count == 1:
        return rnd(fn(s, *args))
    vecs = [_as_lanes(a, dtype.count, f"argument of {op.name}") for a in args]
    return tuple(rnd(fn(s, *lane)) for lane in zip(*vecs))


def zero(dtype: DType) -> Any:
    """The zero of `dtype` (what a load with a false gate yields)."""
    return cast_value(dtype, (0,) * dtype.count if dtype.count > 1 else 0)


# ---- the machine ----
@dataclass(frozen=True)
class Place:
    """The value of an INDEX: `lanes` consecutive elements from `pos` of buffer `buf`; `gate` false: no access."""

    buf: int
    dtype: DType  # scalar element dtype of the buffer
    pos: int
    lanes: int
    gate: bool


class Shared:
    """What the threads of one workgroup share (see `xgrad_codegen.pygpu`): the DEFINE_LOCAL buffers, numbered from
    `first` in every thread's buffer list, and who touched each element since the last barrier, to report a race
    (an element one thread writes and another reads or writes between two barriers) as a ProgramError."""

    def __init__(self, first: int, slots: dict[UOp, int]) -> None:
        self.first = first
        self.slots = slots  # DEFINE_LOCAL -> its buffer number
        self.writer: dict[tuple[int, int], int] = {}  # (buffer, element) -> the thread that wrote it in this phase
        self.readers: dict[tuple[int, int], set[int]] = {}

    def new_phase(self) -> None:
        self.writer.clear()
        self.readers.clear()

    def access(self, place: Place, thread: int, write: bool) -> None:
        for e in range(place.pos, place.pos + place.lanes):
            key = (place.buf, e)
            other = self.writer.get(key, thread)
            readers = self.readers.setdefault(key, set())
            if other != thread or (write and readers - {thread}):
                raise ProgramError(
                    f"shared memory race: element {e} of local buffer {place.buf - self.first} is "
                    f"{'written' if write else 'read'} by thread {thread} and written or read by another thread "
                    "without a BARRIER between them"
                )
            if write:
                self.writer[key] = thread
            else:
                readers.add(thread)


class AsyncCopier(Protocol):
    """A workgroup's asynchronous copies (`xgrad_codegen.pygpu.AsyncCopies`): a STORE whose value is an INDEX issues
    one, a BARRIER with an arg commits and waits."""

    def issue(self, m: Machine, dst: Place, src: Place) -> None: ...

    def wait(self, m: Machine, arg: Any) -> None: ...


class Machine:
    """The state of one run: current values, loop bounds, the program counter. A GPU launch runs one per thread,
    with `specials` (its SPECIAL ids) and `shared` (its workgroup's memory) set."""

    def __init__(
        self,
        uops: Sequence[UOp],
        bufs: Sequence[memoryview],
        vals: dict[str, int],
        split: tuple[int | None, int | None],
        layout: tuple[dict[UOp, int], dict[UOp, int]] | None = None,
    ) -> None:
        self.uops = uops
        self.bufs = [b if b.format == "B" and b.ndim == 1 else b.cast("B") for b in bufs]
        self.vars = vals
        self.split = split
        self.values: dict[UOp, Any] = {}
        self.bounds: dict[UOp, int] = {}  # RANGE -> its end in this execution of the loop
        self.range_pos, self.end_pos = layout if layout is not None else check_program(uops)
        self.global_range = next((u for u in uops if u.op is Ops.RANGE and u.arg[1] is AxisType.GLOBAL), None)
        self.pc = 0
        self.specials: dict[str, int] | None = None
        self.shared: Shared | None = None
        self.thread = 0
        self.copies: AsyncCopier | None = None  # set by pygpu: asynchronous copies into shared memory
        self.waiting = False  # stopped at a BARRIER

    def run_to_barrier(self) -> bool:
        """Run until the next BARRIER (True) or the end of the program (False)."""
        n = len(self.uops)
        self.waiting = False
        while self.pc < n:
            u = self.uops[self.pc]
            self.pc += 1
            _EXEC[u.op](self, u)
            if self.waiting:
                return True
        return False

    def run(self) -> None:
        if self.global_range is None:  # a program without a GLOBAL range is one work item, item 0
            start, end = self.split
            if not (start or 0) <= 0 < (1 if end is None else end):
                return
        n = len(self.uops)
        while self.pc < n:
            u = self.uops[self.pc]
            self.pc += 1
            _EXEC[u.op](self, u)

    def src(self, u: UOp, i: int) -> Any:
        return self.values[u.src[i]]

    def element(self, place: Place, what: str) -> int:
        """Byte offset of `place` in its buffer, raising if any lane is out of bounds."""
        size = self.bufs[place.buf].nbytes // place.dtype.itemsize
        if place.pos < 0 or place.pos + place.lanes > size:
            where = f"position {place.pos}" + (f" (+{place.lanes} lanes)" if place.lanes > 1 else "")
            raise ProgramError(
                f"out-of-bounds {what} of buffer {place.buf} ({size} elements of {place.dtype.name}) "
                f"at {where}: an index or gate the codegen produced is wrong"
            )
        return place.pos * place.dtype.itemsize


def check_program(uops: Sequence[UOp]) -> tuple[dict[UOp, int], dict[UOp, int]]:
    """Check the structure the interpreter relies on; return the positions of each RANGE and of its END."""
    seen: set[UOp] = set()
    open_ranges: list[UOp] = []
    range_pos: dict[UOp, int] = {}
    end_pos: dict[UOp, int] = {}
    for i, u in enumerate(uops):
        if u.op not in _EXEC:
            raise ProgramError(f"uop {i} is {u.op.name}, which does not belong in a linear program")
        for s in u.src:
            if s not in seen:
                raise ProgramError(f"uop {i} ({u.op.name}) uses a {s.op.name} that is not computed before it")
        if u.op is Ops.RANGE:
            range_pos[u] = i
            open_ranges.append(u)
        elif u.op is Ops.END:
            if not open_ranges or open_ranges[-1] is not u.src[0]:
                raise ProgramError(f"uop {i}: END does not close the innermost open RANGE")
            end_pos[open_ranges.pop()] = i
        seen.add(u)
    if open_ranges:
        raise ProgramError(f"{len(open_ranges)} RANGE(s) have no END")
    if not uops or uops[-1].op is not Ops.SINK:
        raise ProgramError("a linear program must end with a SINK")
    return range_pos, end_pos


# ---- op handlers: each sets the uop's value (and, for control flow, the program counter) ----
def _exec_param(m: Machine, u: UOp) -> None:
    if not 0 <= u.arg < len(m.bufs):
        raise ProgramError(f"PARAM {u.arg} needs buffer {u.arg}, but {len(m.bufs)} buffers were passed")
    m.values[u] = u.arg


def _exec_define_var(m: Machine, u: UOp) -> None:
    name, lo, hi = u.arg
    if name not in m.vars:
        raise ProgramError(f"variable {name!r} has no value; pass it in vals (got {sorted(m.vars)})")
    value = m.vars[name]
    if not lo <= value <= hi:
        raise ProgramError(f"variable {name!r} = {value} is outside its range [{lo}, {hi}]")
    m.values[u] = cast_value(u.dtype, value)


def _exec_const(m: Machine, u: UOp) -> None:
    m.values[u] = cast_value(u.dtype, (u.arg,) * u.dtype.count if u.dtype.count > 1 else u.arg)


def _exec_range(m: Machine, u: UOp) -> None:
    start, end = 0, int(m.src(u, 0))
    if u is m.global_range:
        lo, hi = m.split
        start, hi = (0 if lo is None else lo), (end if hi is None else hi)
        if not 0 <= start <= end or not 0 <= hi <= end:
            raise ProgramError(f"work split [{lo}, {hi}) is outside the GLOBAL range [0, {end})")
        end = hi
    if start >= end:
        m.pc = m.end_pos[u] + 1  # an empty loop: skip its body
        return
    m.bounds[u] = end
    m.values[u] = start


def _exec_end(m: Machine, u: UOp) -> None:
    rng = u.src[0]
    if (nxt := m.values[rng] + 1) < m.bounds[rng]:
        m.values[rng] = nxt
        m.pc = m.range_pos[rng] + 1


def _exec_index(m: Machine, u: UOp) -> None:
    param = u.src[0]
    pos = m.src(u, 1)
    gate = bool(m.src(u, 2)) if len(u.src) > 2 else True
    if isinstance(pos, tuple) or (len(u.src) > 2 and isinstance(m.src(u, 2), tuple)):
        raise ProgramError("INDEX takes a scalar position and a scalar gate; a vector INDEX is consecutive lanes")
    m.values[u] = Place(m.values[param], param.dtype.scalar(), pos, u.dtype.count, gate)


def _exec_load(m: Machine, u: UOp) -> None:
    place: Place = m.src(u, 0)
    if u.arg is not None:  # a warp-wide matrix load (MatrixLoad): the thread waits; pygpu loads for the warp
        if m.shared is None:
            raise ProgramError("a warp-wide matrix LOAD outside a workgroup: run GPU programs with xgrad_codegen.pygpu")
        m.waiting = True
        return
    if not place.gate:
        m.values[u] = zero(u.dtype)
        return
    if m.shared is not None and place.buf >= m.shared.first:
        m.shared.access(place, m.thread, write=False)
    lanes = decode(place.dtype, m.bufs[place.buf], place.lanes, m.element(place, "load"))
    m.values[u] = tuple(lanes) if u.dtype.count > 1 else lanes[0]


def _exec_store(m: Machine, u: UOp) -> None:
    place: Place = m.src(u, 0)
    if u.src[1].op is Ops.INDEX:  # an asynchronous copy from that place (see Renderer.async_copy_bytes)
        if m.copies is None:
            raise ProgramError("an asynchronous copy (STORE of an INDEX) outside a workgroup: run it with pygpu")
        m.copies.issue(m, place, m.src(u, 1))
        return
    if not place.gate:
        return
    if m.shared is not None and place.buf >= m.shared.first:
        m.shared.access(place, m.thread, write=True)
    value = m.src(u, 1)
    lanes = list(_as_lanes(value, place.lanes, "STORE value")) if place.lanes > 1 else [value]
    data = encode(place.dtype, [_cast_scalar(place.dtype, v) for v in lanes])  # C's conversion on assignment
    offset = m.element(place, "store")
    m.bufs[place.buf][offset : offset + len(data)] = data


def _exec_define_acc(m: Machine, u: UOp) -> None:
    m.values[u] = m.src(u, 0)


def _exec_assign_acc(m: Machine, u: UOp) -> None:
    acc = u.src[0]
    if acc.op is not Ops.DEFINE_ACC:
        raise ProgramError(f"ASSIGN_ACC must target a DEFINE_ACC, got {acc.op.name}")
    m.values[acc] = m.values[u] = m.src(u, 1)


def _exec_vectorize(m: Machine, u: UOp) -> None:
    if len(u.src) != u.dtype.count:
        raise ProgramError(f"VECTORIZE of {len(u.src)} values has dtype {u.dtype!r}")
    m.values[u] = tuple(m.values[s] for s in u.src)


def _exec_gep(m: Machine, u: UOp) -> None:
    vec = m.src(u, 0)
    lanes = vec if isinstance(vec, tuple) else (vec,)  # GEP 0 of a scalar is the scalar
    if not isinstance(u.arg, int) or not 0 <= u.arg < len(lanes):
        raise ProgramError(f"GEP of lane {u.arg!r} from a {len(lanes)}-lane value")
    m.values[u] = lanes[u.arg]


def _exec_alu(m: Machine, u: UOp) -> None:
    m.values[u] = interpret_alu(u.op, u.dtype, *(m.values[s] for s in u.src))


def _exec_bitcast(m: Machine, u: UOp) -> None:
    m.values[u] = bitcast_value(u.src[0].dtype, u.dtype, m.src(u, 0))


def _exec_special(m: Machine, u: UOp) -> None:
    if m.specials is None or u.arg[0] not in m.specials:
        raise ProgramError(
            f"SPECIAL {u.arg[0]} has no value: run GPU programs with xgrad_codegen.pygpu.run_gpu_program"
        )
    m.values[u] = m.specials[u.arg[0]]


def _exec_define_local(m: Machine, u: UOp) -> None:
    if m.shared is None:
        raise ProgramError("DEFINE_LOCAL outside a workgroup: run GPU programs with xgrad_codegen.pygpu")
    m.values[u] = m.shared.slots[u]


def _exec_barrier(m: Machine, u: UOp) -> None:
    if m.shared is None:
        raise ProgramError("BARRIER outside a workgroup: run GPU programs with xgrad_codegen.pygpu")
    if u.arg is not None and m.copies is not None:  # AsyncWait: commit this thread's copies, land the older groups
        m.copies.wait(m, u.arg)
    m.waiting = True


def _exec_wmma(m: Machine, u: UOp) -> None:
    """A warp-wide matrix instruction: the thread waits here; `pygpu` computes it for the whole warp at once."""
    if m.shared is None:
        raise ProgramError("WMMA outside a workgroup: run GPU programs with xgrad_codegen.pygpu")
    m.waiting = True


def _exec_noop(m: Machine, u: UOp) -> None:
    m.values[u] = m.src(u, 0) if u.src else None


def _exec_sink(m: Machine, u: UOp) -> None:
    m.pc = len(m.uops)


_EXEC: dict[Ops, Callable[[Machine, UOp], None]] = {
    Ops.PARAM: _exec_param,
    Ops.DEFINE_VAR: _exec_define_var,
    Ops.CONST: _exec_const,
    Ops.RANGE: _exec_range,
    Ops.END: _exec_end,
    Ops.INDEX: _exec_index,
    Ops.LOAD: _exec_load,
    Ops.STORE: _exec_store,
    Ops.DEFINE_ACC: _exec_define_acc,
    Ops.ASSIGN_ACC: _exec_assign_acc,
    Ops.VECTORIZE: _exec_vectorize,
    Ops.GEP: _exec_gep,
    Ops.BITCAST: _exec_bitcast,
    Ops.NOOP: _exec_noop,
    Ops.SINK: _exec_sink,
    Ops.SPECIAL: _exec_special,
    Ops.DEFINE_LOCAL: _exec_define_local,
    Ops.BARRIER: _exec_barrier,
    Ops.WMMA: _exec_wmma,
    **{op: _exec_alu for op in _ALU},
}


def run_program(
    uops: Sequence[UOp],
    bufs: Sequence[memoryview],
    vals: dict[str, int] | None = None,
    start: int | None = None,
    end: int | None = None,
) -> None:
    """Execute a linear program on raw byte buffers (`bufs[i]` is PARAM i). `vals` gives each DEFINE_VAR's value.
    `start`/`end` restrict the first GLOBAL range to [start, end) so callers can split the work; a program without
    a GLOBAL range is a single work item (item 0)."""
    Machine(uops, bufs, dict(vals or {}), (start, end)).run()
