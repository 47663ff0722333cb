"""Load PyTorch checkpoints (`torch.save` files) without torch and without running their pickles.

Formats (by their first bytes):
- zip (torch >= 1.6, the default): `<archive>/data.pkl` is the object pickle; each storage is the member
  `<archive>/data/<key>`, stored uncompressed, so tensors become lazy views of the file.
- legacy raw pickle (`_use_new_zipfile_serialization=False`): magic number, protocol, sys info and object pickles,
  the list of storage keys, then each storage as an 8-byte element count and its bytes.
- legacy tar (torch < 0.4): members `storages`, `tensors` and `pickle`.

Every pickle goes through `RestrictedUnpickler`: it resolves only the names in `ALLOWED_GLOBALS` (containers, torch's
tensor/storage rebuild functions, dtypes and storage types), each mapped to xgrad's own stand-in, never to torch or any
other real module. Anything else (`os.system`, `builtins.eval`, an `nn.Module` class) raises `UnsafePickleError`
before it could be called.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import pickle
import struct
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError, XgradError
from xgrad.helpers import prod
from xgrad.nn.fileview import ByteSource, CheckpointError, TensorIO, UnsafePickleError, byte_source, tensor_from_bytes

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001


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
        raise CheckpointError(f"torch_load: a tensor has dtype {dtype!r}, expected a torch dtype")
    return _rebuild(storage, storage_offset, size, stride, dtype)


def _rebuild_tensor_v1(storage: Storage, storage_offset: int, size: Any, stride: Any) -> Tensor | None:
    return _rebuild(storage, storage_offset, size, stride, storage.dtype)


def _rebuild_parameter(data: Any, requires_grad: Any = False, hooks: Any = None, *rest: Any) -> Any:
    return data


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    if func not in (_rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter) or not isinstance(args, tuple):
        raise UnsafePickleError(f"torch_load: _rebuild_from_type_v2 called with {func!r}; only tensors are supported")
    return func(*args)


def _latin1_encode(text: Any, encoding: Any = "latin1") -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it for bytes objects (latin1 only)."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"torch_load: refused _codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


def _np_dtype(name: Any, align: Any = False, copy: Any = False) -> np.dtype[Any]:
    dt = np.dtype(name) if isinstance(name, str) and name.isalnum() else None
    if dt is None or dt.kind not in "biufc":
        raise UnsafePickleError(f"torch_load: refused numpy dtype {name!r}; only numeric dtypes are allowed")
    return dt


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biufc" or not isinstance(data, bytes):
        raise UnsafePickleError("torch_load: refused a numpy scalar that is not a plain number")
    return np.frombuffer(data, dtype=dtype)[0]


ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "slice"): slice,
    ("__builtin__", "set"): set,
    ("_codecs", "encode"): _latin1_encode,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor_v1,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Size"): tuple,
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


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only `ALLOWED_GLOBALS`; persistent ids go to `persistent`."""

    def __init__(self, file: Any, what: str, persistent: Callable[[Any], Any] | None = None):
        super().__init__(file, encoding="utf-8")
        self._what = what
        self._persistent = persistent

    def find_class(self, module: str, name: str) -> Any:
        if (found := ALLOWED_GLOBALS.get((module, name))) is not None:
            return found
        hint = (
            "torch_load reads only dense tensors, storages and plain containers; "
            "save a state dict (model.state_dict()) rather than a module or custom object"
            if module.split(".")[0] == "torch"
            else "a pickle can run any code on load; it was not run. If you trust the file, load it with torch and "
            "re-save its tensors with safe_save"
        )
        raise UnsafePickleError(f"{self._what}: refused to load the global {module}.{name}: {hint}")

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent is None:
            raise UnsafePickleError(f"{self._what}: unexpected persistent id {pid!r}")
        return self._persistent(pid)


def _load_pickle(file: Any, what: str, persistent: Callable[[Any], Any] | None = None) -> Any:
    try:
        return RestrictedUnpickler(file, what, persistent).load()
    except (UnsafePickleError, CheckpointError, DTypeError):
        raise
    except Exception as e:  # a malformed pickle can fail in many ways; all of them mean the same thing
        raise CheckpointError(f"{what}: cannot read the pickle ({type(e).__name__}: {e})") from None


