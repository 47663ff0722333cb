"""Structure-aware fuzzing of `torch_load` and `safe_load` (issue 22) with hypothesis.

The property, for every generated file: the loader returns its objects or raises its typed error (`CheckpointError`,
`UnsafePickleError`, or `DTypeError` for a well-formed file of an unsupported dtype); no other exception, no crash,
no change to any process-wide object (a snapshot of every dtype, allowed pickle global and common numpy dtype), and
traced memory bounded by the loader's budget (16x the file plus 8 MiB). safe_load is also checked against the
reference `safetensors` reader: a file it refuses must be refused, and a file xgrad loads must load there with the
same names, shapes and bytes.

CI runs 100 derandomized examples per test, a few seconds in all. A longer, random run:

    XGRAD_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest -q -p no:cacheprovider -n 0 -s \\
        packages/core/tests/test_fuzz_loaders.py --hypothesis-show-statistics
"""

from __future__ import annotations

import io
import json
import struct
import tracemalloc
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fuzzing import LONG_RUN, fuzz_settings
from loader_cases import g, i, legacy, s, snapshot, torch_zip

from xgrad import Tensor
from xgrad.errors import DTypeError
from xgrad.nn.state import CheckpointError, safe_load, torch_load
from xgrad.nn.torch_load import ALLOWED_GLOBALS

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")

FUZZ = fuzz_settings(100)
RAN: dict[str, int] = {}  # examples run per test, printed at the end of each (pytest -s shows them)
EXPECTED = (CheckpointError, DTypeError)


def check_property(name: str, raw: bytes, load: Callable[[Tensor], Any], before: dict[Any, Any]) -> tuple[Any, bool]:
    """Load `raw`: (result, True) or (error, False); asserts the error type, the snapshot and the memory bound."""
    RAN[name] = RAN.get(name, 0) + 1
    data = Tensor(raw) if raw else Tensor(b"\0")[:0]
    tracemalloc.start()  # only around the load: tracing hypothesis itself would slow the run tenfold
    try:
        out: Any = load(data)
        ok = True
    except EXPECTED as e:
        out, ok = e, False
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak <= 16 * len(raw) + (24 << 20), f"{len(raw)}-byte file made the loader allocate {peak} bytes"
    assert snapshot() == before, "loading changed process-wide state"
    return out, ok


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    print(f"\nfuzz examples run: {RAN} (max_examples={FUZZ.max_examples}, {'random' if LONG_RUN else 'derandomized'})")


# ---- safetensors ----
SAFE_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "F32": 4, "F64": 8}
odd_int = st.one_of(st.integers(-3, 6), st.sampled_from([True, False, 1.0, None, "2", 1 << 64, -(1 << 63), 1 << 40]))


@st.composite
def safetensors_files(draw: Any) -> bytes:
    names = draw(st.lists(st.text(min_size=0, max_size=6), max_size=4, unique=True))
    header: dict[str, Any] = {}
    at = 0
    for name in names:
        dtype = draw(st.one_of(st.sampled_from(list(SAFE_DTYPES)), st.sampled_from(["F4", "C64", "f32", ""]), odd_int))
        shape: Any = draw(st.lists(st.integers(0, 5), max_size=3))
        if draw(st.integers(0, 9)) == 0:
            shape = draw(st.one_of(st.lists(odd_int, max_size=3), odd_int))
        n = 1
        for d in shape if isinstance(shape, list) else []:
            n *= d if type(d) is int and 0 < d <= 64 else 1  # a huge dim gets no data: the file stays small
        size = n * SAFE_DTYPES.get(dtype, 4) if isinstance(dtype, str) else 4
        offs: Any = [at, at + size]
        if draw(st.integers(0, 5)) == 0:  # a wrong offset: overlap, gap, reversed, odd types
            offs = draw(
                st.one_of(
                    st.lists(odd_int, min_size=0, max_size=3),
                    st.tuples(st.integers(0, 40), st.integers(0, 40)).map(list),
                )
            )
        entry: Any = {"dtype": dtype, "shape": shape, "data_offsets": offs}
        if draw(st.integers(0, 15)) == 0:
            entry = draw(st.one_of(st.none(), st.integers(), st.just([dtype, shape, offs]), st.just({"dtype": dtype})))
        header[name] = entry
        at += size
    if draw(st.booleans()):
        header["__metadata__"] = draw(
            st.one_of(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2), odd_int)
        )
    text = json.dumps(header).encode()
    if draw(st.integers(0, 9)) == 0:  # deep nesting somewhere
        depth = draw(st.integers(100, 3000))
        text = b'{"x":' + b"[" * depth + b"]" * depth + b"}"
    text += b" " * draw(st.integers(0, 8))
    data = bytes(draw(st.binary(min_size=at, max_size=at))) + draw(
        st.binary(max_size=3) if draw(st.integers(0, 5)) == 0 else st.just(b"")
    )
    if draw(st.integers(0, 5)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    length = len(text) if draw(st.integers(0, 9)) else draw(st.integers(0, 1 << 64 - 1))
    raw = bytearray(length.to_bytes(8, "little") + text + data)
    for _ in range(draw(st.integers(0, 2)) if draw(st.integers(0, 3)) == 0 else 0):  # byte flips
        if raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw)


