"""Load PyTorch checkpoints (`torch.save` files) without torch and without running their pickles.

Formats (by their first bytes):
- zip (torch >= 1.6, the default): `<archive>/data.pkl` is the object pickle; each storage is the member
  `<archive>/data/<key>`, stored uncompressed, so tensors become lazy views of the file.
- legacy raw pickle (`_use_new_zipfile_serialization=False`): magic number, protocol, sys info and object pickles,
  the list of storage keys, then each storage as an 8-byte element count and its bytes.
- legacy tar (torch < 0.4): members `storages`, `tensors` and `pickle`.

Every pickle goes through `xgrad.nn.unpickler.SafeUnpickler`: it resolves only the names in `ALLOWED_GLOBALS`
(containers, torch's tensor/storage rebuild functions, dtypes and storage types), each mapped to xgrad's own stand-in,
never to torch or any other real module, and it never mutates an object the load did not create (BUILD on a dtype or
a storage type, SETITEM on a shared object). Anything else (`os.system`, `builtins.eval`, an `nn.Module` class)
raises `UnsafePickleError` before it could run. This accepts what torch's `weights_only=True` loader accepts (plus
numpy scalars and legacy formats) and refuses what it refuses.

Resources: tensors are lazy views of the file; a stride-0 (expanded) tensor stays a lazy `expand` of the elements it
really stores; a zip member is decompressed only when the pickle uses it; what the loader must allocate (decompressed
members, tensors gathered from overlapping strides, objects the pickle builds) is capped at `max_alloc_ratio` times the
file's size, and every failure, memory included, is a `CheckpointError`.
"""

from __future__ import annotations

import collections
import io
import os
import struct
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xgrad.device import Device
from xgrad.dtype import DType, dtypes
from xgrad.errors import XgradError
from xgrad.helpers import prod
from xgrad.nn.archives import MALFORMED, member_source, tar_members, zip_open
from xgrad.nn.fileview import (
    DEFAULT_ALLOC_RATIO,
    Budget,
    ByteSource,
    CheckpointError,
    TensorIO,
    UnsafePickleError,
    byte_source,
    tensor_from_bytes,
)
from xgrad.nn.unpickler import SafeUnpickler, brief
from xgrad.tensor import Tensor

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
MAX_NUMEL = 1 << 62  # more elements than any index type holds
_BUDGET: ContextVar[Budget | None] = ContextVar("xgrad_torch_load_budget", default=None)
_UNLIMITED = 1 << 62


# ---- the stand-ins the restricted unpickler hands out ----
@dataclass(frozen=True)
class StorageType:
    """What `torch.FloatStorage` (etc.) unpickles to: the dtype of the storage's elements."""

    name: str
    dtype: DType


@dataclass(frozen=True)
class TensorType:
    """What `torch.Tensor`, `torch.nn.Parameter` or a legacy `torch.FloatTensor` unpickle to (they are only tags)."""

    name: str


@dataclass
class Storage:
    """A torch storage: `numel` elements of `dtype` at `src` (None while a legacy file is still being scanned)."""

    key: str
    dtype: DType
    numel: int
    src: ByteSource | None = None
    view_of: tuple[str, int] | None = field(default=None)  # legacy storage views: (root key, element offset)


_TORCH_DTYPES: dict[str, DType] = {
    "float64": dtypes.float64,
    "double": dtypes.float64,
    "float32": dtypes.float32,
    "float": dtypes.float32,
    "float16": dtypes.float16,
    "half": dtypes.float16,
    "bfloat16": dtypes.bfloat16,
    "int64": dtypes.int64,
    "long": dtypes.int64,
    "int32": dtypes.int32,
    "int": dtypes.int32,
    "int16": dtypes.int16,
    "short": dtypes.int16,
    "int8": dtypes.int8,
    "uint8": dtypes.uint8,
    "uint16": dtypes.uint16,
    "uint32": dtypes.uint32,
    "uint64": dtypes.uint64,
    "bool": dtypes.bool,
    "float8_e4m3fn": dtypes.fp8e4m3,
    "float8_e5m2": dtypes.fp8e5m2,
    "float8_e4m3fnuz": dtypes.fp8e4m3fnuz,
    "float8_e5m2fnuz": dtypes.fp8e5m2fnuz,
}
_STORAGE_PREFIXES: dict[str, DType] = {
    "Double": dtypes.float64,
    "Float": dtypes.float32,
    "Half": dtypes.float16,
    "BFloat16": dtypes.bfloat16,
    "Long": dtypes.int64,
    "Int": dtypes.int32,
    "Short": dtypes.int16,
    "Char": dtypes.int8,
    "Byte": dtypes.uint8,
    "Bool": dtypes.bool,
}