# ---- tensors from storages ----
def _rebuild(storage: Any, offset: Any, size: Any, stride: Any, dtype: DType) -> Tensor | None:
    """The tensor torch describes as (storage, element offset, size, stride) with elements of `dtype`."""
    if not isinstance(storage, Storage):
        raise CheckpointError(f"torch_load: a tensor's storage is {type(storage).__name__}, expected a storage")
    if not (_ints(size) and _ints(stride) and len(size) == len(stride) and isinstance(offset, int) and offset >= 0):
        raise CheckpointError(f"torch_load: invalid tensor layout size={size!r} stride={stride!r} offset={offset!r}")
    if storage.src is None:  # first pass over a legacy file: storages are not located yet
        return None
    shape, strides = tuple(size), tuple(stride)
    itemsize = dtype.itemsize
    elems = storage.src.nbytes // itemsize
    numel = int(prod(shape))
    if numel == 0:
        return storage.src.typed(0, dtype, shape)
    last = offset + sum((s - 1) * st for s, st in zip(shape, strides))
    if min(strides, default=0) < 0 or last >= elems:
        raise CheckpointError(
            f"torch_load: tensor of shape {shape} strides {strides} at offset {offset} reaches past its storage "
            f"of {elems} {dtype.name} elements; the file is corrupt"
        )
    live = [i for i, s in enumerate(shape) if s != 1]
    if _is_contiguous([shape[i] for i in live], [strides[i] for i in live]):
        return storage.src.typed(offset * itemsize, dtype, shape)
    order = sorted(live, key=lambda i: -strides[i])
    if _is_contiguous([shape[i] for i in order], [strides[i] for i in order]):
        # a permutation of a contiguous block (a transposed weight): view it on the device, permute there
        from xgrad.device import Device

        block = storage.src.typed(offset * itemsize, dtype, tuple(shape[i] for i in order)).to(Device.DEFAULT)
        return block.permute([order.index(i) for i in live]).reshape(shape)
    # any other layout (slices with steps, overlapping strides): gather its elements on the host
    raw = np.frombuffer(storage.src.read(), dtype=np.dtype(f"<u{itemsize}"))
    picked = np.lib.stride_tricks.as_strided(
        raw[offset:], shape=shape, strides=tuple(s * itemsize for s in strides), writeable=False
    )
    return tensor_from_bytes(np.ascontiguousarray(picked).tobytes(), dtype, shape)


def _ints(xs: Any) -> bool:
    return isinstance(xs, (tuple, list)) and all(isinstance(x, int) and x >= 0 for x in xs)


def _is_contiguous(shape: list[int], strides: list[int]) -> bool:
    expect = 1
    for s, st in zip(reversed(shape), reversed(strides)):
        if st != expect:
            return False
        expect *= s
    return True


