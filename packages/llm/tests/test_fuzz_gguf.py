"""Structure-aware fuzzing of the GGUF reader (`xgrad_llm.gguf.open_gguf`, issue 22) with hypothesis.

Each example writes a valid tiny GGUF with the reference `gguf` package (metadata of every value type, arrays,
nested arrays, tensors of float and quantised types, an optional alignment), finds every field's bytes with the
reference `gguf.GGUFReader` (header counts, key and string lengths, value types, array lengths and element types,
tensor n_dims, dims, type ids and offsets), then mutates a few of those fields to values that break readers (0, 1,
one off, powers of two around 2**31, 2**32 and 2**63, all ones, random), truncates the file, flips, inserts or
deletes bytes, or appends junk.

The property, for every file: `open_gguf` returns a `GGUFFile` or raises `GGUFError`; no other exception, no hang
(a 10 s alarm), traced memory within 16x the file plus 8 MiB, and no process-wide state changed (xgrad's dtypes,
the reader's and the dequantisers' tables, the knobs). A file it opens has every tensor inside the file, apart from
the others, and readable as exactly its bytes. An unmutated file must open and agree with the reference reader
(metadata values, tensor names, shapes, types and offsets).

CI runs 150 derandomized examples per test (a few seconds). A longer, random run:

    XGRAD_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest -q -p no:cacheprovider -n 0 -s \\
        packages/llm/tests/test_fuzz_gguf.py --hypothesis-show-statistics
"""

from __future__ import annotations

import math
import pathlib
import signal
import tempfile
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np
import pytest

from xgrad.dtype import DType, dtypes
from xgrad.helpers import changed_knobs
from xgrad.testing import fuzz_long_run, fuzz_settings
from xgrad_llm import gguf as reader
from xgrad_llm.gguf import GGUFError, GGUFFile, open_gguf
from xgrad_llm.quants import BLOCK_SIZES

hypothesis = pytest.importorskip("hypothesis")
gguf = pytest.importorskip("gguf")
st = hypothesis.strategies
GGMLQuantizationType = gguf.GGMLQuantizationType
GGUFValueType = gguf.GGUFValueType

FUZZ = fuzz_settings(150)
RAN: dict[str, int] = {}  # examples run per test, printed at the end (pytest -s shows it)
OUTCOMES: dict[str, int] = {}  # opened / refused, over all tests
HANG_SECONDS = 10


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    mode = "random" if fuzz_long_run() else "derandomized"
    print(f"\nGGUF fuzz examples run: {RAN}, outcomes {OUTCOMES} (max_examples={FUZZ.max_examples}, {mode})")


@pytest.fixture(scope="module")
def workdir() -> Iterator[pathlib.Path]:
    with tempfile.TemporaryDirectory(prefix="xgrad-fuzz-gguf-") as d:
        yield pathlib.Path(d)