def reference(raw: bytes) -> dict[str, Any] | None:
    try:
        return {k: v for k, v in safetensors.deserialize(raw)}
    except Exception:
        return None


def test_fuzz_safe_load() -> None:
    before = snapshot()

    @FUZZ
    @hypothesis.given(safetensors_files())
    def run(raw: bytes) -> None:
        out, ok = check_property("safe_load", raw, safe_load, before)
        ref = reference(raw)
        if not ok:
            return
        assert ref is not None, "safe_load accepted a file the reference reader refuses"
        assert set(out) == set(ref)
        for k, t in out.items():
            assert list(t.shape) == ref[k]["shape"]
            if t.numel() and t.numel() < 64:
                assert bytes(t.to("CPU").realize().data()) == bytes(ref[k]["data"])

    run()


# ---- torch_load ----
GLOBALS = sorted(ALLOWED_GLOBALS) + [("os", "system"), ("builtins", "getattr"), ("xgrad.dtype", "dtypes")]
STORAGES = [name for (m, name) in ALLOWED_GLOBALS if m == "torch" and name.endswith("Storage")]


def storage_pid(key: str, storage: str, numel: int) -> bytes:
    return b"(" + s("storage") + g("torch", storage) + s(key) + s("cpu") + i(numel) + b"tQ"


@st.composite
def tensor_pickles(draw: Any) -> tuple[bytes, dict[str, bytes]]:
    """A `_rebuild_tensor_v2` (or v3) over a storage of random size with a random layout: strides 0, overlapping,
    permuted or past the end, and a random offset."""
    storage = draw(st.sampled_from(STORAGES))
    nbytes = draw(st.integers(0, 64))
    ndim = draw(st.integers(0, 4))
    size = draw(
        st.lists(
            st.one_of(st.integers(0, 6), st.sampled_from([1 << 20, 1 << 33, 1 << 62])), min_size=ndim, max_size=ndim
        )
    )
    stride = draw(st.lists(st.one_of(st.integers(0, 8), st.sampled_from([-1, 1 << 31])), min_size=ndim, max_size=ndim))
    offset = draw(st.one_of(st.integers(0, 10), st.sampled_from([-1, 1 << 40])))
    dims = b"(" + b"".join(i(x) for x in size) + b"t"
    strides = b"(" + b"".join(i(x) for x in stride) + b"t"
    tensor = g("torch._utils", "_rebuild_tensor_v2") + b"(" + storage_pid("0", storage, nbytes) + i(offset)
    tensor += dims + strides + b"\x89" + g("collections", "OrderedDict") + b")R" + b"tR"
    key = draw(st.text(max_size=3))
    body = b"\x80\x02}" + s(key) + tensor + b"s."
    return body, {"0": draw(st.binary(min_size=nbytes, max_size=nbytes))}


OPS = [b"N", b"\x88", b"\x89", b"}", b"]", b")", b"(", b"t", b"l", b"d", b"s", b"u", b"a", b"e", b"R", b"b", b"0", b"2",
       b"\x85", b"\x86", b"\x87", b"\x8f", b"\x90", b"\x91", b"\x81", b"o", b"\x93", b"\x94", b"Q", b"1"]  # fmt: skip


