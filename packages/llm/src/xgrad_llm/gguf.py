"""The GGUF container (llama.cpp's model file): a path in, metadata and lazy tensors out.

Layout of a file (every number little-endian): magic `GGUF`, version (uint32; 2 and 3 are read), tensor count and
metadata count (uint64), the metadata as (key, value type, value) records, one info per tensor (name, dims, GGML
type, offset), padding to `general.alignment` (default 32), then the tensor data. Dims are stored innermost first;
`TensorInfo.shape` reverses them into numpy/xgrad order, so the quantisation blocks run along the last axis.
A model split by `gguf-split` is a run of complete GGUF files named `<stem>-00001-of-0000N.gguf`; opening any one of
them reads them all, metadata from the first.

The header is parsed into Python values; tensors are never read here: `GGUFFile.raw(name)` is a lazy uint8 slice of
the file on xgrad's DISK device (an mmap), and `GGUFFile.tensor(name)` dequantises it with the Tensor ops of
`quants.py`. Every count and length is checked against the bytes left in the file before anything is allocated,
so a malformed file raises `GGUFError` (naming the field and its byte offset) instead of crashing, hanging or
allocating what a corrupt length asks for.
"""

from __future__ import annotations

import os
import pathlib
import re
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from xgrad import Device, Tensor
from xgrad.dtype import dtypes
from xgrad.errors import XgradError
from xgrad.helpers import is_pow2, prod, round_up
from xgrad.nn.state import TensorIO
from xgrad_llm.quants import BLOCK_SIZES, GGMLType, dequantize, type_name

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 8  # arrays of arrays deeper than this are refused (llama.cpp writes none)
_CHUNK = 1 << 20  # header bytes read at a time
_U64 = struct.Struct("<Q")


class GGUFError(XgradError, ValueError):
    """A GGUF file is malformed, truncated, or uses a feature this reader does not support. `field` and `offset` say
    which field of which file, at which byte, is wrong."""

    def __init__(self, path: str, field: str, offset: int, problem: str) -> None:
        super().__init__(f"{path}: {field} at byte {offset}: {problem}")
        self.path = path
        self.field = field
        self.offset = offset


class ValueType(IntEnum):
    """The type ids of GGUF metadata values."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_SCALARS: dict[ValueType, str] = {  # numpy little-endian dtype of each fixed-size value type
    ValueType.UINT8: "<u1",
    ValueType.INT8: "<i1",
    ValueType.UINT16: "<u2",
    ValueType.INT16: "<i2",
    ValueType.UINT32: "<u4",
    ValueType.INT32: "<i4",
    ValueType.FLOAT32: "<f4",
    ValueType.BOOL: "<u1",
    ValueType.UINT64: "<u8",
    ValueType.INT64: "<i8",
    ValueType.FLOAT64: "<f8",
}
# the fewest bytes a value of each type takes: how many of them can fit in what is left of a file
_MIN_SIZE: dict[ValueType, int] = {
    **{t: np.dtype(f).itemsize for t, f in _SCALARS.items()},
    ValueType.STRING: 8,
    ValueType.ARRAY: 12,
}
_MIN_KV = 8 + 4 + 1  # key length, value type, a 1-byte value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8  # name length, n_dims, type, offset


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: `shape` in row-major order (GGUF's dims reversed), its GGML `type` id, and its bytes
    [offset, offset + nbytes) of file `part` (0 unless the model is split)."""

    name: str
    shape: tuple[int, ...]
    type: int
    offset: int
    nbytes: int
    part: int = 0


@dataclass
class _Header:
    version: int
    metadata: dict[str, Any]
    types: dict[str, tuple[ValueType, ...]]
    tensors: dict[str, TensorInfo]
    alignment: int
    data_offset: int


