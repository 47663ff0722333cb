"""Shared helpers of the loader hardening and fuzz tests: hand-assembled pickles, checkpoint containers, and a
snapshot of every process-wide object a checkpoint could try to change."""

from __future__ import annotations

import io
import struct
import types
import zipfile
from typing import Any

import numpy as np

from xgrad.dtype import DType, dtypes
from xgrad.nn.torch_load import ALLOWED_GLOBALS, LEGACY_MAGIC, LEGACY_PROTOCOL


# ---- pickle assembly: each helper returns the opcode bytes for one value or action ----
def g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def s(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def i(n: int) -> bytes:
    if -(1 << 31) <= n < 1 << 31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


PROTO2 = b"\x80\x02"
MARK, STOP, NONE, EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE = b"(", b".", b"N", b"}", b"]", b")"
SETITEM, SETITEMS, APPEND, APPENDS, ADDITEMS, BUILD, REDUCE = b"s", b"u", b"a", b"e", b"\x90", b"b", b"R"
TUPLE1, TUPLE2, TUPLE3, NEWOBJ, OBJ, POP = b"\x85", b"\x86", b"\x87", b"\x81", b"o", b"0"
NEWTRUE, NEWFALSE = b"\x88", b"\x89"


def binput(n: int) -> bytes:
    return b"q" + bytes([n])


def binget(n: int) -> bytes:
    return b"h" + bytes([n])


def prog(*parts: bytes) -> bytes:
    return PROTO2 + b"".join(parts) + STOP


# ---- containers ----
def torch_zip(data_pkl: bytes, storages: dict[str, bytes] | None = None, compress: int = zipfile.ZIP_STORED) -> bytes:
    """A zip in torch.save's layout around the pickle `data_pkl` (readable by torch.load too)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compress) as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
        z.writestr("archive/.format_version", "1")
        z.writestr("archive/.storage_alignment", "64")
        for key, raw in (storages or {}).items():
            z.writestr(f"archive/data/{key}", raw)
    return buf.getvalue()


def legacy(obj_pkl: bytes, keys: list[str] | None = None, storages: list[bytes] | None = None) -> bytes:
    """A legacy (non-zip) torch.save file whose object pickle is `obj_pkl`."""
    import pickle

    out = pickle.dumps(LEGACY_MAGIC, 2) + pickle.dumps(LEGACY_PROTOCOL, 2)
    out += pickle.dumps({"protocol_version": LEGACY_PROTOCOL, "little_endian": True}, 2) + obj_pkl
    out += pickle.dumps(keys or [], 2)
    for raw in storages or []:
        out += raw
    return out


# ---- the state a checkpoint must never change ----
def _state_of(v: Any) -> Any:
    if isinstance(v, types.FunctionType):
        return (sorted(v.__dict__.items()), v.__defaults__, v.__kwdefaults__, v.__code__, v.__name__)
    if isinstance(v, type):
        return sorted((k, repr(x)) for k, x in vars(v).items())
    if hasattr(v, "__dict__"):
        return sorted((k, repr(x), id(x)) for k, x in vars(v).items())
    return repr(v)


def snapshot() -> dict[Any, Any]:
    """Every attribute of every dtype, allowed global and common numpy dtype, by value and identity."""
    out: dict[Any, Any] = {}
    for key, v in ALLOWED_GLOBALS.items():
        out[("global", key)] = (id(v), _state_of(v))
    out["allowed"] = sorted(ALLOWED_GLOBALS)
    for name in dir(dtypes):
        d = getattr(dtypes, name)
        if isinstance(d, DType):
            out[("dtype", name)] = (id(d), sorted((k, repr(x)) for k, x in vars(d).items()))
    for code in ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u8", "b1", "c8"):
        dt = np.dtype(code)
        out[("numpy", code)] = (id(dt), dt.str, dt.byteorder, dt.itemsize, dt.kind, repr(dt.__reduce__()))
    return out
