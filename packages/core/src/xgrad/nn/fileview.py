"""Bytes of a weights file as lazy, typed tensors: the layer under `xgrad.nn.state`'s loaders.

A loader turns its input (a path, or a uint8 Tensor such as `Tensor(pathlib.Path(fn))`) into a `ByteSource`: a byte
range of one device Buffer. The tensors it returns are Buffer *views* of that memory (`ByteSource.typed`), so a
DISK-backed file is never read as a whole: copying one tensor to a device reads just its bytes, through the mmap.
Headers and pickles are read in small pieces through `TensorIO`, a file object over a `ByteSource`.
"""

from __future__ import annotations

import io
import os
import pathlib
import pickle
from dataclasses import dataclass
from typing import Any

from xgrad.buffer import Buffer, buffer_of, host_visible, new_buffer_uop
from xgrad.dtype import DType, dtypes
from xgrad.engine.indexing import contiguous_range, is_realized
from xgrad.errors import DTypeError, XgradError
from xgrad.helpers import prod
from xgrad.mixin.common import canonical_device
from xgrad.tensor import Tensor


class CheckpointError(XgradError, ValueError):
    """A weights file is malformed or truncated, or uses a feature `xgrad.nn.state` does not support."""


class UnsafePickleError(CheckpointError, pickle.UnpicklingError):
    """A pickle asked for something other than tensors, storages and plain containers. Nothing of it was run."""


class StateDictError(XgradError, KeyError):
    """A state dict and a model do not have the same keys."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


DEFAULT_ALLOC_RATIO = 16.0  # what a loader may allocate, as a multiple of the file's size ...
ALLOC_FLOOR = 8 << 20  # ... plus this much, so small files are never refused


@dataclass
class Budget:
    """The host memory a loader may still allocate while reading one file (decompressed archive members, tensors
    gathered from strided storages, objects a pickle builds). Views of the file cost nothing. A file that asks for
    more raises `CheckpointError`: a small file must not be able to make a loader allocate gigabytes."""

    what: str
    left: int
    knob: str = "max_alloc_ratio"

    @classmethod
    def for_file(cls, what: str, nbytes: int, ratio: float, knob: str = "max_alloc_ratio") -> Budget:
        if not (isinstance(ratio, (int, float)) and ratio >= 0):
            raise CheckpointError(f"{knob} must be a number >= 0, got {ratio!r}")
        return cls(what, int(nbytes * ratio) + ALLOC_FLOOR, knob)

    def charge(self, nbytes: int, why: str) -> None:
        if nbytes > self.left:
            raise CheckpointError(
                f"{self.what}: loading needs {nbytes} more bytes of memory for {why}, past the limit for a file of "
                f"this size; the file is malformed or a decompression bomb. If you trust it, pass a larger "
                f"{self.knob}= (default {DEFAULT_ALLOC_RATIO:g} times the file size)"
            )
        self.left -= nbytes


@dataclass(frozen=True)
class ByteSource:
    """`nbytes` bytes from byte `offset` of a device `buffer`, or of the host bytes `host` (what a compressed archive
    member decompresses to). Views of it are lazy for a buffer and copies for host bytes."""

    buffer: Buffer | None
    offset: int
    nbytes: int
    host: bytes | None = None
    name: str = "<tensor>"  # for error messages

    def sub(self, offset: int, nbytes: int) -> ByteSource:
        """The bytes [offset, offset+nbytes) of this source."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise CheckpointError(
                f"{self.name}: bytes [{offset}, {offset + nbytes}) are past the end of the data ({self.nbytes} bytes); "
                "the file is truncated or corrupt"
            )
        return ByteSource(self.buffer, self.offset + offset, nbytes, self.host, self.name)

    def read(self, offset: int = 0, nbytes: int | None = None) -> memoryview:
        """The bytes [offset, offset+nbytes) as host memory (zero-copy where the device maps it, like DISK)."""
        n = self.nbytes - offset if nbytes is None else nbytes
        part = self.sub(offset, n)
        if n == 0:
            return memoryview(b"")
        if part.host is not None:
            return memoryview(part.host)[part.offset : part.offset + n]
        assert part.buffer is not None
        return Buffer(part.buffer.device, n, dtypes.uint8, base=part.buffer, offset=part.offset).as_bytes()

    def typed(self, offset: int, dtype: DType, shape: tuple[int, ...]) -> Tensor:
        """A tensor of `dtype` and `shape` over the bytes from `offset`: a lazy view of the buffer (nothing is read
        until it is used), or a copy of host bytes on the default device."""
        n = int(prod(shape))
        part = self.sub(offset, n * dtype.itemsize)
        if part.host is not None:
            return tensor_from_bytes(part.read(), dtype, shape)
        assert part.buffer is not None

        device = part.buffer.device
        uop = new_buffer_uop(device, n, dtype)
        uop.__dict__["buffer"] = Buffer(device, n, dtype, base=part.buffer, offset=part.offset)
        return Tensor(uop.reshape(shape))