# ---- archives ----
def _member_source(src: ByteSource, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> ByteSource:
    """The bytes of a zip member: a view of the archive when stored, else the decompressed bytes."""
    if info.flag_bits & 0x1:
        raise CheckpointError(f"{src.name}: zip member {info.filename!r} is encrypted")
    if info.compress_type != zipfile.ZIP_STORED:
        return ByteSource(None, 0, info.file_size, zf.read(info), f"{src.name}:{info.filename}")
    local = bytes(src.read(info.header_offset, 30))
    if local[:4] != b"PK\x03\x04":
        raise CheckpointError(f"{src.name}: zip member {info.filename!r} has no local header; the file is corrupt")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    return dataclasses.replace(src.sub(start, info.file_size), name=f"{src.name}:{info.filename}")


def _zip_members(src: ByteSource) -> tuple[zipfile.ZipFile, dict[str, ByteSource]]:
    try:
        zf = zipfile.ZipFile(TensorIO(src))
    except zipfile.BadZipFile as e:
        raise CheckpointError(f"{src.name}: not a valid zip archive ({e})") from None
    return zf, {info.filename: _member_source(src, zf, info) for info in zf.infolist() if not info.is_dir()}


def _tar_members(src: ByteSource) -> dict[str, ByteSource]:
    """Regular files of an uncompressed tar as views; a compressed tar's members are decompressed into memory."""
    try:
        with tarfile.open(fileobj=TensorIO(src), mode="r:") as tar:
            return {m.name: src.sub(m.offset_data, m.size) for m in tar if m.isreg()}
    except tarfile.ReadError:
        pass
    try:
        with tarfile.open(fileobj=TensorIO(src), mode="r:*") as tar:
            out = {}
            for m in tar:
                if m.isreg() and (f := tar.extractfile(m)) is not None:
                    out[m.name] = ByteSource(None, 0, m.size, f.read(), f"{src.name}:{m.name}")
            return out
    except tarfile.TarError as e:
        raise CheckpointError(f"{src.name}: not a valid tar archive ({e})") from None


def zip_extract(fn: Tensor | str | os.PathLike[str]) -> dict[str, Tensor]:
    """Every file in a zip archive as a uint8 tensor: lazy views of the archive for stored members, the
    decompressed bytes for compressed ones.

    >>> import io, zipfile
    >>> from xgrad import Tensor
    >>> buf = io.BytesIO()
    >>> with zipfile.ZipFile(buf, "w") as z: z.writestr("a.txt", "hi")
    >>> {k: bytes(v.numpy()) for k, v in zip_extract(Tensor(buf.getvalue())).items()}
    {'a.txt': b'hi'}
    """
    _, members = _zip_members(byte_source(fn))
    return {name: m.typed(0, dtypes.uint8, (m.nbytes,)) for name, m in members.items()}


def tar_extract(fn: Tensor | str | os.PathLike[str]) -> dict[str, Tensor]:
    """Every regular file in a tar archive as a uint8 tensor (lazy views for an uncompressed tar).

    >>> import io, tarfile
    >>> from xgrad import Tensor
    >>> buf = io.BytesIO()
    >>> with tarfile.open(fileobj=buf, mode="w") as tar:
    ...     info = tarfile.TarInfo("a.txt"); info.size = 2; tar.addfile(info, io.BytesIO(b"hi"))
    >>> {k: bytes(v.numpy()) for k, v in tar_extract(Tensor(buf.getvalue())).items()}
    {'a.txt': b'hi'}
    """
    return {name: m.typed(0, dtypes.uint8, (m.nbytes,)) for name, m in _tar_members(byte_source(fn)).items()}


# ---- torch_load ----
def torch_load(fn: Tensor | str | os.PathLike[str]) -> Any:
    """Load a file written by `torch.save` (zip, legacy pickle or legacy tar format) without torch: what was saved,
    with every torch tensor as an xgrad Tensor (contiguous tensors are lazy views of the file). Only tensors,
    storages and plain containers are accepted; a pickle that asks for anything else raises `UnsafePickleError`
    without running it.

    >>> import tempfile, os, torch
    >>> fn = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save({"w": torch.arange(6.0).reshape(2, 3).T}, fn)
    >>> torch_load(fn)["w"].tolist()
    [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """
    src = byte_source(fn)
    head = bytes(src.read(0, min(src.nbytes, 262)))
    try:
        if head[:4] == b"PK\x03\x04":
            return _load_zip(src)
        if head[257:262] == b"ustar":
            return _load_tar(src)
        return _load_legacy(src)
    except XgradError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, struct.error) as e:
        raise CheckpointError(f"{src.name}: malformed torch checkpoint ({type(e).__name__}: {e})") from e