class _Cursor:
    """Reads little-endian fields from a byte source of known size, a chunk at a time; every read is bounds-checked."""

    def __init__(self, io: TensorIO, size: int, path: str) -> None:
        self.io, self.size, self.path = io, size, path
        self.pos = 0
        self.buf = b""
        self.buf_start = 0

    def fail(self, field: str, problem: str, offset: int | None = None) -> GGUFError:
        return GGUFError(self.path, field, self.pos if offset is None else offset, problem)

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, field: str) -> int:
        """Make bytes [pos, pos+n) readable; return their index in `buf`."""
        if n > self.left():
            raise self.fail(
                field, f"needs {n} bytes but the file ends at byte {self.size}; the file is truncated or corrupt"
            )
        at = self.pos - self.buf_start
        if at < 0 or at + n > len(self.buf):
            self.io.seek(self.pos)
            self.buf = self.io.read(min(max(n, _CHUNK), self.left())) or b""
            self.buf_start, at = self.pos, 0
            if len(self.buf) < n:
                raise self.fail(
                    field, f"could read only {len(self.buf)} of its {n} bytes; the file changed or is unreadable"
                )
        return at

    def take(self, n: int, field: str) -> bytes:
        at = self.need(n, field)
        self.pos += n
        return self.buf[at : at + n]

    def unpack(self, fmt: str, field: str) -> Any:
        n = struct.calcsize(fmt)
        at = self.need(n, field)
        self.pos += n
        return struct.unpack_from(fmt, self.buf, at)[0]

    def count(self, field: str, min_size: int) -> int:
        """A uint64 count of items of at least `min_size` bytes each, refused if they cannot fit in the file."""
        start = self.pos
        n = int(self.unpack("<Q", field))
        if n * min_size > self.left():
            raise self.fail(
                field,
                f"{n} items of at least {min_size} bytes cannot fit in the {self.left()} bytes left of the file",
                start,
            )
        return n

    def string(self, field: str) -> str:
        start = self.pos
        n = int(self.unpack("<Q", field))
        if n > self.left():
            raise self.fail(field, f"string length {n} is past the end of the file ({self.size} bytes)", start)
        # surrogateescape: a vocab may hold bytes that are not UTF-8; .encode("utf-8", "surrogateescape") restores them
        return self.take(n, field).decode("utf-8", "surrogateescape")

    def value_type(self, field: str) -> ValueType:
        start = self.pos
        t = int(self.unpack("<I", field))
        if t not in ValueType._value2member_map_:
            raise self.fail(field, f"unknown metadata value type {t} (known: 0..{max(ValueType)})", start)
        return ValueType(t)

    def value(self, t: ValueType, field: str, depth: int = 0) -> Any:
        if t is ValueType.STRING:
            return self.string(field)
        if t is ValueType.ARRAY:
            return self.array(field, depth)
        (v,) = self.scalars(t, 1, field)
        return v

    def scalars(self, t: ValueType, n: int, field: str) -> list[Any]:
        dt = np.dtype(_SCALARS[t])
        values = np.frombuffer(self.take(n * dt.itemsize, field), dt)
        out: list[Any] = (values != 0).tolist() if t is ValueType.BOOL else values.tolist()
        return out

    def array(self, field: str, depth: int) -> list[Any]:
        return self.array_of(self.value_type(f"{field} (array element type)"), field, depth)

    def array_of(self, t: ValueType, field: str, depth: int) -> list[Any]:
        """The rest of an array whose element type `t` was just read: its length, then its elements."""
        if depth >= MAX_NESTING:
            raise self.fail(field, f"arrays nested more than {MAX_NESTING} deep")
        n = self.count(f"{field} (array length)", _MIN_SIZE[t])
        if t in _SCALARS:
            return self.scalars(t, n, field)
        if t is ValueType.STRING:
            return self.strings(n, field)
        return [self.array(f"{field}[{i}]", depth + 1) for i in range(n)]

    def strings(self, n: int, field: str) -> list[str]:
        """n strings: the ones wholly inside the buffer read directly (a vocab holds ~10^5), the rest by `string`."""
        out: list[str] = []
        for i in range(n):
            at = self.pos - self.buf_start
            if 0 <= at and at + 8 <= len(self.buf):
                end = at + 8 + _U64.unpack_from(self.buf, at)[0]
                if end <= len(self.buf):  # the buffer never reaches past the end of the file
                    out.append(self.buf[at + 8 : end].decode("utf-8", "surrogateescape"))
                    self.pos += end - at
                    continue
            out.append(self.string(f"{field}[{i}]"))
        return out