def _rebuild_tensor_v2(
    storage: Storage, storage_offset: int, size: Any, stride: Any, requires_grad: Any = False, *rest: Any
) -> Tensor | None:
    return _rebuild(storage, storage_offset, size, stride, storage.dtype)


def _rebuild_tensor_v3(
    storage: Storage,
    storage_offset: int,
    size: Any,
    stride: Any,
    requires_grad: Any,
    hooks: Any,
    dtype: Any,
    *rest: Any,
) -> Tensor | None:
    if not isinstance(dtype, DType):
        raise CheckpointError(f"torch_load: a tensor has dtype {brief(dtype)}, expected a torch dtype")
    return _rebuild(storage, storage_offset, size, stride, dtype)


def _rebuild_tensor_v1(storage: Storage, storage_offset: int, size: Any, stride: Any) -> Tensor | None:
    return _rebuild(storage, storage_offset, size, stride, storage.dtype)


def _rebuild_parameter(data: Any, requires_grad: Any = False, hooks: Any = None, *rest: Any) -> Any:
    return data


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    if func not in (_rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter) or not isinstance(args, tuple):
        raise UnsafePickleError(
            f"torch_load: _rebuild_from_type_v2 called with {brief(func)}; only tensors are supported"
        )
    return func(*args)


def _latin1_encode(text: Any, encoding: Any = "latin1") -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it for bytes objects (latin1 only)."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"torch_load: refused _codecs.encode with encoding {brief(encoding)}")
    return text.encode("latin1")


def _np_dtype(name: Any, align: Any = False, copy: Any = False) -> np.dtype[Any]:
    """A new numpy dtype object (never numpy's shared one: the pickle's BUILD that follows refers to it)."""
    dt = np.dtype(name) if isinstance(name, str) and name.isalnum() else None
    if dt is None or dt.kind not in "biufc":
        raise UnsafePickleError(f"torch_load: refused numpy dtype {brief(name)}; only numeric dtypes are allowed")
    return np.dtype(dt, copy=True)


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biufc" or not isinstance(data, bytes):
        raise UnsafePickleError("torch_load: refused a numpy scalar that is not a plain number")
    if len(data) != dtype.itemsize:
        raise CheckpointError(f"torch_load: a numpy {dtype.name} scalar has {len(data)} bytes; the file is corrupt")
    return np.frombuffer(data, dtype=dtype)[0]


# The container types a pickle names, as functions that check their arguments: REDUCE never calls a class, so an
# argument can never be something whose iteration runs code (a tensor) or a shared object.
_ITERABLES = (list, tuple, set, frozenset, dict, collections.OrderedDict)