@st.composite
def pickle_programs(draw: Any) -> bytes:
    """Random opcode sequences over the pickle machine: containers, the allowed (and some refused) globals, memo,
    calls, BUILD and mutations, persistent ids; mostly well-formed pieces, sometimes raw bytes."""
    out = [b"\x80" + bytes([draw(st.sampled_from([2, 4, 5]))])]
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.integers(0, 9))
        if kind == 0:
            out.append(i(draw(st.integers(-(1 << 40), 1 << 40))))
        elif kind == 1:
            out.append(s(draw(st.sampled_from(["itemsize", "name", "storage", "cpu", "0", "_metadata", "f4", "<"]))))
        elif kind == 2:
            out.append(g(*draw(st.sampled_from(GLOBALS))))
        elif kind == 3:
            out.append(draw(st.sampled_from([b"q", b"h"])) + bytes([draw(st.integers(0, 3))]))
        elif kind == 4:
            out.append(
                storage_pid(draw(st.sampled_from(["0", "1"])), draw(st.sampled_from(STORAGES)), draw(st.integers(0, 8)))
            )
        elif kind == 5:
            out.append(draw(st.binary(min_size=1, max_size=4)))
        else:
            out.append(draw(st.sampled_from(OPS)))
    out.append(b".")
    return b"".join(out)


def torch_files_of(program: bytes, storages: dict[str, bytes], form: str) -> bytes:
    if form == "zip":
        return torch_zip(program, storages)
    if form == "deflated":
        return torch_zip(program, storages, zipfile.ZIP_DEFLATED)
    if form == "legacy":
        keys = list(storages)
        return legacy(program, keys, [struct.pack("<q", len(b)) + b for b in storages.values()])
    return program


def real_checkpoints() -> list[bytes]:
    torch.manual_seed(0)
    sd = {"w": torch.randn(3, 4), "t": torch.arange(6.0).reshape(2, 3).T, "e": torch.ones(2, 1).expand(2, 5)}
    sd["i"] = torch.arange(5, dtype=torch.int16)[::2]
    out = []
    for zipped in (True, False):
        for protocol in (2, 4):
            buf = io.BytesIO()
            payload = {"sd": sd, "step": 3, "b": b"\x00\xff"}
            torch.save(payload, buf, _use_new_zipfile_serialization=zipped, pickle_protocol=protocol)
            out.append(buf.getvalue())
    return out


REAL = real_checkpoints()


@st.composite
def mutated_checkpoints(draw: Any) -> bytes:
    raw = bytearray(draw(st.sampled_from(REAL)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(raw) - 1))
        how = draw(st.integers(0, 3))
        if how == 0:
            raw[at] = draw(st.integers(0, 255))
        elif how == 1:
            raw[at : at + 4] = struct.pack("<I", draw(st.sampled_from([0, 1, 0xFFFFFFFF, 1 << 30, len(raw)])))
        elif how == 2:
            del raw[at:]
        else:
            raw[at:at] = draw(st.binary(min_size=1, max_size=8))
        if not raw:
            break
    return bytes(raw)


def test_fuzz_torch_load_tensor_layouts() -> None:
    before = snapshot()

    @FUZZ
    @hypothesis.given(tensor_pickles(), st.sampled_from(["zip", "deflated", "legacy"]))
    def run(case: tuple[bytes, dict[str, bytes]], form: str) -> None:
        out, ok = check_property("torch_load/layouts", torch_files_of(*case, form), torch_load, before)
        if ok:
            assert isinstance(out, dict) and all(isinstance(t, Tensor) for t in out.values())

    run()


def test_fuzz_torch_load_pickle_programs() -> None:
    before = snapshot()

    @FUZZ
    @hypothesis.given(pickle_programs(), st.sampled_from(["zip", "legacy", "raw"]))
    def run(program: bytes, form: str) -> None:
        check_property("torch_load/programs", torch_files_of(program, {"0": b"\0" * 16}, form), torch_load, before)

    run()


def test_fuzz_torch_load_mutated_real_checkpoints() -> None:
    before = snapshot()

    @FUZZ
    @hypothesis.given(mutated_checkpoints())
    def run(raw: bytes) -> None:
        check_property("torch_load/mutated", raw, torch_load, before)

    run()


def test_real_checkpoints_of_the_fuzzer_load_like_torch() -> None:
    for raw in REAL:
        ref = torch.load(io.BytesIO(raw), weights_only=False)  # torch's weights_only reader has no protocol 4 frames
        ours = torch_load(Tensor(raw))
        assert ours["step"] == 3 and ours["b"] == b"\x00\xff"
        for k, v in ref["sd"].items():
            assert ours["sd"][k].tolist() == v.tolist()
