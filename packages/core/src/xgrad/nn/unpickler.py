"""A pickle reader that builds only plain data and never mutates an object it did not create.

In: a file object positioned at a pickle (protocols 0 to 5), a table of the globals it may name, and a persistent-id
callback. Out: the object the pickle describes, with the file positioned just after its STOP opcode.

Python's own unpickler checks only which globals a pickle names (`find_class`). Its other opcodes still act on
whatever object is on the stack: BUILD sets attributes (even on frozen dataclasses, through `__dict__`) or calls
`__setstate__`, SETITEM/APPEND call methods of the target, NEWOBJ/INST/OBJ instantiate classes. An allowed global is a
shared, process-wide object (a dtype, a storage type, a function), so a few bytes of pickle could change it for every
later user. This reader is an interpreter written for loading weights instead:

- every opcode is in an explicit table; anything else (NEWOBJ, INST, OBJ, EXT*, out-of-band buffers) is refused;
- containers are mutated only when this load created them (`_fresh`, kept alive so their ids stay unique);
- REDUCE calls only the callables of the allowed table, BUILD only sets the state of a fresh `OrderedDict`
  (torch stores a state dict's `_metadata` that way) or checks a fresh numpy dtype's state without applying it;
- reads never ask for more bytes than the file has, and the memory REDUCE results take is charged to a `Budget`;
- tuples and frozensets nest at most `MAX_HASHABLE_NESTING` deep (hashing deeper ones overflows the C stack).

Failures raise `UnsafePickleError` (the pickle asked for something not allowed; nothing of it ran) or
`CheckpointError` (the bytes are not a well-formed pickle).
"""

from __future__ import annotations

import codecs
import collections
import pickletools
import reprlib
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from xgrad.nn.fileview import Budget, CheckpointError, UnsafePickleError

_MARK = object()  # stands for a MARK on the stack
# Python hashes nested tuples and frozensets recursively without a recursion check: a pickle that uses a tuple 10**6
# levels deep as a dict key would crash the process. Hashable containers a pickle builds may nest this deep.
MAX_HASHABLE_NESTING = 100
_CHUNK = 1 << 16
_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60


def brief(x: Any) -> str:
    """A short, depth-limited repr of pickle data for error messages (a pickle can nest lists thousands deep)."""
    return _short.repr(x)


class _Reader:
    """Buffered reads from a file object; `finish` seeks the file back to just after what was consumed."""

    def __init__(self, file: Any):
        self._file = file
        self._buf = b""
        self._pos = 0

    def read(self, n: int) -> bytes:
        if n < 0:
            raise CheckpointError(f"pickle: negative length {n}; the file is corrupt")
        if self._pos + n > len(self._buf):
            rest = self._buf[self._pos :]
            more = self._file.read(max(_CHUNK, n - len(rest)))
            self._buf = rest + (more or b"")
            self._pos = 0
            if n > len(self._buf):
                raise CheckpointError("pickle: the data ends in the middle of an opcode; the file is truncated")
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        return out

    def readline(self) -> bytes:
        while (end := self._buf.find(b"\n", self._pos)) < 0:
            more = self._file.read(_CHUNK)
            if not more:
                raise CheckpointError("pickle: the data ends in the middle of a line; the file is truncated")
            self._buf = self._buf[self._pos :] + more
            self._pos = 0
        line = self._buf[self._pos : end]
        self._pos = end + 1
        return line

    def finish(self) -> None:
        if len(self._buf) > self._pos:
            self._file.seek(self._pos - len(self._buf), 1)