def _one_iterable(what: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    if len(args) > 1 or (args and type(args[0]) not in _ITERABLES):
        raise UnsafePickleError(f"torch_load: refused {what}{brief(args)}; expected a list, tuple, set or dict")
    return args


def _ordered_dict(*args: Any) -> collections.OrderedDict[Any, Any]:
    return collections.OrderedDict(*_one_iterable("OrderedDict", args))


def _set(*args: Any) -> set[Any]:
    return set(*_one_iterable("set", args))


def _frozenset(*args: Any) -> frozenset[Any]:
    return frozenset(*_one_iterable("frozenset", args))


def _slice(*args: Any) -> slice:
    if not (1 <= len(args) <= 3 and all(a is None or type(a) is int for a in args)):
        raise UnsafePickleError(f"torch_load: refused slice{brief(args)}; expected ints or None")
    return slice(*args)


def _torch_size(*args: Any) -> tuple[int, ...]:
    if not (len(args) <= 1 and all(type(x) is int for x in (args[0] if args else ()))):
        raise CheckpointError(f"torch_load: torch.Size{brief(args)} is not a sequence of ints; the file is corrupt")
    return tuple(args[0]) if args else ()


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("builtins", "set"): _set,
    ("builtins", "frozenset"): _frozenset,
    ("builtins", "slice"): _slice,
    ("__builtin__", "set"): _set,
    ("_codecs", "encode"): _latin1_encode,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor_v1,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Size"): _torch_size,
    ("torch", "Tensor"): TensorType("Tensor"),
    ("torch.nn.parameter", "Parameter"): TensorType("Parameter"),
    ("torch", "UntypedStorage"): StorageType("UntypedStorage", dtypes.uint8),
    ("torch.storage", "UntypedStorage"): StorageType("UntypedStorage", dtypes.uint8),
    ("numpy", "dtype"): _np_dtype,
    ("numpy.core.multiarray", "scalar"): _np_scalar,
    ("numpy._core.multiarray", "scalar"): _np_scalar,
    **{("torch", name): dt for name, dt in _TORCH_DTYPES.items()},
    **{("torch", f"{p}Storage"): StorageType(f"{p}Storage", dt) for p, dt in _STORAGE_PREFIXES.items()},
    **{("torch", f"{p}Tensor"): TensorType(f"{p}Tensor") for p in _STORAGE_PREFIXES},
}


_MAKERS = (_ordered_dict, _set, _np_dtype)  # their results are new objects the pickle may fill or BUILD


def _refuse_hint(module: str, name: str) -> str:
    if module.split(".")[0] == "torch":
        return (
            "torch_load reads only dense tensors, storages and plain containers; "
            "save a state dict (model.state_dict()) rather than a module or custom object"
        )
    return (
        "a pickle can run any code on load; it was not run. If you trust the file, load it with torch and "
        "re-save its tensors with safe_save"
    )


def _budget() -> Budget:
    return _BUDGET.get() or Budget("torch_load", _UNLIMITED)


def _load_pickle(file: Any, what: str, persistent: Callable[[Any], Any] | None = None) -> Any:
    try:
        return SafeUnpickler(file, what, ALLOWED_GLOBALS, _MAKERS, persistent, _budget(), _refuse_hint).load()
    except (XgradError, AssertionError):
        raise
    except Exception as e:  # a malformed pickle can fail in many ways; all of them mean the same thing
        raise CheckpointError(f"{what}: cannot read the pickle ({type(e).__name__}: {brief(str(e))})") from None


# ---- tensors from storages ----
def _rebuild(storage: Any, offset: Any, size: Any, stride: Any, dtype: DType) -> Tensor | None:
    """The tensor torch describes as (storage, element offset, size, stride) with elements of `dtype`."""
    if not isinstance(storage, Storage):
        raise CheckpointError(f"torch_load: a tensor's storage is {type(storage).__name__}, expected a storage")
    if not (_ints(size) and _ints(stride) and len(size) == len(stride) and type(offset) is int and offset >= 0):
        raise CheckpointError(
            f"torch_load: invalid tensor layout size={brief(size)} stride={brief(stride)} offset={brief(offset)}"
        )
    if storage.src is None:  # first pass over a legacy file: storages are not located yet
        return None
    shape, strides = tuple(size), tuple(stride)
    numel = int(prod(shape))
    if numel >= MAX_NUMEL:
        raise CheckpointError(f"torch_load: a tensor of shape {brief(shape)} has more elements than xgrad can index")
    if numel == 0:
        return storage.src.typed(0, dtype, shape)
    # a stride-0 dimension (torch's expand) repeats the same elements: read them once, broadcast them lazily
    stored = tuple(1 if st == 0 else s for s, st in zip(shape, strides))
    elems = storage.src.nbytes // dtype.itemsize
    last = offset + sum((s - 1) * st for s, st in zip(stored, strides))
    if last >= elems:
        raise CheckpointError(
            f"torch_load: tensor of shape {brief(shape)} strides {brief(strides)} at offset {offset} reaches past its "
            f"storage of {elems} {dtype.name} elements; the file is corrupt"
        )
    if storage.src.host is not None:  # a decompressed member: each tensor over it is a copy, however often named
        _budget().charge(int(prod(stored)) * dtype.itemsize, f"a {dtype.name} tensor of shape {brief(stored)}")
    t = _read_layout(storage.src, offset, stored, strides, dtype)
    if stored == shape:
        return t
    # DISK cannot compute: the stored elements are copied, the broadcast stays lazy
    return t.to(Device.DEFAULT).expand(shape)


