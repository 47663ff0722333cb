"""The safetensors format (huggingface/safetensors): save a dict of tensors, load it back lazily.

Layout of a file: an 8-byte little-endian header length N, N bytes of JSON, then the data. The JSON maps each tensor
name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the start of the data) and may hold
"__metadata__", a str->str map. `safe_save` writes what the reference writer writes: tensors packed in order of
decreasing alignment then name, no gaps, and the header padded with spaces so the data starts 8-byte aligned (so every
tensor is aligned to its element size).

Reading is as strict as the reference reader (and refuses a few files it lets through): the header is JSON at most
127 levels deep, without NaN/Infinity or duplicate keys; each entry has a str dtype, a shape of non-negative ints (not
booleans or floats) whose byte size fits in 64 bits and matches its data_offsets; and the tensors' byte ranges tile
the data section exactly: sorted by offset each begins where the previous one ends, from byte 0 to the end of the
file, so no two overlap and no byte is unaccounted for.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from xgrad.device import Device, parse_device
from xgrad.dtype import DType, dtypes
from xgrad.errors import DTypeError
from xgrad.nn.fileview import ByteSource, CheckpointError, byte_source
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops

# safetensors dtype names <-> xgrad dtypes
SAFETENSORS_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool,
    "I8": dtypes.int8,
    "U8": dtypes.uint8,
    "I16": dtypes.int16,
    "U16": dtypes.uint16,
    "I32": dtypes.int32,
    "U32": dtypes.uint32,
    "I64": dtypes.int64,
    "U64": dtypes.uint64,
    "F8_E4M3": dtypes.fp8e4m3,
    "F8_E5M2": dtypes.fp8e5m2,
    "F16": dtypes.float16,
    "BF16": dtypes.bfloat16,
    "F32": dtypes.float32,
    "F64": dtypes.float64,
}
_NAME_OF: dict[DType, str] = {v: k for k, v in SAFETENSORS_DTYPES.items()}
MAX_HEADER_BYTES = 100_000_000  # the reference reader refuses larger headers
MAX_HEADER_DEPTH = 127  # nesting levels of the header JSON the reference reader accepts
_U64 = 1 << 64


def safe_load_metadata(fn: Tensor | str | os.PathLike[str]) -> tuple[Tensor, int, dict[str, Any]]:
    """The parsed header of a safetensors file: (the file as a uint8 tensor, byte where the data starts, the header
    JSON including "__metadata__" if present). Reads only the header.

    >>> import tempfile, os
    >>> from xgrad import Tensor
    >>> fn = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> safe_save({"w": Tensor([1.0, 2.0])}, fn, metadata={"format": "pt"})
    >>> _, data_start, header = safe_load_metadata(fn)
    >>> data_start % 8, header["w"], header["__metadata__"]
    (0, {'dtype': 'F32', 'shape': [2], 'data_offsets': [0, 8]}, {'format': 'pt'})
    """
    src = byte_source(fn)
    t = _as_tensor(fn)
    _, data_start, header = _read_header(src)
    return t, data_start, header


def safe_load(fn: Tensor | str | os.PathLike[str]) -> dict[str, Tensor]:
    """The tensors of a safetensors file (path or uint8 tensor), each a lazy view of the file's bytes: nothing but the
    header is read until a tensor is used, and then only that tensor's bytes (`t.to("CPU")`, `t.numpy()`).

    >>> import tempfile, os
    >>> from xgrad import Tensor
    >>> fn = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> safe_save({"w": Tensor([[1, 2], [3, 4]]), "b": Tensor([0.5])}, fn)
    >>> sd = safe_load(fn)
    >>> sd["w"].device.startswith("DISK:"), sd["w"].to("CPU").tolist(), sd["b"].numpy().tolist()
    (True, [[1, 2], [3, 4]], [0.5])
    """
    src = byte_source(fn)
    data, _, header = _read_header(src)
    out: dict[str, Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, begin, end = _parse_entry(src.name, name, info)
        out[name] = data.typed(begin, dtype, shape)
    return out


def safe_save(tensors: dict[str, Tensor], fn: str | os.PathLike[str], metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` to the safetensors file `fn` (readable by `safetensors.safe_open`/`load_file`, bit-exact for
    every dtype), with the optional str->str `metadata`. Tensors are computed as needed; a tensor loaded from `fn`
    itself may be saved back to it.

    >>> import tempfile, os
    >>> from xgrad import Tensor
    >>> fn = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> safe_save({"x": Tensor([1, 2, 3])}, fn)
    >>> safe_load(fn)["x"].tolist()
    [1, 2, 3]
    """
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise CheckpointError("safetensors metadata must be a dict of str to str, e.g. {'format': 'pt'}")
    for name, t in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise CheckpointError(f"cannot save a tensor named {name!r}: names must be str and not '__metadata__'")
        if t.dtype not in _NAME_OF:
            raise DTypeError(
                f"cannot save {name!r}: safetensors has no {t.dtype.name} (it has "
                f"{', '.join(d.name for d in _NAME_OF)}); cast it first, e.g. t.float()"
            )
    order = sorted(tensors, key=lambda k: (-tensors[k].dtype.itemsize, k))
    target = pathlib.Path(fn).resolve()
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    blobs: list[memoryview] = []
    owners: list[Tensor] = []  # keep every realized tensor alive until its bytes are written
    offset = 0
    for name in order:
        owner, blob = _tensor_bytes(tensors[name], target)
        owners.append(owner)
        header[name] = {
            "dtype": _NAME_OF[tensors[name].dtype],
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + blob.nbytes],
        }
        offset += blob.nbytes
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(target, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


# ---- helpers ----
def _as_tensor(fn: Tensor | str | os.PathLike[str]) -> Tensor:

    return fn if isinstance(fn, Tensor) else Tensor(pathlib.Path(fn))


def _read_header(src: ByteSource) -> tuple[ByteSource, int, dict[str, Any]]:
    """(the data section, byte where it starts, the header JSON) of the safetensors bytes in `src`, checked."""
    if src.nbytes < 8:
        raise CheckpointError(f"{src.name}: {src.nbytes} bytes is too short for a safetensors file (8-byte header)")
    n = int.from_bytes(src.read(0, 8), "little")
    if n > MAX_HEADER_BYTES or 8 + n > src.nbytes:
        raise CheckpointError(
            f"{src.name}: header length {n} does not fit in a file of {src.nbytes} bytes (at most "
            f"{MAX_HEADER_BYTES}); not a safetensors file, or it is truncated"
        )
    header = _parse_json(src.name, bytes(src.read(8, n)))
    if not isinstance(header, dict):
        raise CheckpointError(f"{src.name}: the safetensors header must be a JSON object, got {type(header).__name__}")
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointError(f"{src.name}: __metadata__ must map str to str")
    data = src.sub(8 + n, src.nbytes - 8 - n)
    _check_tiling(src.name, header, data.nbytes)
    return data, 8 + n, header


class _DuplicateKeyError(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKeyError(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_json(fname: str, raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _DuplicateKeyError as e:
        raise CheckpointError(
            f"{fname}: the safetensors header has the key {str(e.args[0])[:80]!r} twice; which one is meant is "
            "ambiguous (the reference reader silently keeps the last), so the file is refused. Re-save it"
        ) from None
    except RecursionError:
        raise CheckpointError(
            f"{fname}: the safetensors header is nested deeper than {MAX_HEADER_DEPTH} levels; not a safetensors file"
        ) from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{fname}: the safetensors header is not valid JSON in UTF-8 ({str(e)[:200]})") from None
    if _depth(value) > MAX_HEADER_DEPTH:
        raise CheckpointError(
            f"{fname}: the safetensors header is nested deeper than {MAX_HEADER_DEPTH} levels; not a safetensors file"
        )
    return value


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest = 0
    todo = [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _check_tiling(fname: str, header: dict[str, Any], data_bytes: int) -> None:
    """Every entry is valid, and sorted by offsets the tensors cover the data section exactly once."""
    spans = sorted(
        (_parse_entry(fname, name, info)[2:], name) for name, info in header.items() if name != "__metadata__"
    )
    at = 0
    for (begin, end), name in spans:
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else f"leaves bytes [{at}, {begin}) unused"
            raise CheckpointError(
                f"{fname}: tensor {name!r} at data bytes [{begin}, {end}) {what}; the tensors of a safetensors file "
                "must tile its data section exactly. The file is corrupt or was not written by a safetensors writer"
            )
        at = end
    if at != data_bytes:
        problem = (
            f"holds {data_bytes - at} bytes after the last tensor"
            if at < data_bytes
            else f"ends at byte {data_bytes}, before the last tensor's end at {at}; it is truncated"
        )
        raise CheckpointError(f"{fname}: the data section {problem}")


def _is_u64(x: Any) -> bool:
    return type(x) is int and 0 <= x < _U64


def _parse_entry(fname: str, name: str, info: Any) -> tuple[DType, tuple[int, ...], int, int]:
    """Check one header entry: (dtype, shape, begin, end)."""
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
        raise CheckpointError(f"{fname}: header entry {name!r} needs dtype, shape and data_offsets, got {info!r:.200}")
    if not isinstance(info["dtype"], str):
        raise CheckpointError(f"{fname}: tensor {name!r} has dtype {info['dtype']!r:.80}, expected a str like 'F32'")
    dtype = SAFETENSORS_DTYPES.get(info["dtype"])
    if dtype is None:
        raise DTypeError(
            f"{fname}: tensor {name!r} has safetensors dtype {info['dtype']!r:.80}, which xgrad cannot load "
            f"(supported: {', '.join(SAFETENSORS_DTYPES)})"
        )
    shape, offs = info["shape"], info["data_offsets"]
    if not (isinstance(shape, list) and all(_is_u64(s) for s in shape)):
        raise CheckpointError(
            f"{fname}: tensor {name!r} has an invalid shape {shape!r:.200}; expected a list of ints >= 0"
        )
    if not (isinstance(offs, list) and len(offs) == 2 and all(_is_u64(o) for o in offs)):
        raise CheckpointError(
            f"{fname}: tensor {name!r} has invalid data_offsets {offs!r:.200}; expected [begin, end], ints >= 0"
        )
    numel = 1
    for s in shape:  # as the reference reader multiplies: any 64-bit overflow on the way is an error
        numel *= s
        if numel >= _U64:
            raise CheckpointError(f"{fname}: tensor {name!r} of shape {shape!r:.200} has too many elements")
    begin, end = offs
    nbytes = numel * dtype.itemsize
    if nbytes >= _U64 or not begin <= end or end - begin != nbytes:
        raise CheckpointError(
            f"{fname}: tensor {name!r} of shape {tuple(shape)} {info['dtype']} needs {nbytes} bytes, "
            f"but its data_offsets {offs} span {end - begin}"
        )
    return dtype, tuple(shape), begin, end


def _tensor_bytes(t: Tensor, target: pathlib.Path) -> tuple[Tensor, memoryview]:
    """The contiguous bytes of `t`, and the realized tensor that owns them (keep it alive while the bytes are used:
    a freed buffer's memory is reused). Views of the file being written are copied out first (it is about to be
    truncated); other DISK views are read in place."""

    if t.numel() == 0:
        return t, memoryview(b"")
    if isinstance(t.device, tuple):  # a multi-device tensor: gather it on its first device
        t = t.to(t.device[0]).realize()
    device = t.device
    if device.startswith("DISK:") and _is_plain_buffer(t):
        if pathlib.Path(parse_device(device).path or "").resolve() == target:
            return t, memoryview(bytes(t.data()))
    elif device.startswith("DISK:"):
        t = t.to(Device.DEFAULT).realize()
    elif not _is_plain_buffer(t):
        t = t.contiguous().realize()
    mv = t.data()
    return t, mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _is_plain_buffer(t: Tensor) -> bool:
    u = t.uop
    while u.op is Ops.RESHAPE:
        u = u.src[0]
    return u.op is Ops.BUFFER