def _read_header(io: TensorIO, size: int, path: str) -> _Header:
    """Parse one GGUF file's header: everything but the tensor data."""
    c = _Cursor(io, size, path)
    version, n_tensors, n_kv = _read_preamble(c)
    metadata, types, value_at = _read_metadata(c, n_kv)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in metadata and (
        types["general.alignment"] != (ValueType.UINT32,) or not (alignment > 0 and is_pow2(alignment))
    ):
        got = f"{types['general.alignment'][0].name} {alignment!r}"
        raise c.fail(
            "metadata 'general.alignment'", f"must be a uint32 power of two, got {got}", value_at["general.alignment"]
        )
    infos = [_read_tensor_info(c, i, alignment) for i in range(n_tensors)]
    data_offset = round_up(c.pos, alignment)
    return _Header(version, metadata, types, _place_tensors(c, infos, data_offset), alignment, data_offset)


def _read_preamble(c: _Cursor) -> tuple[int, int, int]:
    """(version, tensor count, metadata count), after checking the magic and version."""
    magic = c.take(4, "magic") if c.size >= 4 else b""
    if magic != MAGIC:
        raise c.fail("magic", f"not a GGUF file: it starts with {magic!r}, not {MAGIC!r}", 0)
    version = int(c.unpack("<I", "version"))
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        why = (
            "a big-endian GGUF file, which this reader does not support; convert it on a little-endian machine"
            if swapped in (1, *VERSIONS)
            else "GGUF v1 (32-bit counts) is no longer supported; re-convert the model with a current llama.cpp"
            if version == 1
            else f"unsupported GGUF version {version} (this reader knows {', '.join(map(str, VERSIONS))})"
        )
        raise c.fail("version", why, 4)
    n_tensors = int(c.unpack("<Q", "tensor count"))
    n_kv = c.count("metadata count", _MIN_KV)
    if n_tensors * _MIN_TENSOR_INFO > c.left():
        raise c.fail("tensor count", f"{n_tensors} tensor infos cannot fit in the {c.left()} bytes left", 8)
    return version, n_tensors, n_kv


def _read_metadata(c: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, tuple[ValueType, ...]], dict[str, int]]:
    """(values, value types, byte where each value starts) of the n_kv metadata records."""
    metadata: dict[str, Any] = {}
    types: dict[str, tuple[ValueType, ...]] = {}
    value_at: dict[str, int] = {}
    for i in range(n_kv):
        start = c.pos
        key = c.string(f"metadata key #{i}")
        if key in metadata:
            raise c.fail(f"metadata key {key!r}", "is given twice", start)
        t = c.value_type(f"metadata {key!r} type")
        value_at[key] = c.pos
        if t is ValueType.ARRAY:
            elem = c.value_type(f"metadata {key!r} (array element type)")
            metadata[key] = c.array_of(elem, f"metadata {key!r}", 0)
            types[key] = (t, elem)
        else:
            metadata[key] = c.value(t, f"metadata {key!r}")
            types[key] = (t,)
    return metadata, types, value_at


def _read_tensor_info(c: _Cursor, i: int, alignment: int) -> TensorInfo:
    """The i-th tensor info, its offset still relative to the data section."""
    name = c.string(f"tensor #{i} name")
    n_dims = int(c.unpack("<I", f"tensor {name!r} n_dims"))
    if n_dims > MAX_DIMS:
        raise c.fail(f"tensor {name!r} n_dims", f"{n_dims} dims (GGML tensors have at most {MAX_DIMS})", c.pos - 4)
    dims_at = c.pos
    dims = tuple(int(d) for d in np.frombuffer(c.take(8 * n_dims, f"tensor {name!r} dims"), "<u8").tolist())
    if any(d >= 1 << 63 for d in dims):
        raise c.fail(f"tensor {name!r} dims", f"dims {dims} do not fit in int64", dims_at)
    type_at = c.pos
    type_id = int(c.unpack("<I", f"tensor {name!r} type"))
    if type_id not in BLOCK_SIZES:
        raise c.fail(f"tensor {name!r} type", f"unknown GGML type id {type_id}", type_at)
    block_size, type_size = BLOCK_SIZES[GGMLType(type_id)]
    if (dims[0] if dims else 1) % block_size:  # no dims: a scalar, one element
        why = f"the innermost dim of {dims} is not a multiple of {type_name(type_id)}'s block size {block_size}"
        raise c.fail(f"tensor {name!r} dims", why, dims_at)
    nbytes = int(prod(dims)) // block_size * type_size
    if nbytes > c.size:
        why = f"dims {dims} of {type_name(type_id)} need {nbytes} bytes, more than the whole file ({c.size})"
        raise c.fail(f"tensor {name!r} dims", why, dims_at)
    offset_at = c.pos
    offset = int(c.unpack("<Q", f"tensor {name!r} offset"))
    if offset % alignment:
        why = f"{offset} is not a multiple of the alignment {alignment}"
        raise c.fail(f"tensor {name!r} offset", why, offset_at)
    return TensorInfo(name, tuple(reversed(dims)), type_id, offset, nbytes)


