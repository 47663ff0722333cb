"""The UOp IR: one immutable, hash-consed graph node type for every stage of xgrad.

Stages (each has a spec table in `xgrad.uop.spec`):

1. Tensor graph (built by `Tensor`): DEVICE, BUFFER, CONST, movement ops (RESHAPE PERMUTE EXPAND PAD SHRINK FLIP),
   ALU ops, REDUCE_AXIS, CONTIGUOUS, COPY, ASSIGN, DETACH, CONTIGUOUS_BACKWARD. Nodes have a shape.
2. Kernel AST (built by the scheduler, one per kernel): SINK of STOREs. Buffers are PARAMs, positions are index
   expressions over RANGEs (no movement ops remain), reductions are REDUCE(value, *reduce_ranges).
3. Linear program (built by codegen, read by renderers and the PYTHON reference executor): a list of UOps in execution
   order. Loops are RANGE ... END, reductions are DEFINE_ACC + ASSIGN, values are ALU/LOAD/CONST, vectors are
   VECTORIZE/GEP and vector dtypes. Semantics of every op in stage 3 are defined by `xgrad_codegen.pyexec`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from xgrad.dtype import DType, dtypes, truncate
from xgrad.errors import ShapeError, ShardingError
from xgrad.helpers import KeyedRef, prod


class Ops(enum.Enum):
    # members are singletons, so hashing by identity is exact; Enum's own hash (of the name, in Python) is a hot spot
    # of every rewrite (rule tables and matches look ops up in dicts and sets)
    __hash__ = object.__hash__

    # graph leaves
    DEVICE = enum.auto()  # arg: device name
    BUFFER = enum.auto()  # src: (DEVICE,), arg: (unique id, size in elements)
    CONST = enum.auto()  # arg: Python value; tensor graph: src (DEVICE,), kernel: no src
    DEFINE_VAR = enum.auto()  # arg: (name, min, max); a symbolic int
    BIND = enum.auto()  # src: (DEFINE_VAR, CONST): a variable with a value
    # movement (tensor graph only); arg holds the parameters
    RESHAPE = enum.auto()  # arg: new shape
    PERMUTE = enum.auto()  # arg: axis order
    EXPAND = enum.auto()  # arg: new shape (only size-1 dims grow)
    PAD = enum.auto()  # arg: ((before, after), ...) zero padding
    SHRINK = enum.auto()  # arg: ((start, end), ...)
    FLIP = enum.auto()  # arg: tuple of bools, one per axis
    # tensor graph structure
    REDUCE_AXIS = enum.auto()  # arg: (Ops.ADD | Ops.MAX | Ops.MUL, axes); reduced axes keep size 1
    CONTIGUOUS = enum.auto()  # realize here (a kernel boundary)
    CONTIGUOUS_BACKWARD = enum.auto()  # identity forward; gradient is made contiguous
    DETACH = enum.auto()  # identity forward; no gradient
    COPY = enum.auto()  # src: (x, DEVICE): copy x to another device
    ASSIGN = enum.auto()  # src: (target, value): write value into target's buffer
    IOTA = enum.auto()  # src: (DEVICE,), arg: size; element i holds i (arange is built on it)
    # kernel AST and linear program
    SINK = enum.auto()  # src: the stores (AST) / the end of a program; arg: KernelInfo or None
    PARAM = enum.auto()  # arg: buffer index; dtype: element dtype; used as a pointer by INDEX
    RANGE = enum.auto()  # src: (end,), arg: (axis id, AxisType); dtype index
    REDUCE = enum.auto()  # src: (value, *ranges), arg: Ops.ADD | Ops.MAX | Ops.MUL
    INDEX = enum.auto()  # src: (PARAM, index) or (PARAM, index, gate); a place in a buffer
    LOAD = enum.auto()  # src: (INDEX,); a gated INDEX whose gate is false loads 0
    STORE = enum.auto()  # src: (INDEX, value); a gated INDEX whose gate is false stores nothing
    END = enum.auto()  # src: (RANGE,); closes the loop (linear program)
    DEFINE_ACC = enum.auto()  # src: (init value,), arg: accumulator id; a register (linear program)
    ASSIGN_ACC = enum.auto()  # src: (DEFINE_ACC, value); acc = value (linear program)
    VECTORIZE = enum.auto()  # src: scalars; builds a vector of dtype.vec(len(src))
    GEP = enum.auto()  # src: (vector,), arg: lane; one lane of a vector
    SPECIAL = enum.auto()  # arg: (name, size); a hardware thread index (GPU renderers); src: () or (size expression,)
    DEFINE_LOCAL = enum.auto()  # arg: (slot, elements); dtype: element dtype; workgroup shared memory, used like PARAM
    BARRIER = enum.auto()  # src: the shared-memory STOREs (and values) before it; every thread of a workgroup waits
    WMMA = enum.auto()  # src: (A, B, C) register fragments; arg: the renderer's TensorCore; D = A @ B + C by a warp
    NOOP = enum.auto()
    # unary ALU
    EXP2 = enum.auto()
    LOG2 = enum.auto()
    SIN = enum.auto()
    SQRT = enum.auto()
    RECIPROCAL = enum.auto()
    NEG = enum.auto()
    TRUNC = enum.auto()
    CAST = enum.auto()  # value conversion to self.dtype
    BITCAST = enum.auto()  # reinterpret the bits as self.dtype (same itemsize)
    # binary ALU
    ADD = enum.auto()
    SUB = enum.auto()
    MUL = enum.auto()
    FDIV = enum.auto()  # float division
    IDIV = enum.auto()  # integer division, truncating toward zero (C)
    MOD = enum.auto()  # integer remainder with the sign of the dividend (C)
    MAX = enum.auto()
    CMPLT = enum.auto()
    CMPNE = enum.auto()
    CMPEQ = enum.auto()
    AND = enum.auto()
    OR = enum.auto()
    XOR = enum.auto()
    SHL = enum.auto()
    SHR = enum.auto()
    POW = enum.auto()  # only before decomposition
    # ternary ALU
    WHERE = enum.auto()
    MULACC = enum.auto()  # a*b+c
    # autodiff only (never scheduled): a custom kernel's call; src: (kernel SINK, *arguments), arg: grad_fxn or None.
    # Its outputs are DETACH nodes of the arguments' buffers with arg (the call, the argument's position)
    CUSTOM_KERNEL = enum.auto()
    # tensor graph: a step across processes (a collective), scheduled as an item of its own like COPY; src: (x, ...),
    # arg: a hashable description with `shape` (the output's), `name` and `run(out, *srcs)` (Buffers: a new one, the
    # sources'), e.g. `xgrad.distributed.collectives.Collective`. Kept last: the members' values stay as they were
    COLLECTIVE = enum.auto()

    def __repr__(self) -> str:
        return f"Ops.{self.name}"

    def __lt__(self, other: Ops) -> bool:
        return self.value < other.value


class GroupOp:
    Unary = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC})
    Binary = frozenset(
        {
            Ops.ADD,
            Ops.SUB,
            Ops.MUL,
            Ops.FDIV,
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
            Ops.POW,
        }
    )
    Ternary = frozenset({Ops.WHERE, Ops.MULACC})
    ALU = Unary | Binary | Ternary
    Elementwise = ALU | {Ops.CAST, Ops.BITCAST}
    Movement = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})
    Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
    Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR})
    Associative = frozenset({Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX})
    Identity = frozenset({Ops.CONTIGUOUS_BACKWARD, Ops.DETACH})


class AxisType(enum.Enum):
    """What codegen does with a RANGE: GLOBAL is parallel over cores/blocks, LOOP a plain loop, REDUCE a reduction
    loop, UPCAST/UNROLL are expanded into vector lanes (output / reduction), LOCAL/GROUP are GPU workgroup axes."""

    GLOBAL = enum.auto()
    LOCAL = enum.auto()
    LOOP = enum.auto()
    GROUP = enum.auto()
    REDUCE = enum.auto()
    UPCAST = enum.auto()
    UNROLL = enum.auto()

    def __repr__(self) -> str:
        return f"AxisType.{self.name}"

    def __lt__(self, other: AxisType) -> bool:
        return self.value < other.value


@dataclass(frozen=True)
class KernelInfo:
    """The arg of a kernel AST's SINK: its name and the optimizations applied (or to apply)."""

    name: str = "kernel"
    opts: tuple[Any, ...] = ()
    applied: bool = False