def _load_zip(src: ByteSource) -> Any:
    zf, members = _zip_members(src)
    pickles = [n for n in members if n.endswith("data.pkl") and n.count("/") <= 1]
    if len(pickles) != 1:
        raise CheckpointError(f"{src.name}: a zip that is not a torch.save file (it has no single data.pkl)")
    prefix = pickles[0][: -len("data.pkl")]
    if (order := members.get(prefix + "byteorder")) is not None and bytes(order.read()) != b"little":
        raise CheckpointError(f"{src.name}: saved on a big-endian machine; re-save it on a little-endian one")
    storages: dict[str, Storage] = {}

    def persistent(pid: Any) -> Storage:
        _, stype, key, _, _ = _storage_pid(src.name, pid, 5)
        if key not in storages:
            member = members.get(f"{prefix}data/{key}")
            if member is None:
                raise CheckpointError(f"{src.name}: storage {key!r} is missing from the archive")
            storages[key] = Storage(key, stype.dtype, member.nbytes // stype.dtype.itemsize, member)
        return storages[key]

    data = zf.read(pickles[0])
    return _load_pickle(io.BytesIO(data), f"{src.name}:{pickles[0]}", persistent)


def _storage_pid(name: str, pid: Any, n: int) -> tuple[str, StorageType, str, str, int]:
    """Check a persistent id ('storage', storage type, key, location, numel[, view metadata])."""
    if not (isinstance(pid, tuple) and len(pid) == n and pid[0] == "storage" and isinstance(pid[1], StorageType)):
        raise UnsafePickleError(f"{name}: unexpected persistent id {pid!r}; expected a torch storage")
    if not isinstance(pid[4], int) or pid[4] < 0:
        raise CheckpointError(f"{name}: storage {pid[2]!r} has an invalid size {pid[4]!r}")
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
        vkey, voffset, vsize = view
        return storages.setdefault(str(vkey), Storage(str(vkey), stype.dtype, vsize, view_of=(key, voffset)))

    _load_pickle(f, what, scan)
    keys = _load_pickle(f, what)
    if not isinstance(keys, list):
        raise CheckpointError(f"{what}: the legacy storage key list is missing")
    for key in keys:
        st = storages.get(str(key))
        if st is None:
            raise CheckpointError(f"{what}: the file has data for storage {key!r}, which no tensor uses")
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


def _load_tar(src: ByteSource) -> Any:
    members = _tar_members(src)
    for need in ("storages", "tensors", "pickle"):
        if need not in members:
            raise CheckpointError(f"{src.name}: a tar that is not a legacy torch.save file (no {need!r} member)")
    objects: dict[Any, Any] = {}
    f = TensorIO(members["storages"])
    what = f"{src.name}:storages"
    for _ in range(_count(_load_pickle(f, what), what)):
        entry = _load_pickle(f, what)
        if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[2], StorageType)):
            raise CheckpointError(f"{what}: unexpected storage record {entry!r}")
        key, _location, stype = entry
        (numel,) = struct.unpack("<q", _read_exact(f, 8))
        nbytes = numel * stype.dtype.itemsize
        objects[key] = Storage(str(key), stype.dtype, numel, f.source.sub(f.tell(), nbytes))
        f.seek(nbytes, io.SEEK_CUR)
    for target, root_key, offset, numel in _load_pickle(f, what):
        root = objects[root_key]
        size = root.dtype.itemsize
        assert root.src is not None
        objects[target] = Storage(str(target), root.dtype, numel, root.src.sub(offset * size, numel * size))
    f = TensorIO(members["tensors"])
    what = f"{src.name}:tensors"
    for _ in range(_count(_load_pickle(f, what), what)):
        key, storage_id, _tensor_type = _load_pickle(f, what)
        (ndim,) = struct.unpack("<i", _read_exact(f, 4))
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
            raise CheckpointError(f"{src.name}: unknown tensor id {pid!r}") from None

    return _load_pickle(TensorIO(members["pickle"]), f"{src.name}:pickle", persistent)


def _read_exact(f: TensorIO, n: int) -> bytes:
    data = f.read(n)
    if data is None or len(data) != n:
        raise CheckpointError(f"{f.source.name}: the file ends in the middle of a record; it is truncated")
    return data


def _count(n: Any, what: str) -> int:
    if not isinstance(n, int) or n < 0:
        raise CheckpointError(f"{what}: expected a record count, got {n!r}")
    return n