def _place_tensors(c: _Cursor, infos: list[TensorInfo], data_offset: int) -> dict[str, TensorInfo]:
    """The tensors by name, at absolute offsets, each checked to lie inside the file and apart from the others."""
    tensors: dict[str, TensorInfo] = {}
    for info in infos:
        start = data_offset + info.offset
        if info.name in tensors:
            raise c.fail(f"tensor {info.name!r}", "is named twice", data_offset)
        if start + info.nbytes > c.size:
            why = f"{info.nbytes} bytes from byte {start} end past the end of the file ({c.size} bytes); truncated"
            raise c.fail(f"tensor {info.name!r} data", why, start)
        tensors[info.name] = TensorInfo(info.name, info.shape, info.type, start, info.nbytes)
    by_offset = sorted(tensors.values(), key=lambda ti: ti.offset)
    for prev, cur in zip(by_offset, by_offset[1:]):
        if cur.offset < prev.offset + prev.nbytes:
            why = f"overlaps tensor {prev.name!r} (bytes [{prev.offset}, {prev.offset + prev.nbytes}))"
            raise c.fail(f"tensor {cur.name!r} data", why, cur.offset)
    return tensors


_SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_paths(path: str | os.PathLike[str]) -> list[pathlib.Path]:
    """Every part of the split model that `path` belongs to (`<stem>-0000k-of-0000N.gguf`, k = 1..N), or just
    `path` when its name does not say it is a part.

    >>> [p.name for p in split_paths("m-00002-of-00003.gguf")]
    ['m-00001-of-00003.gguf', 'm-00002-of-00003.gguf', 'm-00003-of-00003.gguf']
    """
    p = pathlib.Path(path)
    m = _SPLIT_NAME.match(p.name)
    if m is None or not 1 <= int(m["no"]) <= int(m["count"]):
        return [p]
    return [p.with_name(f"{m['stem']}-{i:05d}-of-{int(m['count']):05d}.gguf") for i in range(1, int(m["count"]) + 1)]


class GGUFFile:
    """An opened GGUF model: its header parsed, its tensors left in the file(s) until used.

    `metadata` maps each key to a Python value (int, float, bool, str, or a list of them; float32 values widen to
    float exactly), `types` to its GGUF value type (`(ARRAY, element type)` for arrays), `tensors` each tensor name to
    its `TensorInfo`. A split model's metadata is its first part's.
    """

    def __init__(self, files: list[Tensor], paths: list[str], headers: list[_Header]) -> None:
        self.files = files
        self.paths = paths
        first = headers[0]
        self.version: int = first.version
        self.metadata: dict[str, Any] = first.metadata
        self.types: dict[str, tuple[ValueType, ...]] = first.types
        self.alignment: int = first.alignment
        self.tensors: dict[str, TensorInfo] = {}
        for part, header in enumerate(headers):
            for name, info in header.tensors.items():
                if name in self.tensors:
                    raise GGUFError(paths[part], f"tensor {name!r}", info.offset, "is also in an earlier part")
                self.tensors[name] = TensorInfo(name, info.shape, info.type, info.offset, info.nbytes, part)

    def __repr__(self) -> str:
        return f"<GGUFFile {self.paths[0]!r} v{self.version}: {len(self.metadata)} keys, {len(self.tensors)} tensors>"

    def _info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise KeyError(f"{self.paths[0]}: no tensor named {name!r} (it has {len(self.tensors)} tensors)")
        return self.tensors[name]

    def raw(self, name: str) -> Tensor:
        """The bytes of tensor `name` as a 1-d uint8 tensor: a lazy slice of the file (nothing is read until used)."""
        info = self._info(name)
        return self.files[info.part][info.offset : info.offset + info.nbytes]

    def tensor(self, name: str, device: str | None = None) -> Tensor:
        """Tensor `name` dequantised to float32 on `device` (default: Device.DEFAULT), lazily: only its bytes are
        copied from the file, and the dequantisation fuses into whatever uses the result."""
        info = self._info(name)
        return dequantize(self.raw(name).to(device or Device.DEFAULT), info.type, info.shape)