# key -> a weak reference to the live node (a plain dict: WeakValueDictionary's Python-level lookup is a hot spot)
_LIVE: dict[tuple[Any, ...], KeyedRef[UOp]] = {}


def _forget(ref: KeyedRef[UOp], live: dict[tuple[Any, ...], KeyedRef[UOp]] = _LIVE) -> None:
    """A node died: drop its cache entry, unless an equal node has taken the key since. The dict is bound as a
    default: nodes kept by this module (UOp.const's) die while the interpreter clears the module's globals."""
    if live.get(ref.key) is ref:
        del live[ref.key]


class _UOpMeta(type):
    """Hash-consing: building a UOp equal to a live one returns that same object."""

    def __call__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        # 1, 1.0 and True are equal in Python but are different constants, and so are -0.0 and 0.0
        key = (op, dtype, src, arg, type(arg), math.copysign(1.0, arg) if type(arg) is float else 0.0)
        try:
            ref = _LIVE.get(key)
        except TypeError:
            raise TypeError(
                f"UOp src must be a tuple of UOps and arg hashable, got {src!r}, {arg!r} for {op}"
            ) from None
        if ref is not None and (live := ref()) is not None:
            return live
        # the fields are set here rather than in an __init__: one Python-level call less per new node
        created: UOp = object.__new__(cls)  # type: ignore[arg-type]
        created.op, created.dtype, created.src, created.arg = op, dtype, src, arg
        ref = KeyedRef(created, _forget)
        ref.key = key
        _LIVE[key] = ref
        return created