def byte_source(fn: Tensor | str | os.PathLike[str]) -> ByteSource:
    """Where the bytes of `fn` live: a path opens the file as a DISK tensor; a uint8 tensor is used as it is (a
    contiguous view of a buffer directly, anything else after realizing it)."""

    if isinstance(fn, Tensor):
        t, name = fn, "<tensor>"
    elif isinstance(fn, (str, os.PathLike)):
        path = pathlib.Path(fn)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {str(path)!r}")
        t, name = Tensor(path), str(path)
    else:
        raise TypeError(f"expected a Tensor, str or pathlib.Path, got {type(fn).__name__}")
    if t.dtype != dtypes.uint8 or t.ndim != 1:
        raise DTypeError(
            f"a weights file given as a Tensor must be 1-d uint8 bytes, got shape {t.shape} {t.dtype.name}; "
            "use Tensor(pathlib.Path(fn)) or t.bitcast(dtypes.uint8).flatten()"
        )
    if not (is_realized(t.uop) and (off := contiguous_range(t.uop)) is not None):
        t, off = t.contiguous().realize(), 0
    buf = buffer_of(t.uop)
    if not host_visible(buf.allocator):  # e.g. a GPU: read it once rather than through many small views
        return ByteSource(None, 0, t.numel(), bytes(t.data()), name)
    return ByteSource(buf, off, t.numel(), name=name)


def tensor_from_bytes(
    raw: bytes | bytearray | memoryview, dtype: DType, shape: tuple[int, ...], device: str | None = None
) -> Tensor:
    """A realized tensor on `device` (default: Device.DEFAULT) holding exactly the bytes `raw`."""

    n = int(prod(shape))
    data = memoryview(raw).cast("B")
    assert data.nbytes == n * dtype.itemsize, f"{data.nbytes} bytes for {n} elements of {dtype.name}"
    uop = new_buffer_uop(canonical_device(device), n, dtype)
    if n:
        buffer_of(uop).copyin(data)
    return Tensor(uop.reshape(shape))


class TensorIO(io.RawIOBase):
    """A read-only, seekable file object over the bytes of a 1-d uint8 tensor (or a path), for `zipfile`, `tarfile`
    and `pickle`. Each read copies just the bytes asked for.

    >>> from xgrad import Tensor
    >>> f = TensorIO(Tensor(b"hello world"))
    >>> _ = f.seek(6)
    >>> f.read(5)
    b'world'
    """

    def __init__(self, t: Tensor | str | os.PathLike[str] | ByteSource):
        super().__init__()
        self._src = t if isinstance(t, ByteSource) else byte_source(t)
        self._pos = 0

    @property
    def source(self) -> ByteSource:
        return self._src

    def __len__(self) -> int:
        return self._src.nbytes

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._src.nbytes}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        """At most the bytes left in the source, however many are asked for (never a huge empty buffer first)."""
        left = max(0, self._src.nbytes - self._pos)
        n = left if size is None or size < 0 else min(size, left)
        out = bytes(self._src.read(self._pos, n)) if n else b""
        self._pos += n
        return out

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(out.nbytes, self._src.nbytes - self._pos))
        if n:
            out[:n] = self._src.read(self._pos, n)
            self._pos += n
        return n