def open_gguf(fn: str | os.PathLike[str] | Tensor) -> GGUFFile:
    """Read the header of a GGUF file (a path, or its bytes as a 1-d uint8 Tensor); a part of a split model opens
    every part. Raises `GGUFError` for a malformed file, `FileNotFoundError` for a missing one.

    >>> import tempfile, os, numpy as np, gguf
    >>> fn = os.path.join(tempfile.mkdtemp(), "tiny.gguf")
    >>> w = gguf.GGUFWriter(fn, "llama")
    >>> w.add_uint32("llama.block_count", 2)
    >>> w.add_tensor("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    >>> f = open_gguf(fn)
    >>> f.metadata["llama.block_count"], f.tensors["w"].shape, f.tensor("w").tolist()
    (2, (2, 3), [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    """
    if isinstance(fn, Tensor):
        if fn.dtype != dtypes.uint8 or fn.ndim != 1:
            raise GGUFError("<tensor>", "file", 0, f"expected 1-d uint8 bytes, got {fn.shape} {fn.dtype.name}")
        header = _read_header(TensorIO(fn), fn.shape[0], "<tensor>")
        _check_split(header, 0, 1, "<tensor>")
        return GGUFFile([fn], ["<tensor>"], [header])
    if not isinstance(fn, (str, os.PathLike)):
        raise TypeError(f"expected a path or a uint8 Tensor, got {type(fn).__name__}")
    paths = split_paths(fn)
    files, headers = [], []
    for i, p in enumerate(paths):
        if not p.is_file():
            what = f"part {i + 1} of {len(paths)} of {str(fn)!r} is missing" if len(paths) > 1 else "no such file"
            raise FileNotFoundError(f"{str(p)!r}: {what}")
        size = p.stat().st_size
        t = Tensor(p) if size else Tensor.empty(0, dtype=dtypes.uint8)
        header = _read_header(TensorIO(t), size, str(p))
        _check_split(header, i, len(paths), str(p))
        files.append(t)
        headers.append(header)
    total = sum(len(h.tensors) for h in headers)
    declared = headers[0].metadata.get("split.tensors.count", total)
    if len(paths) > 1 and declared != total:
        raise GGUFError(
            str(paths[0]), "metadata 'split.tensors.count'", 0, f"says {declared} but the parts hold {total}"
        )
    return GGUFFile(files, [str(p) for p in paths], headers)


def _check_split(header: _Header, index: int, count: int, path: str) -> None:
    """A part must say it is part `index` (from 0) of `count`, as its file name does."""
    no = header.metadata.get("split.no", 0)
    n = header.metadata.get("split.count", 1)
    for key, v in (("split.no", no), ("split.count", n)):
        if type(v) is not int:  # found by the fuzzer: a list or string here made the message below a TypeError
            got = f"{header.types[key][-1].name.lower()} {str(v)[:40]}"
            raise GGUFError(path, f"metadata {key!r}", 0, f"must be an integer, got {got}")
    if (no, n) != (index, count):
        raise GGUFError(
            path,
            "metadata 'split.no'/'split.count'",
            0,
            f"the file says it is part {no + 1} of {n}, but it was opened as part {index + 1} of {count}; "
            "a split model's parts must be named <stem>-0000k-of-0000N.gguf",
        )


def gguf_load(fn: str | os.PathLike[str] | Tensor) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(metadata, {name: float32 tensor}) of a GGUF file, like tinygrad's `gguf_load`: each tensor is dequantised
    lazily on Device.DEFAULT, read from the file only when used."""
    f = open_gguf(fn)
    return f.metadata, {name: f.tensor(name) for name in f.tensors}