_T = TypeVar("_T")


class _Cached(Generic[_T]):
    """A property computed on first read and kept in the node's `__dict__` (a non-data descriptor: later reads find
    the value there and never call this). functools.cached_property without the lock it takes on every first read
    on Python 3.11; a node's properties are pure functions of the immutable node, so two threads racing on one
    compute the same value."""

    def __init__(self, fn: Callable[[Any], _T]) -> None:
        self.func, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__  # (`func`: as functools names it)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Cached[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> _T | _Cached[_T]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value


class UOp(metaclass=_UOpMeta):
    """One node of the graph. Immutable; equal nodes are the same object, so `is` and `==` agree."""

    __slots__ = ("op", "dtype", "src", "arg", "__weakref__", "__dict__")
    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any

    if TYPE_CHECKING:  # the signature of `UOp(...)`, which `_UOpMeta.__call__` implements

        def __init__(self, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> None: ...

    def __reduce__(self) -> tuple[Any, ...]:
        return UOp, (self.op, self.dtype, self.src, self.arg)

    def replace(self, **kwargs: Any) -> UOp:
        op = kwargs.get("op", self.op)
        dtype = kwargs.get("dtype", self.dtype)
        src = kwargs.get("src", self.src)
        arg = kwargs.get("arg", self.arg)
        if op is self.op and dtype == self.dtype and src is self.src and arg == self.arg:
            return self
        return UOp(op, dtype, tuple(src), arg)

    # ---- graph walks ----
    @_Cached
    def toposort(self) -> dict[UOp, None]:
        """Every node this one depends on (itself last), sources before users."""
        return self.toposort_into({})

    def toposort_into(self, order: dict[UOp, None]) -> dict[UOp, None]:
        """`order` with this node and the nodes it depends on that `order` lacks appended, sources before users.

        A depth-first walk, sources left to right, each node appended once all of its sources are: the order a
        recursive walk gives (schedule-cache keys depend on it). A stack of (node, iterator over its sources) resumes
        each node where it left off, and a leaf is appended where it is met, with no stack entry of its own."""
        if self in order:
            return order
        stack: list[tuple[UOp, Iterator[UOp]]] = [(self, iter(self.src))]
        push, pop = stack.append, stack.pop
        while stack:
            node, sources = stack[-1]
            for s in sources:
                if s not in order:
                    if s.src:
                        push((s, iter(s.src)))
                        break
                    order[s] = None
            else:
                pop()
                order[node] = None
        return order

    def walk(self) -> dict[UOp, None]:
        """`toposort` without caching it: the cached dict when there is one, else a fresh walk. The cached dict holds
        the node itself (a reference cycle), so a node that will be dropped soon, e.g. another tensor's graph that is
        only looked through, keeps its graph and the buffers that graph reads until the cyclic GC runs."""
        cached: dict[UOp, None] | None = self.__dict__.get("toposort")
        return cached if cached is not None else self.toposort_into({})

    def drop_walk(self) -> None:
        """Forget the cached `toposort` (see `walk`): for a node the caller is about to drop."""
        self.__dict__.pop("toposort", None)

    def has_op(self, op: Ops) -> bool:
        return any(x.op is op for x in self.toposort)

    # ---- shape (tensor graph) ----
    @_Cached
    def shape(self) -> tuple[sint, ...] | None:
        _fill_sources(self, "shape")
        return _compute_shape(self)

    @property
    def ndim(self) -> int:
        assert self.shape is not None, f"{self.op} has no shape"
        return len(self.shape)

    @property
    def size(self) -> int:
        assert self.shape is not None, f"{self.op} has no shape"
        return int(prod(self.shape))

    @_Cached
    def device(self) -> str | None:
        _fill_sources(self, "device")
        if self.op is Ops.DEVICE:
            return str(self.arg)
        if self.op is Ops.COPY:
            return self.src[1].device
        for s in self.src:
            if (d := s.device) is not None:
                return d
        return None

    @property
    def axis(self) -> int | None:
        """tinygrad's: the axis a multi-device node is split on (None when it is replicated or on one device)."""
        return _sharding.split_axis(self)

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """tinygrad's: each device's (start, end) along the split axis of a multi-device node, in device order."""
        if (out := _sharding.split_bounds(self)) is None:
            raise ShardingError("bounds: this node is not split over devices; shard it along an axis first")
        return out

    @property
    def plain_buffer(self) -> bool:
        """A BUFFER or a reshape of one: what a realized tensor's node is (no realize replaces it)."""
        return self.op is Ops.BUFFER or (self.op is Ops.RESHAPE and self.src[0].op is Ops.BUFFER)

    @property
    def base(self) -> UOp:
        """The node under any movement ops."""
        x = self
        while x.op in GroupOp.Movement:
            x = x.src[0]
        return x

    # ---- construction helpers ----
    @staticmethod
    def const(dtype: DType, value: Any, device: str | None = None, shape: tuple[sint, ...] | None = None) -> UOp:
        """A constant, on `device` and broadcast to `shape` when given. The answers are remembered (up to
        _CONSTS_KEPT of them): every `x * 2` makes one, and building the CONST, its DEVICE and the reshape and expand
        to the shape (with their checks) cost ~8 of ~18 us of the op."""
        kind = type(value)
        key = None
        scalar = kind is int or kind is bool or kind is float
        if scalar and value == value and (shape is None or type(shape) is tuple):
            # -0.0 == 0.0 with one hash: floats are told apart by their sign too (NaN is never kept)
            key = (dtype, kind, value, math.copysign(1.0, value) if kind is float else 0, device, shape)
            if (hit := _CONSTS.get(key)) is not None:
                return hit
        src = (UOp(Ops.DEVICE, arg=device),) if device is not None else ()
        ret = UOp(Ops.CONST, dtype, src, _cast_const(dtype.scalar(), value))
        if shape is not None:
            ret = ret.reshape((1,) * len(shape)).expand(shape) if shape else ret
        if key is not None:
            if len(_CONSTS) >= _CONSTS_KEPT:
                _CONSTS.clear()
            _CONSTS[key] = ret
        return ret

    def const_like(self, value: Any) -> UOp:
        if self.shape is not None and self.device is not None:
            return UOp.const(self.dtype, value, self.device, self.shape)
        return UOp.const(self.dtype, value)

    @staticmethod
    def buffer(device: str, size: int, dtype: DType, uid: int) -> UOp:
        return UOp(Ops.BUFFER, dtype, (UOp(Ops.DEVICE, arg=device),), (uid, size))

    @staticmethod
    def range(end: UOp | int, axis: int, kind: AxisType = AxisType.LOOP) -> UOp:
        return UOp(Ops.RANGE, dtypes.index, (_as_index(end),), (axis, kind))

    @staticmethod
    def variable(name: str, vmin: int, vmax: int, dtype: DType = dtypes.index) -> UOp:
        return UOp(Ops.DEFINE_VAR, dtype, (), (name, vmin, vmax))

    def bind(self, value: int) -> UOp:
        assert self.op is Ops.DEFINE_VAR, "only variables can be bound"
        lo, hi = self.arg[1], self.arg[2]
        if not lo <= value <= hi:
            raise ShapeError(f"value {value} is outside the range [{lo}, {hi}] of variable {self.arg[0]!r}")
        return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, value)))

    def unbind(self) -> tuple[UOp, int]:
        """(the variable, its value) of a bound variable."""
        assert self.op is Ops.BIND, "only bound variables can be unbound"
        return self.src[0], int(self.src[1].arg)

    def alu(self, op: Ops, *src: UOp | int | float | bool) -> UOp:
        srcs = (self,) + tuple(s if isinstance(s, UOp) else self.const_like(s) for s in src)
        out_dtype = dtypes.bool if op in GroupOp.Comparison else srcs[-1].dtype
        return UOp(op, out_dtype, srcs)

    def cast(self, dtype: DType) -> UOp:
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> UOp:
        return UOp(Ops.BITCAST, dtype, (self,))

    def _mop(self, op: Ops, arg: Any) -> UOp:
        return UOp(op, self.dtype, (self,), arg)

    def reshape(self, shape: tuple[sint, ...]) -> UOp:
        return self if self.shape == shape else self._mop(Ops.RESHAPE, tuple(shape))

    def permute(self, order: tuple[int, ...]) -> UOp:
        return self if tuple(order) == tuple(range(len(order))) else self._mop(Ops.PERMUTE, tuple(order))

    def expand(self, shape: tuple[sint, ...]) -> UOp:
        return self if self.shape == shape else self._mop(Ops.EXPAND, tuple(shape))

    def pad(self, arg: tuple[tuple[sint, sint], ...]) -> UOp:
        return self if all(b == 0 and a == 0 for b, a in arg) else self._mop(Ops.PAD, tuple(arg))

    def shrink(self, arg: tuple[tuple[sint, sint], ...]) -> UOp:
        assert self.shape is not None
        if all(s == 0 and e == n for (s, e), n in zip(arg, self.shape)):
            return self
        return self._mop(Ops.SHRINK, tuple(arg))

    def flip(self, axes: tuple[bool, ...]) -> UOp:
        return self if not any(axes) else self._mop(Ops.FLIP, tuple(axes))

    def reduce_axis(self, op: Ops, axes: tuple[int, ...]) -> UOp:
        axes = tuple(sorted(a for a in axes if self.shape is None or self.shape[a] != 1))
        if not axes:
            return self
        return UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, axes))

    # ---- arithmetic sugar (used by symbolic index math and the scheduler) ----
    def _bin(self, op: Ops, x: UOp | int | float, reverse: bool = False) -> UOp:
        other = x if isinstance(x, UOp) else UOp.const(self.dtype, x)
        return UOp(
            op, dtypes.bool if op in GroupOp.Comparison else self.dtype, (other, self) if reverse else (self, other)
        )

    def __add__(self, x: UOp | int | float) -> UOp:
        return self._bin(Ops.ADD, x)

    def __radd__(self, x: UOp | int | float) -> UOp:
        return self._bin(Ops.ADD, x, True)

    def __sub__(self, x: UOp | int | float) -> UOp:
        return self._bin(Ops.ADD, -x if not isinstance(x, UOp) else x.neg())

    def __rsub__(self, x: UOp | int | float) -> UOp:
        return self.neg()._bin(Ops.ADD, x, True)

    def __mul__(self, x: UOp | int | float) -> UOp:
        return self._bin(Ops.MUL, x)

    def __rmul__(self, x: UOp | int | float) -> UOp:
        return self._bin(Ops.MUL, x, True)

    def __floordiv__(self, x: UOp | int) -> UOp:
        return self._bin(Ops.IDIV, x)

    def __mod__(self, x: UOp | int) -> UOp:
        return self._bin(Ops.MOD, x)

    def __neg__(self) -> UOp:
        return self.neg()

    def neg(self) -> UOp:
        return self * -1 if dtypes.is_int(self.dtype) else UOp(Ops.NEG, self.dtype, (self,))

    def lt(self, x: UOp | int | float) -> UOp:
        return self._bin(Ops.CMPLT, x)

    def ge(self, x: UOp | int | float) -> UOp:
        return self.lt(x).logical_not()

    def ne(self, x: UOp | int | float) -> UOp:
        return self._bin(Ops.CMPNE, x)

    def eq(self, x: UOp | int | float) -> UOp:
        return self._bin(Ops.CMPEQ, x)

    def logical_not(self) -> UOp:
        return self._bin(Ops.CMPNE, True)

    def logical_and(self, x: UOp) -> UOp:
        return self._bin(Ops.AND, x)

    def maximum(self, x: UOp | int | float) -> UOp:
        return self._bin(Ops.MAX, x)

    def minimum(self, x: UOp | int | float) -> UOp:
        other = x if isinstance(x, UOp) else self.const_like(x)
        return self.lt(other).where(self, other)

    def where(self, a: UOp | int | float, b: UOp | int | float) -> UOp:
        ua = a if isinstance(a, UOp) else b.const_like(a) if isinstance(b, UOp) else UOp.const(_py_dtype(a, b), a)
        ub = b if isinstance(b, UOp) else ua.const_like(b)
        return UOp(Ops.WHERE, ua.dtype, (self, ua, ub))

    def index(self, idx: UOp, gate: UOp | None = None) -> UOp:
        return UOp(Ops.INDEX, self.dtype, (self, idx) if gate is None else (self, idx, gate))

    def load(self) -> UOp:
        return UOp(Ops.LOAD, self.dtype, (self,))

    def store(self, value: UOp) -> UOp:
        return UOp(Ops.STORE, dtypes.void, (self, value))

    def sink(self, *more: UOp, arg: Any = None) -> UOp:
        return UOp(Ops.SINK, dtypes.void, (self,) + more, arg)

    # ---- tinygrad's kernel-building spellings (custom kernels): xgrad's kernel AST has no END, loops follow ranges
    def end(self, *ranges: UOp) -> UOp:
        """tinygrad closes the loops of `ranges` after a store; here loops are implicit in the ranges: self."""
        return self

    @staticmethod
    def group(*stores: UOp) -> UOp:
        """Several stores as one node (a NOOP); a kernel's SINK takes them as its own sources."""
        return UOp(Ops.NOOP, dtypes.void, stores)

    def simplify(self) -> UOp:
        """The graph with its index arithmetic simplified (symbolic rules)."""
        return ssimplify(self)

    # ---- bounds (symbolic) ----
    @_Cached
    def vmin_vmax(self) -> tuple[int | float, int | float]:
        _fill_sources(self, "vmin_vmax")
        return _bounds.bounds(self)

    @property
    def vmin(self) -> int | float:
        return self.vmin_vmax[0]

    @property
    def vmax(self) -> int | float:
        return self.vmin_vmax[1]

    # ---- printing ----
    def __repr__(self) -> str:
        if _is_size_expr(self):  # sizes in symbolic shapes print short: (2, i=3), ((3*i)[i=3],)
            return _render_size(self)
        return pretty(self)

    def render(self) -> str:
        """A short infix rendering of an index/ALU expression, for messages and tests."""
        return _render_expr(self)

    def iter_src(self) -> Iterator[UOp]:
        return iter(self.src)


