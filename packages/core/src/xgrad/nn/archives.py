"""Zip and tar archives as lazy byte ranges: the container layer under `torch_load`, and `zip_extract`/`tar_extract`.

In: a `ByteSource` (a file or uint8 tensor). Out: members by name, each a `ByteSource` that views the archive when the
member is stored, or holds its decompressed bytes, decompressed only when asked for and charged to a `Budget` first
(a small archive must not inflate to gigabytes). Every malformed archive raises `CheckpointError`.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import tarfile
import zipfile
import zlib
from typing import TYPE_CHECKING, Any

from xgrad.dtype import dtypes
from xgrad.nn.fileview import DEFAULT_ALLOC_RATIO, Budget, ByteSource, CheckpointError, TensorIO, byte_source
from xgrad.nn.unpickler import brief

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

# the exceptions a malformed file can raise from the standard library (zipfile, tarfile, struct, zlib, numpy)
MALFORMED = (
    ArithmeticError,
    AttributeError,
    EOFError,
    LookupError,
    MemoryError,
    OSError,
    RecursionError,
    TypeError,
    ValueError,
    struct.error,
    zlib.error,
    zipfile.BadZipFile,
    tarfile.TarError,
)


def zip_open(src: ByteSource) -> tuple[zipfile.ZipFile, dict[str, zipfile.ZipInfo]]:
    """The archive and its members by name; nothing is read or decompressed yet."""
    try:
        zf = zipfile.ZipFile(TensorIO(src))
        return zf, {info.filename: info for info in zf.infolist() if not info.is_dir()}
    except (*MALFORMED, NotImplementedError) as e:  # zipfile: "zip file version 25.5" and other unsupported fields
        raise CheckpointError(f"{src.name}: not a valid zip archive ({type(e).__name__}: {brief(str(e))})") from None


def member_source(src: ByteSource, zf: zipfile.ZipFile, info: zipfile.ZipInfo, budget: Budget) -> ByteSource:
    """The bytes of a zip member: a view of the archive when stored, else the decompressed bytes (charged to
    `budget` before a byte is decompressed)."""
    name = f"{src.name}:{info.filename}"
    if info.flag_bits & 0x1:
        raise CheckpointError(f"{src.name}: zip member {info.filename!r} is encrypted")
    if info.compress_type != zipfile.ZIP_STORED:
        budget.charge(info.file_size, f"decompressing the zip member {info.filename!r}")
        try:
            with zf.open(info) as f:
                data = f.read(info.file_size)
        except (*MALFORMED, NotImplementedError, RuntimeError) as e:
            raise CheckpointError(f"{name}: cannot decompress ({type(e).__name__}: {brief(str(e))})") from None
        if len(data) != info.file_size:
            raise CheckpointError(f"{name}: decompressed to {len(data)} bytes, not {info.file_size}; it is corrupt")
        return ByteSource(None, 0, info.file_size, data, name)
    local = bytes(src.read(info.header_offset, 30))
    if local[:4] != b"PK\x03\x04":
        raise CheckpointError(f"{src.name}: zip member {info.filename!r} has no local header; the file is corrupt")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    return dataclasses.replace(src.sub(start, info.file_size), name=name)


class TarArchiveError(CheckpointError, tarfile.ReadError):
    """A file that is not a valid tar archive: a CheckpointError that is also tarfile's ReadError (tinygrad's)."""


def tar_members(src: ByteSource, budget: Budget, compressed: bool = True) -> dict[str, ByteSource]:
    """Regular files of an uncompressed tar as views; a compressed tar's members (only if `compressed`) are
    decompressed into memory, charged to `budget`."""
    try:
        try:
            with tarfile.open(fileobj=TensorIO(src), mode="r:") as tar:
                return {m.name: src.sub(m.offset_data, m.size) for m in tar if m.isreg()}
        except tarfile.ReadError:
            if not compressed:
                raise
        with tarfile.open(fileobj=TensorIO(src), mode="r:*") as tar:
            out = {}
            for m in tar:
                if m.isreg():
                    budget.charge(m.size, f"decompressing the tar member {m.name!r}")
                    if (f := tar.extractfile(m)) is not None:
                        out[m.name] = ByteSource(
                            None, 0, m.size, _read_all(f, m.size, src.name), f"{src.name}:{m.name}"
                        )
            return out
    except MALFORMED as e:
        raise TarArchiveError(f"{src.name}: not a valid tar archive ({type(e).__name__}: {brief(str(e))})") from None


def _read_all(f: Any, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CheckpointError(f"{what}: an archive member ends early; the file is truncated")
    return bytes(data)


def zip_extract(
    fn: Tensor | str | os.PathLike[str], *, max_alloc_ratio: float = DEFAULT_ALLOC_RATIO
) -> dict[str, Tensor]:
    """Every file in a zip archive as a uint8 tensor: lazy views of the archive for stored members, the
    decompressed bytes for compressed ones (at most `max_alloc_ratio` times the archive's size in all).

    >>> import io, zipfile
    >>> from xgrad import Tensor
    >>> buf = io.BytesIO()
    >>> with zipfile.ZipFile(buf, "w") as z: z.writestr("a.txt", "hi")
    >>> {k: bytes(v.numpy()) for k, v in zip_extract(Tensor(buf.getvalue())).items()}
    {'a.txt': b'hi'}
    """
    src = byte_source(fn)
    budget = Budget.for_file(src.name, src.nbytes, max_alloc_ratio)
    zf, infos = zip_open(src)
    out = {}
    for name, info in infos.items():
        m = member_source(src, zf, info, budget)
        out[name] = m.typed(0, dtypes.uint8, (m.nbytes,))
    return out


def tar_extract(
    fn: Tensor | str | os.PathLike[str], *, max_alloc_ratio: float = DEFAULT_ALLOC_RATIO
) -> dict[str, Tensor]:
    """Every regular file in a tar archive as a uint8 tensor (lazy views for an uncompressed tar; a compressed one
    may decompress to at most `max_alloc_ratio` times its size).

    >>> import io, tarfile
    >>> from xgrad import Tensor
    >>> buf = io.BytesIO()
    >>> with tarfile.open(fileobj=buf, mode="w") as tar:
    ...     info = tarfile.TarInfo("a.txt"); info.size = 2; tar.addfile(info, io.BytesIO(b"hi"))
    >>> {k: bytes(v.numpy()) for k, v in tar_extract(Tensor(buf.getvalue())).items()}
    {'a.txt': b'hi'}
    """
    src = byte_source(fn)
    members = tar_members(src, Budget.for_file(src.name, src.nbytes, max_alloc_ratio))
    return {name: m.typed(0, dtypes.uint8, (m.nbytes,)) for name, m in members.items()}