def _read_layout(
    src: ByteSource, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: DType
) -> Tensor:
    """The elements of a strided layout without stride-0 dimensions: a view of the file when they are a contiguous
    block (maybe permuted), else gathered on the host (charged to the load's memory budget)."""
    itemsize = dtype.itemsize
    live = [i for i, s in enumerate(shape) if s != 1]
    if _is_contiguous([shape[i] for i in live], [strides[i] for i in live]):
        return src.typed(offset * itemsize, dtype, shape)
    order = sorted(live, key=lambda i: -strides[i])
    if _is_contiguous([shape[i] for i in order], [strides[i] for i in order]):
        # a permutation of a contiguous block (a transposed weight): view it on the device, permute there

        block = src.typed(offset * itemsize, dtype, tuple(shape[i] for i in order)).to(Device.DEFAULT)
        return block.permute([order.index(i) for i in live]).reshape(shape)
    # any other layout (slices with steps, overlapping strides): gather its elements on the host
    _budget().charge(int(prod(shape)) * itemsize, f"a strided {dtype.name} tensor of shape {shape}")
    raw = np.frombuffer(src.read(), dtype=np.dtype(f"<u{itemsize}"))
    picked = np.lib.stride_tricks.as_strided(
        raw[offset:], shape=shape, strides=tuple(s * itemsize for s in strides), writeable=False
    )
    return tensor_from_bytes(np.ascontiguousarray(picked).reshape(-1).data, dtype, shape)


def _ints(xs: Any) -> bool:
    return isinstance(xs, (tuple, list)) and all(type(x) is int and x >= 0 for x in xs)


def _is_contiguous(shape: list[int], strides: list[int]) -> bool:
    expect = 1
    for s, st in zip(reversed(shape), reversed(strides)):
        if st != expect:
            return False
        expect *= s
    return True


# ---- torch_load ----
def torch_load(fn: Tensor | str | os.PathLike[str], *, max_alloc_ratio: float = DEFAULT_ALLOC_RATIO) -> Any:
    """Load a file written by `torch.save` (zip, legacy pickle or legacy tar format) without torch: what was saved,
    with every torch tensor as an xgrad Tensor (contiguous and expanded tensors are lazy views of the file). Only
    tensors, storages and plain containers are accepted, and nothing in the file can change an object that outlives
    the load; a pickle that asks for anything else raises `UnsafePickleError` without running it. Any other problem
    with the file raises `CheckpointError`, including a file that would make the loader allocate more than
    `max_alloc_ratio` times its size (plus 8 MiB) of memory: decompressed zip members, tensors gathered from
    overlapping strides. Raise it for a trusted, highly compressed file.

    >>> import tempfile, os, torch
    >>> fn = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save({"w": torch.arange(6.0).reshape(2, 3).T}, fn)
    >>> torch_load(fn)["w"].tolist()
    [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """
    src = byte_source(fn)
    budget = Budget.for_file(src.name, src.nbytes, max_alloc_ratio)
    token = _BUDGET.set(budget)
    try:
        head = bytes(src.read(0, min(src.nbytes, 262)))
        if head[:4] == b"PK\x03\x04":
            return _load_zip(src, budget)
        if head[257:262] == b"ustar":
            return _load_tar(src, budget)
        return _load_legacy(src)
    except (XgradError, AssertionError):
        raise
    except MALFORMED as e:
        raise CheckpointError(f"{src.name}: malformed torch checkpoint ({type(e).__name__}: {brief(str(e))})") from None
    finally:
        _BUDGET.reset(token)