sint = int | UOp  # a size: an int, or an index expression of (bound) variables in a symbolic shape


def _fill_sources(u: UOp, attr: str) -> None:
    """Compute the cached property `attr` of every source of `u` that lacks it, sources before users, without
    recursion: a graph thousands of nodes deep (a long chain of `x = x + 1`) must not overflow Python's stack."""
    for s in u.src:  # the common case, every source filled: a plain loop (a generator costs more than the check)
        if attr not in s.__dict__:
            break
    else:
        return
    stack: list[tuple[UOp, bool]] = [(s, False) for s in u.src]
    while stack:
        node, ready = stack.pop()
        if attr in node.__dict__:
            continue
        if ready or all(attr in s.__dict__ for s in node.src):
            getattr(node, attr)  # every source is filled: this computes without going deeper
            continue
        stack.append((node, True))
        stack.extend((s, False) for s in node.src if attr not in s.__dict__)


def _as_index(x: UOp | int) -> UOp:
    return x if isinstance(x, UOp) else UOp.const(dtypes.index, x)


def _py_dtype(*xs: Any) -> DType:
    """Index for Python ints and bools in index math, float32 once a float is involved."""
    return dtypes.float32 if any(isinstance(x, float) for x in xs) else dtypes.index


def _cast_const(dtype: DType, value: Any) -> Any:
    if dtype == dtypes.void:
        return value
    if dtypes.is_bool(dtype):
        return bool(value)
    if dtypes.is_int(dtype):
        if isinstance(value, float) and not math.isfinite(value):
            return 0
        if dtype in (dtypes.index, dtypes.weakint):
            return int(value)
        return int(truncate(dtype)(int(value)))
    return float(value)