# ---- valid files, written by the reference writer ----
SCALARS: dict[Any, Any] = {
    GGUFValueType.UINT8: st.integers(0, 255),
    GGUFValueType.INT8: st.integers(-128, 127),
    GGUFValueType.UINT16: st.integers(0, 2**16 - 1),
    GGUFValueType.INT16: st.integers(-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: st.integers(0, 2**32 - 1),
    GGUFValueType.INT32: st.integers(-(2**31), 2**31 - 1),
    GGUFValueType.FLOAT32: st.floats(width=32, allow_nan=False),
    GGUFValueType.BOOL: st.booleans(),
    GGUFValueType.STRING: st.text(max_size=6),
    GGUFValueType.UINT64: st.integers(0, 2**64 - 1),
    GGUFValueType.INT64: st.integers(-(2**63), 2**63 - 1),
    GGUFValueType.FLOAT64: st.floats(allow_nan=False),
}
# (type, numpy dtype of the data or None for raw quantised bytes)
TENSOR_TYPES = [
    (GGMLQuantizationType.F32, np.float32),
    (GGMLQuantizationType.F16, np.float16),
    (GGMLQuantizationType.Q8_0, None),
    (GGMLQuantizationType.Q4_0, None),
    (GGMLQuantizationType.Q4_K, None),
]


@st.composite
def metadata_entry(draw: Any) -> tuple[Any, Any, Any]:
    """(value, value type, array element type or None) of one metadata record."""
    kind = draw(st.sampled_from([*SCALARS, "array", "nested"]))
    if kind == "array":
        sub = draw(st.sampled_from(list(SCALARS)))
        return draw(st.lists(SCALARS[sub], min_size=1, max_size=4)), GGUFValueType.ARRAY, sub  # the writer refuses []
    if kind == "nested":
        return (
            draw(st.lists(st.lists(st.integers(-5, 5), min_size=1, max_size=3), min_size=1, max_size=3)),
            GGUFValueType.ARRAY,
            None,
        )
    return draw(SCALARS[kind]), kind, None


# the keys the reader interprets; general.alignment is not here (the reference tools refuse a bad one): mutations of
# its value and type bytes cover it
SPECIAL_KEYS = ["split.no", "split.count", "split.tensors.count"]


@st.composite
def valid_gguf(draw: Any, path: pathlib.Path, special: bool = False) -> bytes:
    """A GGUF file written by `gguf.GGUFWriter` at `path`; returns its bytes. With `special`, the keys the reader
    interprets (split numbers) may hold any type and value, so the file may be invalid."""
    w = gguf.GGUFWriter(str(path), draw(st.sampled_from(["llama", "gemma3", ""])))
    if draw(st.integers(0, 3)) == 0:
        w.add_custom_alignment(draw(st.sampled_from([8, 16, 32, 64])))
    keys = draw(st.lists(st.text("abc.xyz_", min_size=1, max_size=5), max_size=5, unique=True))
    if special:
        keys += draw(st.lists(st.sampled_from(SPECIAL_KEYS), max_size=2, unique=True))
    for key in keys:
        if key in w.kv_data[0] or key == "general.alignment" or (not special and key in SPECIAL_KEYS):
            continue
        value, vtype, sub = draw(metadata_entry())
        if key in SPECIAL_KEYS and draw(st.booleans()):
            value, vtype, sub = draw(st.integers(0, 3)), GGUFValueType.UINT32, None  # a plausible value
        w.add_key_value(key, value, vtype, sub_type=sub)
    for i in range(draw(st.integers(0, 3))):
        qtype, np_dtype = draw(st.sampled_from(TENSOR_TYPES))
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        rows = draw(st.integers(1, 3))
        cols = block * draw(st.integers(1, 2)) if np_dtype is None else draw(st.integers(1, 5))
        if np_dtype is not None:
            w.add_tensor(f"t{i}", np.arange(rows * cols, dtype=np_dtype).reshape(rows, cols))
        else:
            raw = np.frombuffer(
                draw(st.binary(min_size=rows * cols // block * type_size, max_size=rows * cols // block * type_size)),
                np.uint8,
            )
            w.add_tensor(f"t{i}", raw.reshape(rows, -1), raw_dtype=qtype)  # rows of block bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


# ---- where the fields are, from the reference reader ----
@dataclass(frozen=True)
class Slot:
    """One integer field of a file: `size` bytes at `offset`, what it holds (for the statistics)."""

    offset: int
    size: int
    what: str


def field_slots(path: pathlib.Path) -> list[Slot]:
    """Every integer field of the file at `path` (counts, lengths, value types, dims, type ids, offsets, values)."""
    r = gguf.GGUFReader(str(path))
    base = r.data.__array_interface__["data"][0]
    fields = [(name, f) for name, f in r.fields.items()] + [(f"tensor {t.name}", t.field) for t in r.tensors]
    slots = [Slot(0, 4, "magic")]
    for name, f in fields:
        for i, part in enumerate(f.parts):
            if part.dtype.kind in "iub" and part.size == 1 and part.itemsize in (1, 2, 4, 8):
                slots.append(Slot(part.__array_interface__["data"][0] - base, part.itemsize, f"{name}[{i}]"))
    return slots


INTERESTING = [0, 1, 2, 3, 7, 31, 32, 33, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63]


@st.composite
def mutated_gguf(draw: Any, path: pathlib.Path) -> tuple[bytes, list[str]]:
    """A valid file with 1-4 mutations of its fields or bytes, and what was done (for failure reports)."""
    raw = bytearray(draw(valid_gguf(path, special=True)))
    slots = field_slots(path)
    done: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["field", "field", "field", "truncate", "flip", "insert", "delete", "append"]))
        if action == "field":
            slot = draw(st.sampled_from(slots))
            if slot.offset + slot.size > len(raw):
                continue
            old = int.from_bytes(raw[slot.offset : slot.offset + slot.size], "little")
            new = draw(
                st.one_of(
                    st.sampled_from(INTERESTING),
                    st.sampled_from([old - 1, old + 1, old * 2, old + 8]),
                    st.integers(0, 2**64 - 1),
                )
            )
            new &= (1 << (8 * slot.size)) - 1
            raw[slot.offset : slot.offset + slot.size] = new.to_bytes(slot.size, "little")
            done.append(f"{slot.what}@{slot.offset}: {old} -> {new}")
        elif action == "truncate":
            at = draw(st.integers(0, max(0, len(raw) - 1)))
            del raw[at:]
            done.append(f"truncate at {at}")
        elif action == "flip" and raw:
            at = draw(st.integers(0, len(raw) - 1))
            raw[at] ^= 1 << draw(st.integers(0, 7))
            done.append(f"flip a bit of byte {at}")
        elif action in ("insert", "delete") and slots:
            at = draw(st.sampled_from(slots)).offset  # at a field boundary: every later field shifts
            n = draw(st.integers(1, 9))
            if action == "insert":
                raw[at:at] = draw(st.binary(min_size=n, max_size=n))
            else:
                del raw[at : at + n]
            done.append(f"{action} {n} bytes at {at}")
        elif action == "append":
            raw += draw(st.binary(min_size=1, max_size=40))
            done.append("append junk")
    return bytes(raw), done


# ---- the property ----
def snapshot() -> dict[str, Any]:
    """The process-wide objects a file could try to change: xgrad's dtypes, the reader's tables, the knobs."""
    out: dict[str, Any] = {"knobs": changed_knobs(), "block sizes": dict(BLOCK_SIZES)}
    for name in dir(dtypes):
        d = getattr(dtypes, name)
        if isinstance(d, DType):
            out[f"dtype {name}"] = (id(d), sorted((k, repr(v)) for k, v in vars(d).items()))
    for name in ("MAGIC", "VERSIONS", "DEFAULT_ALIGNMENT", "MAX_DIMS", "MAX_NESTING", "_SCALARS", "_MIN_SIZE"):
        out[f"reader {name}"] = repr(getattr(reader, name))
    out["value types"] = [(m.name, m.value) for m in reader.ValueType]
    return out


class HangError(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise HangError(f"open_gguf ran past {HANG_SECONDS} s")


def check_property(name: str, path: pathlib.Path, raw: bytes) -> GGUFFile | GGUFError:
    """open_gguf(path) returns or raises GGUFError, quickly, within the memory bound, leaving global state alone."""
    RAN[name] = RAN.get(name, 0) + 1
    path.write_bytes(raw)
    before = snapshot()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    tracemalloc.start()
    try:
        out: GGUFFile | GGUFError = open_gguf(path)
    except GGUFError as e:
        out = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert peak <= 16 * len(raw) + (8 << 20), f"a {len(raw)}-byte file made open_gguf allocate {peak} bytes"
    assert snapshot() == before, "opening the file changed process-wide state"
    outcome = "refused" if isinstance(out, GGUFError) else "opened"
    OUTCOMES[outcome] = OUTCOMES.get(outcome, 0) + 1
    if isinstance(out, GGUFFile):
        check_tensors_lie_in_the_file(out, raw)
    else:
        assert out.path == str(path) and 0 <= out.offset, out
    return out


def check_tensors_lie_in_the_file(f: GGUFFile, raw: bytes) -> None:
    spans = sorted((info.offset, info.offset + info.nbytes, name) for name, info in f.tensors.items())
    for (start, end, name), nxt in zip(spans, [*spans[1:], None]):
        assert 0 <= start <= end <= len(raw), f"tensor {name} [{start}, {end}) outside a {len(raw)}-byte file"
        assert nxt is None or end <= nxt[0], f"tensor {name} overlaps {nxt[2]}"
        if end - start <= 4096:
            assert bytes(f.raw(name).numpy()) == raw[start:end]
        assert f.tensors[name].nbytes == end - start


def same_value(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, list):
        return isinstance(theirs, list) and len(ours) == len(theirs) and all(map(same_value, ours, theirs))
    if isinstance(ours, float):
        return math.isclose(ours, float(theirs), rel_tol=1e-7) or (math.isinf(ours) and ours == float(theirs))
    return bool(ours == theirs)


def reference_value(field: Any) -> Any:
    if field.types[0] != GGUFValueType.ARRAY or len(field.types) > 2 or field.types[-1] == GGUFValueType.STRING:
        return field.contents()
    return [field.parts[i].tolist()[0] for i in field.data] if len(field.types) == 2 else field.contents()


def agrees_with_reference(f: GGUFFile, path: pathlib.Path) -> None:
    r = gguf.GGUFReader(str(path))
    theirs = {name: field for name, field in r.fields.items() if not name.startswith("GGUF.")}
    assert set(f.metadata) == set(theirs)
    for key, field in theirs.items():
        if len(field.types) > 2:  # nested arrays: the reference reader's contents() flattens them
            continue
        assert same_value(f.metadata[key], reference_value(field)), (key, f.metadata[key], field.contents())
    assert {t.name for t in r.tensors} == set(f.tensors)
    for t in r.tensors:
        info = f.tensors[t.name]
        assert (info.type, info.offset, info.nbytes) == (int(t.tensor_type), int(t.data_offset), int(t.n_bytes))
        assert info.shape == tuple(int(d) for d in reversed(t.shape.tolist()))


# ---- the tests ----
@FUZZ
@hypothesis.given(data=st.data())
def test_valid_files_open_and_agree_with_the_reference_reader(workdir: pathlib.Path, data: Any) -> None:
    source = workdir / "valid-source.gguf"
    raw = data.draw(valid_gguf(source))
    out = check_property("valid", workdir / "valid.gguf", raw)
    assert isinstance(out, GGUFFile), f"a file written by gguf.GGUFWriter was refused: {out}"
    agrees_with_reference(out, workdir / "valid.gguf")


@FUZZ
@hypothesis.given(data=st.data())
def test_mutated_files_open_or_raise_gguf_error(workdir: pathlib.Path, data: Any) -> None:
    raw, done = data.draw(mutated_gguf(workdir / "mutated-source.gguf"))
    hypothesis.note(f"mutations: {done}")
    check_property("mutated", workdir / "mutated.gguf", raw)


@FUZZ
@hypothesis.given(
    head=st.sampled_from([b"GGUF\x03\x00\x00\x00", b"GGUF\x02\x00\x00\x00", b"GGUF\x01\x00\x00\x00", b"FUGG", b""]),
    body=st.binary(max_size=300),
)
def test_random_bytes_after_a_gguf_preamble_open_or_raise_gguf_error(
    workdir: pathlib.Path, head: bytes, body: bytes
) -> None:
    check_property("random", workdir / "random.gguf", head + body)