def _load_zip(src: ByteSource, budget: Budget) -> Any:
    zf, infos = zip_open(src)
    pickles = [n for n in infos if n.endswith("data.pkl") and n.count("/") <= 1]
    if len(pickles) != 1:
        raise CheckpointError(f"{src.name}: a zip that is not a torch.save file (it has no single data.pkl)")
    prefix = pickles[0][: -len("data.pkl")]
    if (order := infos.get(prefix + "byteorder")) is not None:
        if bytes(member_source(src, zf, order, budget).read()) != b"little":
            raise CheckpointError(f"{src.name}: saved on a big-endian machine; re-save it on a little-endian one")
    storages: dict[str, Storage] = {}

    def persistent(pid: Any) -> Storage:  # a storage's member is located (or decompressed) when a tensor uses it
        _, stype, key, _, _ = _storage_pid(src.name, pid, 5)
        if key not in storages:
            info = infos.get(f"{prefix}data/{key}")
            if info is None:
                raise CheckpointError(f"{src.name}: storage {brief(key)} is missing from the archive")
            member = member_source(src, zf, info, budget)
            storages[key] = Storage(key, stype.dtype, member.nbytes // stype.dtype.itemsize, member)
        return storages[key]

    data = bytes(member_source(src, zf, infos[pickles[0]], budget).read())
    return _load_pickle(io.BytesIO(data), f"{src.name}:{pickles[0]}", persistent)


def _storage_pid(name: str, pid: Any, n: int) -> tuple[str, StorageType, str, str, int]:
    """Check a persistent id ('storage', storage type, key, location, numel[, view metadata])."""
    if not (isinstance(pid, tuple) and len(pid) == n and pid[0] == "storage" and isinstance(pid[1], StorageType)):
        raise UnsafePickleError(f"{name}: unexpected persistent id {brief(pid)}; expected a torch storage")
    if type(pid[4]) is not int or pid[4] < 0 or not isinstance(pid[2], (str, int)):
        raise CheckpointError(f"{name}: storage {brief(pid[2])} has an invalid size {brief(pid[4])}")
    return pid[0], pid[1], str(pid[2]), str(pid[3]), pid[4]


def _load_legacy(src: ByteSource) -> Any:
    f = TensorIO(src)
    what = src.name
    try:
        magic = _load_pickle(f, what)
    except UnsafePickleError:
        raise
    except CheckpointError:
        magic = None
    if magic != LEGACY_MAGIC:
        raise CheckpointError(f"{what}: not a torch.save file (no zip, tar or legacy magic number)")
    if _load_pickle(f, what) != LEGACY_PROTOCOL:
        raise CheckpointError(f"{what}: unsupported legacy torch protocol version")
    sys_info = _load_pickle(f, what)
    if not (isinstance(sys_info, dict) and sys_info.get("little_endian", False)):
        raise CheckpointError(f"{what}: saved on a big-endian machine; re-save it on a little-endian one")
    start = f.tell()
    storages: dict[str, Storage] = {}

    def scan(pid: Any) -> Storage:  # pass 1: note each storage's dtype and size
        _, stype, key, _location, numel = _storage_pid(what, pid[:5] if isinstance(pid, tuple) else pid, 5)
        storages.setdefault(key, Storage(key, stype.dtype, numel))
        view = pid[5] if len(pid) > 5 else None
        if view is None:
            return storages[key]
        if not (type(view) is tuple and len(view) == 3 and _ints(view[1:])):
            raise CheckpointError(f"{what}: invalid storage view {brief(view)}; the file is corrupt")
        vkey, voffset, vsize = view
        return storages.setdefault(str(vkey), Storage(str(vkey), stype.dtype, vsize, view_of=(key, voffset)))

    _load_pickle(f, what, scan)
    keys = _load_pickle(f, what)
    if not isinstance(keys, list):
        raise CheckpointError(f"{what}: the legacy storage key list is missing")
    for key in keys:
        st = storages.get(str(key))
        if st is None:
            raise CheckpointError(f"{what}: the file has data for storage {brief(key)}, which no tensor uses")
        (numel,) = struct.unpack("<q", _read_exact(f, 8))
        nbytes = numel * st.dtype.itemsize
        st.src = src.sub(f.tell(), nbytes)
        f.seek(nbytes, io.SEEK_CUR)
    for st in storages.values():
        if st.view_of is not None:
            root = storages[st.view_of[0]]
            if root.src is None:
                raise CheckpointError(f"{what}: storage {root.key!r} has no data in the file")
            st.src = root.src.sub(st.view_of[1] * st.dtype.itemsize, st.numel * st.dtype.itemsize)

    def located(pid: Any) -> Storage:  # pass 2: the same ids, now with their bytes
        key = str(pid[5][0]) if len(pid) > 5 and pid[5] is not None else str(pid[2])
        if storages[key].src is None:
            raise CheckpointError(f"{what}: storage {key!r} has no data in the file")
        return storages[key]

    f.seek(start)
    return _load_pickle(f, what, located)


def _load_tar(src: ByteSource, budget: Budget) -> Any:
    members = tar_members(src, budget, compressed=False)  # torch wrote plain tars; never inflate a lookalike
    for need in ("storages", "tensors", "pickle"):
        if need not in members:
            raise CheckpointError(f"{src.name}: a tar that is not a legacy torch.save file (no {need!r} member)")
    objects: dict[Any, Any] = {}
    f = TensorIO(members["storages"])
    what = f"{src.name}:storages"
    for _ in range(_count(_load_pickle(f, what), what)):
        entry = _load_pickle(f, what)
        if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[2], StorageType)):
            raise CheckpointError(f"{what}: unexpected storage record {brief(entry)}")
        key, _location, stype = entry
        (numel,) = struct.unpack("<q", _read_exact(f, 8))
        nbytes = numel * stype.dtype.itemsize
        objects[key] = Storage(str(key), stype.dtype, numel, f.source.sub(f.tell(), nbytes))
        f.seek(nbytes, io.SEEK_CUR)
    for target, root_key, offset, numel in _load_pickle(f, what):
        root = objects.get(root_key)
        if not (isinstance(root, Storage) and root.src is not None and _ints((offset, numel))):
            raise CheckpointError(f"{what}: invalid storage view of {brief(root_key)}; the file is corrupt")
        item = root.dtype.itemsize
        objects[target] = Storage(str(target), root.dtype, numel, root.src.sub(offset * item, numel * item))
    f = TensorIO(members["tensors"])
    what = f"{src.name}:tensors"
    for _ in range(_count(_load_pickle(f, what), what)):
        key, storage_id, _tensor_type = _load_pickle(f, what)
        (ndim,) = struct.unpack("<i", _read_exact(f, 4))
        if not 0 <= ndim <= 64:
            raise CheckpointError(f"{what}: a tensor record has {ndim} dimensions; the file is corrupt")
        _read_exact(f, 4)  # the old writer stored ndim in 8 bytes
        size = struct.unpack(f"<{ndim}q", _read_exact(f, 8 * ndim))
        stride = struct.unpack(f"<{ndim}q", _read_exact(f, 8 * ndim))
        (offset,) = struct.unpack("<q", _read_exact(f, 8))
        storage = objects.get(storage_id)
        objects[key] = _rebuild(
            storage, offset, size, stride, storage.dtype if isinstance(storage, Storage) else dtypes.uint8
        )

    def persistent(pid: Any) -> Any:
        if isinstance(pid, tuple):  # ('module', class, source file, source): only with a whole pickled module
            raise UnsafePickleError(f"{src.name}: the file holds a pickled module, not only tensors")
        try:
            return objects[int(pid)]
        except (KeyError, ValueError):
            raise CheckpointError(f"{src.name}: unknown tensor id {brief(pid)}") from None

    return _load_pickle(TensorIO(members["pickle"]), f"{src.name}:pickle", persistent)


def _read_exact(f: TensorIO, n: int) -> bytes:
    data = f.read(n)
    if data is None or len(data) != n:
        raise CheckpointError(f"{f.source.name}: the file ends in the middle of a record; it is truncated")
    return data


def _count(n: Any, what: str) -> int:
    if not isinstance(n, int) or n < 0:
        raise CheckpointError(f"{what}: expected a record count, got {brief(n)}")
    return n