# ---- shapes ----
def _sizes(arg: Any) -> tuple[sint, ...]:
    """Sizes as plain ints (a caller's numpy ints become int) or UOps (symbolic sizes)."""
    if type(arg) is tuple and all(type(s) is int for s in arg):
        return arg
    return tuple(s if type(s) is int or isinstance(s, UOp) else int(s) for s in arg)


def _source_shape(u: UOp) -> tuple[sint, ...]:
    ins = u.src[0].shape
    assert ins is not None, f"{u.op} of a shapeless node"
    return ins


def _elementwise_shape(u: UOp) -> tuple[sint, ...] | None:
    """The shape of the shaped sources; a 0-d source among shaped ones is broadcast implicitly (as in tinygrad's
    graphs: `x.alu(Ops.MUL, scalar)`)."""
    found = None
    for s in u.src:
        if (shape := s.shape) is not None:
            if shape:
                return shape
            found = shape
    return found


_CONSTS_KEPT = 4096
_CONSTS: dict[tuple[Any, ...], UOp] = {}  # UOp.const's answers by (dtype, type and value, sign, device, shape)

# op -> its node's shape from its arg and its sources' shapes (ops not here have none). A table: it is looked up for
# every node a Tensor op builds, and reading an Enum member off its class costs ~100 ns on Python 3.11
_SHAPE_RULES: dict[Ops, Callable[[UOp], tuple[sint, ...] | None]] = {
    Ops.BUFFER: lambda u: _sizes((u.arg[1],)),
    Ops.IOTA: lambda u: _sizes((u.arg,)),
    Ops.CONST: lambda u: () if u.src else None,
    Ops.RESHAPE: lambda u: _sizes(u.arg),
    Ops.EXPAND: lambda u: _sizes(u.arg),
    Ops.PERMUTE: lambda u: tuple(_source_shape(u)[i] for i in u.arg),
    Ops.PAD: lambda u: tuple(_size(s + b + a) for s, (b, a) in zip(_source_shape(u), u.arg)),
    Ops.SHRINK: lambda u: tuple(_size(e - b) for b, e in u.arg),
    Ops.FLIP: _source_shape,
    Ops.REDUCE_AXIS: lambda u: tuple(1 if i in u.arg[1] else s for i, s in enumerate(_source_shape(u))),
    Ops.COLLECTIVE: lambda u: _sizes(u.arg.shape),
    **dict.fromkeys((Ops.COPY, Ops.ASSIGN, Ops.CONTIGUOUS, *GroupOp.Identity), lambda u: u.src[0].shape),
    **dict.fromkeys(GroupOp.Elementwise, _elementwise_shape),
}