class SafeUnpickler:
    """Load one pickle from `file`. `allowed` maps (module, name) to what that global stands for; `makers` are the
    allowed callables whose results are new objects this load may mutate (dict/set/list builders)."""

    def __init__(
        self,
        file: Any,
        what: str,
        allowed: Mapping[tuple[str, str], Any],
        makers: tuple[Callable[..., Any], ...] = (),
        persistent: Callable[[Any], Any] | None = None,
        budget: Budget | None = None,
        refuse_hint: Callable[[str, str], str] | None = None,
    ):
        self._in = _Reader(file)
        self._what = what
        self._allowed = allowed
        self._callables = {id(v) for v in allowed.values() if callable(v) and not isinstance(v, type)}
        self._makers = {id(m) for m in makers}
        self._persistent = persistent
        self._budget = budget if budget is not None else Budget(what, 1 << 62)
        self._hint = refuse_hint
        self._stack: list[Any] = []
        self._memo: dict[int, Any] = {}
        self._fresh: dict[int, Any] = {}
        self._nesting: dict[int, tuple[Any, int]] = {}  # id -> (tuple or frozenset, its nesting depth)

    # ---- helpers ----
    def _new(self, obj: Any) -> Any:
        self._fresh[id(obj)] = obj
        return obj

    def _depth(self, items: Any) -> int:
        """1 + the deepest nesting of the tuples and frozensets among `items` (checked against the limit)."""
        depth = 1
        for x in items:
            if type(x) in (tuple, frozenset) and (known := self._nesting.get(id(x))) is not None and known[0] is x:
                depth = max(depth, known[1] + 1)
        if depth > MAX_HASHABLE_NESTING:
            raise CheckpointError(
                f"{self._what}: the pickle nests tuples more than {MAX_HASHABLE_NESTING} deep; the file is corrupt "
                "or built to crash the reader"
            )
        return depth

    def _hashable(self, obj: Any) -> Any:
        """Record the nesting depth of a tuple or frozenset this load built."""
        if type(obj) in (tuple, frozenset) and obj:
            self._nesting[id(obj)] = (obj, self._depth(obj))
        return obj

    def _is_fresh(self, obj: Any) -> bool:
        return self._fresh.get(id(obj)) is obj

    def _refuse(self, what: str) -> UnsafePickleError:
        return UnsafePickleError(
            f"{self._what}: refused {what}: a weights file may only build tensors and plain containers, and never "
            "change an object that outlives the load. If you trust the file, load it with torch and re-save its "
            "tensors with safe_save"
        )

    def _pop_mark(self) -> list[Any]:
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i] is _MARK:
                items = self._stack[i + 1 :]
                del self._stack[i:]
                return items
        raise CheckpointError(f"{self._what}: pickle has no MARK where one is needed; the file is corrupt")

    def _pop(self) -> Any:
        if not self._stack or self._stack[-1] is _MARK:
            raise CheckpointError(f"{self._what}: pickle stack underflow; the file is corrupt")
        return self._stack.pop()

    def _top(self) -> Any:
        if not self._stack or self._stack[-1] is _MARK:
            raise CheckpointError(f"{self._what}: pickle stack underflow; the file is corrupt")
        return self._stack[-1]

    def _text(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(f"{self._what}: a string in the pickle is not valid UTF-8") from None

    def _global(self, module: Any, name: Any) -> Any:
        if not (isinstance(module, str) and isinstance(name, str)):
            raise CheckpointError(f"{self._what}: a pickle global names {brief(module)}.{brief(name)}, not strings")
        found = self._allowed.get((module, name))
        if found is None:
            hint = self._hint(module, name) if self._hint is not None else "it is not in the allowed list"
            raise UnsafePickleError(f"{self._what}: refused to load the global {module}.{name}: {hint}")
        return found

    def _charge(self, obj: Any) -> None:
        if isinstance(obj, (bytes, bytearray, str, tuple, list, set, frozenset, dict)):
            self._budget.charge(sys.getsizeof(obj), "objects built by the pickle")

    # ---- the interpreter ----
    def load(self) -> Any:
        read = self._in.read
        table = _OPS
        while True:
            op = read(1)
            handler = table.get(op)
            if handler is None:
                name = _NAMES.get(op)
                if name is not None:
                    raise self._refuse(f"the pickle opcode {name}")
                raise CheckpointError(f"{self._what}: unknown pickle opcode {op!r}; the file is corrupt")
            if handler is _op_stop:
                self._in.finish()
                return self._pop()
            handler(self)


# ---- opcode handlers ----
def _op_stop(u: SafeUnpickler) -> None:
    raise AssertionError("STOP is handled by the loop")


def _op_proto(u: SafeUnpickler) -> None:
    if u._in.read(1)[0] > 5:
        raise CheckpointError(f"{u._what}: unsupported pickle protocol; the file is corrupt or from a newer Python")


def _op_frame(u: SafeUnpickler) -> None:
    u._in.read(8)  # frames only group reads; the opcodes inside are read as they come


def _push(value: Any) -> Callable[[SafeUnpickler], None]:
    return lambda u: u._stack.append(value)


def _push_len(fmt: str, convert: Callable[[SafeUnpickler, bytes], Any]) -> Callable[[SafeUnpickler], None]:
    size = struct.calcsize(fmt)

    def handler(u: SafeUnpickler) -> None:
        (n,) = struct.unpack(fmt, u._in.read(size))
        u._stack.append(convert(u, u._in.read(n)))

    return handler


def _push_fixed(fmt: str) -> Callable[[SafeUnpickler], None]:
    size = struct.calcsize(fmt)
    return lambda u: u._stack.append(struct.unpack(fmt, u._in.read(size))[0])


def _op_int(u: SafeUnpickler) -> None:
    line = u._in.readline()
    value: Any = {b"00": False, b"01": True}.get(line)
    u._stack.append(int(line) if value is None else value)


def _op_long(u: SafeUnpickler) -> None:
    u._stack.append(int(u._in.readline().rstrip(b"L")))


def _op_float(u: SafeUnpickler) -> None:
    u._stack.append(float(u._in.readline()))


def _op_string(u: SafeUnpickler) -> None:
    line = u._in.readline().rstrip()
    if len(line) < 2 or line[0] != line[-1] or line[:1] not in (b"'", b'"'):
        raise CheckpointError(f"{u._what}: a STRING opcode is not quoted; the file is corrupt")
    u._stack.append(u._text(codecs.escape_decode(line[1:-1])[0]))


def _op_unicode(u: SafeUnpickler) -> None:
    u._stack.append(u._in.readline().decode("raw-unicode-escape"))


def _op_mark(u: SafeUnpickler) -> None:
    u._stack.append(_MARK)


def _op_pop(u: SafeUnpickler) -> None:
    u._pop()


def _op_pop_mark(u: SafeUnpickler) -> None:
    u._pop_mark()


def _op_dup(u: SafeUnpickler) -> None:
    u._stack.append(u._top())


def _op_tuple(u: SafeUnpickler) -> None:
    u._stack.append(u._hashable(tuple(u._pop_mark())))


def _tuple_n(n: int) -> Callable[[SafeUnpickler], None]:
    def handler(u: SafeUnpickler) -> None:
        items = [u._pop() for _ in range(n)][::-1]
        u._stack.append(u._hashable(tuple(items)))

    return handler


def _op_empty_list(u: SafeUnpickler) -> None:
    u._stack.append(u._new([]))


def _op_list(u: SafeUnpickler) -> None:
    u._stack.append(u._new(u._pop_mark()))


def _op_empty_dict(u: SafeUnpickler) -> None:
    u._stack.append(u._new({}))


def _op_dict(u: SafeUnpickler) -> None:
    items = u._pop_mark()
    if len(items) % 2:
        raise CheckpointError(f"{u._what}: DICT with an odd number of items; the file is corrupt")
    u._stack.append(u._new(dict(zip(items[::2], items[1::2]))))


def _op_empty_set(u: SafeUnpickler) -> None:
    u._stack.append(u._new(set()))


def _op_frozenset(u: SafeUnpickler) -> None:
    items = u._pop_mark()
    u._depth(items)  # before anything is hashed
    u._stack.append(u._hashable(frozenset(items)))


def _target(u: SafeUnpickler, kinds: tuple[type, ...], op: str) -> Any:
    target = u._top()
    if type(target) not in kinds or not u._is_fresh(target):
        raise u._refuse(f"{op} on {type(target).__name__} {brief(target)} (only on a {kinds[0].__name__} it made)")
    return target


def _op_setitem(u: SafeUnpickler) -> None:
    value = u._pop()
    key = u._pop()
    _target(u, (dict, collections.OrderedDict), "SETITEM")[key] = value


def _op_setitems(u: SafeUnpickler) -> None:
    items = u._pop_mark()
    if len(items) % 2:
        raise CheckpointError(f"{u._what}: SETITEMS with an odd number of items; the file is corrupt")
    target = _target(u, (dict, collections.OrderedDict), "SETITEMS")
    for key, value in zip(items[::2], items[1::2]):
        target[key] = value


def _op_append(u: SafeUnpickler) -> None:
    value = u._pop()
    _target(u, (list,), "APPEND").append(value)


def _op_appends(u: SafeUnpickler) -> None:
    items = u._pop_mark()
    _target(u, (list,), "APPENDS").extend(items)


def _op_additems(u: SafeUnpickler) -> None:
    items = u._pop_mark()
    _target(u, (set,), "ADDITEMS").update(items)


def _op_global(u: SafeUnpickler) -> None:
    module = u._text(u._in.readline())
    name = u._text(u._in.readline())
    u._stack.append(u._global(module, name))


def _op_stack_global(u: SafeUnpickler) -> None:
    name = u._pop()
    module = u._pop()
    u._stack.append(u._global(module, name))


def _op_reduce(u: SafeUnpickler) -> None:
    args = u._pop()
    func = u._pop()
    if id(func) not in u._callables:
        raise u._refuse(f"calling {brief(func)}")
    if type(args) is not tuple:
        raise CheckpointError(
            f"{u._what}: REDUCE arguments are {type(args).__name__}, not a tuple; the file is corrupt"
        )
    for a in args:  # a callable may hash its arguments (set, frozenset, OrderedDict keys)
        if isinstance(a, (list, tuple, set, frozenset)):
            u._depth(a)
    result = u._hashable(func(*args))
    u._charge(result)
    u._stack.append(u._new(result) if id(func) in u._makers else result)


def _op_build(u: SafeUnpickler) -> None:
    state = u._pop()
    inst = u._top()
    if type(inst) is collections.OrderedDict and u._is_fresh(inst):
        if not (type(state) is dict and all(type(k) is str for k in state)):
            raise u._refuse(f"BUILD of an OrderedDict with state {brief(state)} (only a dict of attributes)")
        inst.__dict__.update(state)
    elif isinstance(inst, np.dtype) and u._is_fresh(inst):
        _check_numpy_dtype_state(u, inst, state)
    else:
        raise u._refuse(f"BUILD (setting the state) of {type(inst).__name__} {brief(inst)}")


def _check_numpy_dtype_state(u: SafeUnpickler, dt: np.dtype[Any], state: Any) -> None:
    """numpy pickles a plain dtype as `dtype(name)` plus BUILD with (version, byteorder, None, None, None, -1, -1,
    flags). Only that form is accepted, and it is checked rather than applied (numpy's __setstate__ is not called)."""
    plain = type(state) is tuple and len(state) == 8 and state[0] in (3, 4) and state[2:7] == (None, None, None, -1, -1)
    if not plain or state[1] not in ("<", "|", "=", ">"):
        raise u._refuse(f"a numpy dtype with state {brief(state)} (only plain numeric dtypes)")
    if state[1] == ">" and dt.itemsize > 1:
        raise CheckpointError(f"{u._what}: a big-endian numpy value; re-save the file on a little-endian machine")


def _op_persid(u: SafeUnpickler) -> None:
    _persistent(u, u._text(u._in.readline()))


def _op_binpersid(u: SafeUnpickler) -> None:
    _persistent(u, u._pop())


def _persistent(u: SafeUnpickler, pid: Any) -> None:
    if u._persistent is None:
        raise UnsafePickleError(f"{u._what}: unexpected persistent id {brief(pid)}")
    u._stack.append(u._persistent(pid))


def _op_get(u: SafeUnpickler) -> None:
    _get(u, int(u._in.readline()))


def _get_fixed(fmt: str) -> Callable[[SafeUnpickler], None]:
    size = struct.calcsize(fmt)
    return lambda u: _get(u, struct.unpack(fmt, u._in.read(size))[0])


def _get(u: SafeUnpickler, i: int) -> None:
    if i not in u._memo:
        raise CheckpointError(f"{u._what}: pickle memo entry {i} is read before it is written; the file is corrupt")
    u._stack.append(u._memo[i])


def _op_put(u: SafeUnpickler) -> None:
    _put(u, int(u._in.readline()))


def _put_fixed(fmt: str) -> Callable[[SafeUnpickler], None]:
    size = struct.calcsize(fmt)
    return lambda u: _put(u, struct.unpack(fmt, u._in.read(size))[0])


def _op_memoize(u: SafeUnpickler) -> None:
    _put(u, len(u._memo))


def _put(u: SafeUnpickler, i: int) -> None:
    if i < 0:
        raise CheckpointError(f"{u._what}: negative pickle memo index {i}; the file is corrupt")
    u._memo[i] = u._top()


def _long(u: SafeUnpickler, raw: bytes) -> int:
    return int.from_bytes(raw, "little", signed=True)


def _bytes(u: SafeUnpickler, raw: bytes) -> bytes:
    return raw


def _bytearray(u: SafeUnpickler, raw: bytes) -> bytearray:
    return u._new(bytearray(raw))  # type: ignore[no-any-return]


def _str(u: SafeUnpickler, raw: bytes) -> str:
    return u._text(raw)


_HANDLERS: dict[str, Callable[[SafeUnpickler], None]] = {
    "STOP": _op_stop,
    "PROTO": _op_proto,
    "FRAME": _op_frame,
    "MARK": _op_mark,
    "POP": _op_pop,
    "POP_MARK": _op_pop_mark,
    "DUP": _op_dup,
    "NONE": _push(None),
    "NEWTRUE": _push(True),
    "NEWFALSE": _push(False),
    "INT": _op_int,
    "LONG": _op_long,
    "BININT": _push_fixed("<i"),
    "BININT1": _push_fixed("<B"),
    "BININT2": _push_fixed("<H"),
    "LONG1": _push_len("<B", _long),
    "LONG4": _push_len("<i", _long),
    "FLOAT": _op_float,
    "BINFLOAT": _push_fixed(">d"),
    "STRING": _op_string,
    "BINSTRING": _push_len("<i", _str),
    "SHORT_BINSTRING": _push_len("<B", _str),
    "UNICODE": _op_unicode,
    "BINUNICODE": _push_len("<I", _str),
    "SHORT_BINUNICODE": _push_len("<B", _str),
    "BINUNICODE8": _push_len("<Q", _str),
    "BINBYTES": _push_len("<I", _bytes),
    "SHORT_BINBYTES": _push_len("<B", _bytes),
    "BINBYTES8": _push_len("<Q", _bytes),
    "BYTEARRAY8": _push_len("<Q", _bytearray),
    "EMPTY_TUPLE": _push(()),
    "TUPLE": _op_tuple,
    "TUPLE1": _tuple_n(1),
    "TUPLE2": _tuple_n(2),
    "TUPLE3": _tuple_n(3),
    "EMPTY_LIST": _op_empty_list,
    "LIST": _op_list,
    "APPEND": _op_append,
    "APPENDS": _op_appends,
    "EMPTY_DICT": _op_empty_dict,
    "DICT": _op_dict,
    "SETITEM": _op_setitem,
    "SETITEMS": _op_setitems,
    "EMPTY_SET": _op_empty_set,
    "ADDITEMS": _op_additems,
    "FROZENSET": _op_frozenset,
    "GLOBAL": _op_global,
    "STACK_GLOBAL": _op_stack_global,
    "REDUCE": _op_reduce,
    "BUILD": _op_build,
    "PERSID": _op_persid,
    "BINPERSID": _op_binpersid,
    "GET": _op_get,
    "BINGET": _get_fixed("<B"),
    "LONG_BINGET": _get_fixed("<I"),
    "PUT": _op_put,
    "BINPUT": _put_fixed("<B"),
    "LONG_BINPUT": _put_fixed("<I"),
    "MEMOIZE": _op_memoize,
}


def _opcode_names() -> dict[bytes, str]:
    return {op.code.encode("latin1"): op.name for op in pickletools.opcodes}


_NAMES = _opcode_names()
_CODES = {name: code for code, name in _NAMES.items()}
_OPS: dict[bytes, Callable[[SafeUnpickler], None]] = {_CODES[name]: h for name, h in _HANDLERS.items()}
# Left out of the table, so refused by name: INST, OBJ, NEWOBJ, NEWOBJ_EX (they instantiate classes), EXT1/2/4 (the
# copyreg extension registry) and NEXT_BUFFER/READONLY_BUFFER (out-of-band buffers).