def _compute_shape(u: UOp) -> tuple[sint, ...] | None:
    rule = _SHAPE_RULES.get(u.op)
    return None if rule is None else rule(u)


def _size(x: sint) -> sint:
    """A computed size: symbolic sizes are simplified, so equal sizes are the same (hash-consed) node, and a size
    that folds to a constant is an int again."""
    if not isinstance(x, UOp):
        return int(x)
    s = ssimplify(x)
    return int(s.arg) if s.op is Ops.CONST else s


# ---- printing ----
_INFIX = {
    Ops.ADD: "+",
    Ops.SUB: "-",
    Ops.MUL: "*",
    Ops.IDIV: "//",
    Ops.MOD: "%",
    Ops.CMPLT: "<",
    Ops.CMPNE: "!=",
    Ops.CMPEQ: "==",
    Ops.AND: "&",
    Ops.OR: "|",
    Ops.XOR: "^",
    Ops.FDIV: "/",
    Ops.SHL: "<<",
    Ops.SHR: ">>",
}


def _is_size_expr(u: UOp) -> bool:
    if u.op in (Ops.BIND, Ops.DEFINE_VAR):
        return True
    if u.dtype != dtypes.index or u.op not in GroupOp.ALU:
        return False
    ops = {x.op for x in u.toposort}
    return bool(ops & {Ops.BIND, Ops.DEFINE_VAR}) and not ops & {Ops.RANGE, Ops.SPECIAL, Ops.LOAD}


def _render_size(u: UOp) -> str:
    """A size expression with the values of its bound variables: `i=3`, `(3*i)[i=3]`."""
    binds = sorted({f"{x.src[0].arg[0]}={x.src[1].arg}" for x in u.toposort if x.op is Ops.BIND})
    if u.op is Ops.BIND:
        return binds[0]
    return _render_expr(u) + (f"[{', '.join(binds)}]" if binds else "")


def _render_expr(u: UOp) -> str:
    if u.op is Ops.CONST:
        return repr(u.arg)
    if u.op is Ops.RANGE:
        return f"r{u.arg[0]}"
    if u.op is Ops.DEFINE_VAR:
        return str(u.arg[0])
    if u.op is Ops.BIND:
        return str(u.src[0].arg[0])
    if u.op is Ops.SPECIAL:
        return str(u.arg[0])
    if u.op in _INFIX and len(u.src) == 2:
        return f"({_render_expr(u.src[0])}{_INFIX[u.op]}{_render_expr(u.src[1])})"
    if u.op is Ops.MAX:
        return f"max({_render_expr(u.src[0])}, {_render_expr(u.src[1])})"
    if u.op is Ops.WHERE:
        return f"({_render_expr(u.src[0])}?{_render_expr(u.src[1])}:{_render_expr(u.src[2])})"
    if u.op is Ops.NEG:
        return f"(-{_render_expr(u.src[0])})"
    return f"{u.op.name.lower()}({', '.join(_render_expr(s) for s in u.src)})"


def pretty(u: UOp) -> str:
    """Readable text of a graph: one line per node, sources referenced by number."""
    lines = []
    ids: dict[UOp, int] = {}
    for i, x in enumerate(u.toposort):
        ids[x] = i
        srcs = ", ".join(f"%{ids[s]}" for s in x.src)
        arg = "" if x.arg is None else f" {x.arg!r}"
        lines.append(f"%{i} = {x.op.name}:{x.dtype.name}({srcs}){arg}")
    return "\n".join(lines) if len(lines) > 1 else lines[0]


def ssimplify(u: UOp) -> UOp:
    """Run the symbolic simplifier (`xgrad.uop.symbolic`) on one expression."""
    return _symbolic.simplify(u)


def smap(fn: Callable[[UOp], UOp], xs: Sequence[UOp]) -> tuple[UOp, ...]:
    return tuple(fn(x) for x in xs)


# The modules below build on this one and this one calls them (value bounds, the symbolic simplifier, the split axis
# of multi-device nodes): a cycle. They are imported last, as modules, so each finds every name of this module
# defined, and this module uses their names only when called. The package `xgrad.uop` imports this module first, so
# it is always the first of them to start loading (symbolic.py imports pattern.py, which imports this module: were
# pattern.py imported first, symbolic.py would meet it partially initialised).
import xgrad.uop.bounds as _bounds  # noqa: E402
import xgrad.uop.sharding as _sharding  # noqa: E402
import xgrad.uop.symbolic as _symbolic  # noqa: E402
