"""xgrad.nn.state: safetensors save/load (against the real `safetensors` package and hand-built bytes), torch_load
(against files written by torch), the restricted unpickler, laziness of DISK loads, get_state_dict and
load_state_dict."""

from __future__ import annotations

import collections
import doctest
import importlib
import io
import json
import os
import pathlib
import pickle
import struct
import tarfile
import zipfile
from typing import Any, NamedTuple

import numpy as np
import pytest

from xgrad import Tensor
from xgrad.dtype import DType, dtypes
from xgrad.engine.realize import GlobalCounters
from xgrad.errors import DTypeError, ShapeError
from xgrad.nn.fileview import tensor_from_bytes
from xgrad.nn.state import (
    CheckpointError,
    StateDictError,
    TensorIO,
    UnsafePickleError,
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_load_metadata,
    safe_save,
    tar_extract,
    torch_load,
    zip_extract,
)
from xgrad.runtime.disk import DiskAllocator
from xgrad.testing import skip_unsupported

torch = pytest.importorskip("torch")

SAFE_DTYPES: dict[str, DType] = {
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
TORCH_OF: dict[DType, Any] = {
    dtypes.bool: torch.bool,
    dtypes.int8: torch.int8,
    dtypes.uint8: torch.uint8,
    dtypes.int16: torch.int16,
    dtypes.int32: torch.int32,
    dtypes.int64: torch.int64,
    dtypes.fp8e4m3: torch.float8_e4m3fn,
    dtypes.fp8e5m2: torch.float8_e5m2,
    dtypes.float16: torch.float16,
    dtypes.bfloat16: torch.bfloat16,
    dtypes.float32: torch.float32,
    dtypes.float64: torch.float64,
}


def random_bytes(dtype: DType, shape: tuple[int, ...], seed: int = 0) -> bytes:
    """Random bit patterns (NaN payloads, subnormals, ...) for `dtype`; bools are 0/1."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = rng.integers(0, 256, n, dtype=np.uint8)
    if dtype == dtypes.bool:
        raw = raw & 1
    return raw.tobytes()


def raw_tensor(dtype: DType, shape: tuple[int, ...], seed: int = 0, device: str | None = None) -> Tensor:
    return tensor_from_bytes(random_bytes(dtype, shape, seed), dtype, shape, device)


def host_bytes(t: Tensor) -> bytes:
    return bytes(t.realize().data()) if t.numel() else b""


def torch_bits(x: Any) -> bytes:
    return x.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if x.numel() else b""


# ---- safetensors ----
@pytest.mark.parametrize("name", list(SAFE_DTYPES))
def test_safe_roundtrip_is_bit_exact_for_every_dtype(xgrad_device: str, name: str, tmp_path: pathlib.Path) -> None:
    dtype = SAFE_DTYPES[name]
    skip_unsupported(xgrad_device, dtype)
    shapes = {"m": (3, 5), "scalar": (), "empty": (0, 4), "v": (7,)}
    tensors = {k: raw_tensor(dtype, s, seed=i, device=xgrad_device) for i, (k, s) in enumerate(shapes.items())}
    fn = tmp_path / "x.safetensors"
    safe_save(tensors, fn)
    _, data_start, header = safe_load_metadata(fn)
    assert data_start % 8 == 0 and header["m"]["dtype"] == name
    loaded = safe_load(fn)
    assert set(loaded) == set(shapes)
    for k, shape in shapes.items():
        t = loaded[k]
        assert t.device.startswith("DISK:") and t.shape == shape and t.dtype == dtype
        assert host_bytes(t.to(xgrad_device)) == random_bytes(dtype, shape, seed=list(shapes).index(k))


def test_safe_save_layout_matches_reference_writer(tmp_path: pathlib.Path) -> None:
    fn = tmp_path / "x.safetensors"
    safe_save(
        {"b": Tensor([1, 2], dtype=dtypes.int8), "a": Tensor([1.0]), "c": Tensor([1.0], dtype=dtypes.float64)}, fn
    )
    raw = fn.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    assert (8 + n) % 8 == 0 and raw[8 : 8 + n].rstrip(b" ") == raw[8 : 8 + n].rstrip()
    # packed by decreasing alignment then name, without gaps, covering the whole data section
    assert [header[k]["data_offsets"] for k in ("c", "a", "b")] == [[0, 8], [8, 12], [12, 14]]
    assert len(raw) == 8 + n + 14 and "__metadata__" not in header


def test_safe_load_reads_file_written_by_safetensors_package(tmp_path: pathlib.Path) -> None:
    st_numpy = pytest.importorskip("safetensors.numpy")
    st_torch = pytest.importorskip("safetensors.torch")
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((4, 3)).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "i64": rng.integers(-(2**40), 2**40, (2, 2)),
        "u16": rng.integers(0, 2**16, 3).astype(np.uint16),
        "b": np.array([True, False, True]),
        "s": np.array(2.5, dtype=np.float64),
    }
    st_numpy.save_file(arrays, str(tmp_path / "np.safetensors"), metadata={"format": "np"})
    loaded = safe_load(tmp_path / "np.safetensors")
    for k, a in arrays.items():
        np.testing.assert_array_equal(loaded[k].to("CPU").numpy(), a)
        assert loaded[k].shape == a.shape
    assert safe_load_metadata(tmp_path / "np.safetensors")[2]["__metadata__"] == {"format": "np"}
    tensors = {
        "bf16": torch.randn(3, 4).to(torch.bfloat16),
        "e4m3": torch.randn(6).to(torch.float8_e4m3fn),
        "e5m2": torch.randn(6).to(torch.float8_e5m2),
    }
    st_torch.save_file(tensors, str(tmp_path / "t.safetensors"))
    loaded = safe_load(str(tmp_path / "t.safetensors"))
    for k, x in tensors.items():
        assert host_bytes(loaded[k].to("CPU")) == torch_bits(x)
        np.testing.assert_array_equal(loaded[k].numpy(), x.float().numpy())


def test_safe_save_file_loads_in_safetensors_package(tmp_path: pathlib.Path) -> None:
    st_numpy = pytest.importorskip("safetensors.numpy")
    st_torch = pytest.importorskip("safetensors.torch")
    ours = {
        "w": Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)),
        "i": Tensor([-1, 2, 3], dtype=dtypes.int64),
        "m": Tensor([True, False]),
        "e": Tensor(np.zeros((0, 2), np.float16)),
        "s": Tensor(np.array(7, dtype=np.int32)),
    }
    safe_save(ours, tmp_path / "a.safetensors", metadata={"who": "xgrad"})
    got = st_numpy.load_file(str(tmp_path / "a.safetensors"))
    for k, t in ours.items():
        np.testing.assert_array_equal(got[k], t.numpy())
        assert got[k].dtype == t.numpy().dtype and got[k].shape == t.shape
    from safetensors import safe_open

    with safe_open(str(tmp_path / "a.safetensors"), "np") as f:
        assert f.metadata() == {"who": "xgrad"}
    special = {k: raw_tensor(d, (2, 3), seed=3) for k, d in [("bf", dtypes.bfloat16), ("f8", dtypes.fp8e5m2)]}
    safe_save(special, tmp_path / "b.safetensors")
    got_t = st_torch.load_file(str(tmp_path / "b.safetensors"))
    assert got_t["bf"].dtype == torch.bfloat16 and got_t["f8"].dtype == torch.float8_e5m2
    for k, t in special.items():
        assert torch_bits(got_t[k]) == host_bytes(t)


def test_safe_load_reads_hand_built_bytes() -> None:
    data = np.array([1.5, -2.0], np.float32).tobytes() + np.array([7, 8, 9], np.int16).tobytes()
    header = {
        "__metadata__": {"k": "v"},
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "I16", "shape": [3, 1], "data_offsets": [8, 14]},
    }
    text = json.dumps(header).encode()
    raw = len(text).to_bytes(8, "little") + text + data  # header not padded: tensors need not be aligned to load
    loaded = safe_load(Tensor(raw))
    assert loaded["a"].tolist() == [1.5, -2.0] and loaded["b"].tolist() == [[7], [8], [9]]
    assert set(loaded) == {"a", "b"}


def test_safe_load_only_reads_the_bytes_of_the_tensor_used(tmp_path: pathlib.Path, monkeypatch: Any) -> None:
    fn = tmp_path / "big.safetensors"
    safe_save({"big": Tensor.zeros(1 << 20).contiguous(), "small": Tensor([1.0, 2.0, 3.0]), "z": Tensor([9])}, fn)
    reads: list[int] = []
    original = DiskAllocator.as_memoryview

    def recording(self: DiskAllocator, handle: Any) -> memoryview:
        mv = original(self, handle)
        reads.append(mv.nbytes)
        return mv

    monkeypatch.setattr(DiskAllocator, "as_memoryview", recording)
    sd = safe_load(fn)
    header_reads = sum(reads)
    assert header_reads < 1024  # the header, not the 4 MB tensor
    reads.clear()
    GlobalCounters.reset()
    small = sd["small"].to("CPU").realize()
    assert reads == [12] and GlobalCounters.global_mem == 12  # one copy of exactly the 12 bytes of "small"
    assert small.tolist() == [1.0, 2.0, 3.0]


def test_safe_load_from_a_view_of_a_bigger_file(tmp_path: pathlib.Path) -> None:
    safe_save({"w": Tensor([[1, 2], [3, 4]], dtype=dtypes.int32)}, tmp_path / "w.safetensors")
    with tarfile.open(tmp_path / "w.tar", "w") as tar:
        tar.add(tmp_path / "w.safetensors", arcname="model/w.safetensors")
    members = tar_extract(tmp_path / "w.tar")
    assert members["model/w.safetensors"].device.startswith("DISK:")
    assert safe_load(members["model/w.safetensors"])["w"].to("CPU").tolist() == [[1, 2], [3, 4]]


def test_safe_save_back_into_the_file_it_was_loaded_from(tmp_path: pathlib.Path) -> None:
    fn = tmp_path / "w.safetensors"
    safe_save({"a": Tensor([1.0, 2.0]), "b": Tensor(np.arange(100, dtype=np.float32))}, fn)
    sd = safe_load(fn)
    del sd["b"]  # the new file is smaller: the old tensors must be read before the file is truncated
    sd["a"] = sd["a"].to("CPU") * 10
    sd["c"] = safe_load(fn)["a"]
    safe_save(sd, fn)
    again = safe_load(fn)
    assert again["a"].tolist() == [10.0, 20.0] and again["c"].tolist() == [1.0, 2.0] and set(again) == {"a", "c"}


def test_safe_save_computes_lazy_tensors_of_equal_size(tmp_path: pathlib.Path) -> None:
    a, b = Tensor([1.0, 2.0, 3.0]), Tensor([5.0, 6.0, 7.0])
    safe_save({"a": a * 2, "b": b * 2, "c": (a + b).reshape(3, 1)}, tmp_path / "x.safetensors")
    sd = safe_load(tmp_path / "x.safetensors")
    assert sd["a"].tolist() == [2.0, 4.0, 6.0] and sd["b"].tolist() == [10.0, 12.0, 14.0]
    assert sd["c"].tolist() == [[6.0], [8.0], [10.0]]


def test_safe_save_rejects_what_the_format_cannot_hold(tmp_path: pathlib.Path) -> None:
    with pytest.raises(DTypeError, match="fp8e4m3fnuz"):
        safe_save({"x": raw_tensor(dtypes.fp8e4m3fnuz, (2,))}, tmp_path / "x.safetensors")
    with pytest.raises(CheckpointError, match="str to str"):
        safe_save({"x": Tensor([1])}, tmp_path / "x.safetensors", metadata={"epoch": 3})  # type: ignore[dict-item]
    with pytest.raises(CheckpointError, match="__metadata__"):
        safe_save({"__metadata__": Tensor([1])}, tmp_path / "x.safetensors")


def test_safe_load_rejects_malformed_files(tmp_path: pathlib.Path) -> None:
    def file(header: Any, data: bytes = b"", length: int | None = None) -> Tensor:
        text = json.dumps(header).encode() if not isinstance(header, bytes) else header
        return Tensor((len(text) if length is None else length).to_bytes(8, "little") + text + data)

    with pytest.raises(CheckpointError, match="too short"):
        safe_load(Tensor(b"\x01\x00"))
    with pytest.raises(CheckpointError, match="header length"):
        safe_load(file({}, length=1000))
    with pytest.raises(CheckpointError, match="not valid JSON"):
        safe_load(file(b"{nope"))
    with pytest.raises(CheckpointError, match="span"):
        safe_load(file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8))
    with pytest.raises(CheckpointError, match="truncated"):
        safe_load(file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4))
    with pytest.raises(DTypeError, match="F4"):
        safe_load(file({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, b"\0"))
    with pytest.raises(FileNotFoundError):
        safe_load(tmp_path / "missing.safetensors")


# ---- torch_load ----
def torch_state_dict() -> dict[str, Any]:
    torch.manual_seed(0)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd: dict[str, Any] = collections.OrderedDict()
    for dt in TORCH_OF.values():
        sd[f"t_{str(dt).split('.')[-1]}"] = (torch.randn(3, 2) * 4).to(dt)
    sd["transposed"] = base.T  # permuted strides
    sd["permuted3d"] = torch.arange(24, dtype=torch.int16).reshape(2, 3, 4).permute(2, 0, 1)
    sd["stepped"] = base[:, ::2]  # strides that are no permutation
    sd["row"] = base[2]  # storage offset
    sd["shared"] = base  # shares its storage with the three above
    sd["tied"] = sd["shared"]
    sd["bf16_T"] = torch.randn(3, 5).to(torch.bfloat16).T
    sd["param"] = torch.nn.Parameter(torch.ones(2, 2))
    sd["scalar"] = torch.tensor(3.25)
    sd["empty"] = torch.zeros(0, 3)
    sd["expanded"] = torch.arange(3.0).reshape(3, 1).expand(3, 4)
    return sd


def check_matches(ours: Any, ref: Any) -> None:
    assert ours.shape == tuple(ref.shape), f"{ours.shape} != {tuple(ref.shape)}"
    assert host_bytes(ours.to("CPU")) == torch_bits(ref)


@pytest.mark.parametrize("zipfile_format", [True, False], ids=["zip", "legacy"])
def test_torch_load_matches_torch(tmp_path: pathlib.Path, zipfile_format: bool) -> None:
    sd = torch_state_dict()
    fn = tmp_path / "m.pt"
    torch.save(
        {"model": sd, "epoch": 7, "shape": sd["shared"].shape, "names": ["a", b"\x00\xff"]},
        fn,
        _use_new_zipfile_serialization=zipfile_format,
    )
    loaded = torch_load(fn)
    assert loaded["epoch"] == 7 and tuple(loaded["shape"]) == (4, 6) and loaded["names"] == ["a", b"\x00\xff"]
    assert isinstance(loaded["model"], collections.OrderedDict) and list(loaded["model"]) == list(sd)
    for k, ref in sd.items():
        check_matches(loaded["model"][k], ref.detach())
    # contiguous tensors stay lazy views of the file
    assert loaded["model"]["row"].device.startswith("DISK:") and loaded["model"]["t_float32"].device.startswith("DISK:")
    assert loaded["model"]["transposed"].tolist() == sd["transposed"].tolist()


def test_torch_load_only_reads_the_bytes_of_the_tensor_used(tmp_path: pathlib.Path, monkeypatch: Any) -> None:
    torch.save({"big": torch.zeros(1 << 20), "small": torch.arange(3, dtype=torch.int32)}, tmp_path / "m.pt")
    sd = torch_load(tmp_path / "m.pt")
    reads: list[int] = []
    original = DiskAllocator.as_memoryview

    def recording(self: DiskAllocator, handle: Any) -> memoryview:
        mv = original(self, handle)
        reads.append(mv.nbytes)
        return mv

    monkeypatch.setattr(DiskAllocator, "as_memoryview", recording)
    small = sd["small"].to("CPU").realize()
    assert reads == [12] and small.tolist() == [0, 1, 2]


def test_torch_load_accepts_a_tensor_and_a_str(tmp_path: pathlib.Path) -> None:
    torch.save({"w": torch.arange(4, dtype=torch.int32)}, tmp_path / "m.pt")
    assert torch_load(str(tmp_path / "m.pt"))["w"].tolist() == [0, 1, 2, 3]
    assert torch_load(Tensor((tmp_path / "m.pt").read_bytes()))["w"].tolist() == [0, 1, 2, 3]


def test_torch_load_reads_a_recompressed_zip(tmp_path: pathlib.Path) -> None:
    torch.save({"w": torch.arange(6.0).reshape(2, 3)}, tmp_path / "m.pt")
    with (
        zipfile.ZipFile(tmp_path / "m.pt") as src,
        zipfile.ZipFile(tmp_path / "z.pt", "w", zipfile.ZIP_DEFLATED) as dst,
    ):
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert torch_load(tmp_path / "z.pt")["w"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_torch_load_reads_legacy_tar_format(tmp_path: pathlib.Path) -> None:
    """A hand-built file in the torch < 0.4 tar layout (members storages, tensors, pickle)."""
    w = np.arange(12, dtype=np.float32)
    storages = io.BytesIO()
    for obj in (1, (5, "cpu", torch.FloatStorage)):
        pickle.dump(obj, storages, protocol=2)
    storages.write(struct.pack("<q", w.size) + w.tobytes())
    pickle.dump([(6, 5, 2, 4)], storages, protocol=2)  # storage 6: a view of elements 2..5 of storage 5
    tensors = io.BytesIO()
    pickle.dump(2, tensors, protocol=2)
    for key, storage, size, stride, offset in ((10, 5, (3, 4), (1, 3), 0), (11, 6, (2,), (1,), 1)):
        pickle.dump((key, storage, torch.FloatTensor), tensors, protocol=2)
        tensors.write(struct.pack("<i4x", len(size)) + struct.pack(f"<{len(size)}q", *size))
        tensors.write(struct.pack(f"<{len(size)}q", *stride) + struct.pack("<q", offset))

    class Ref:
        def __init__(self, key: int):
            self.key = key

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return str(obj.key) if isinstance(obj, Ref) else None

    main = io.BytesIO()
    Pickler(main, protocol=2).dump({"w": Ref(10), "v": Ref(11)})
    with tarfile.open(tmp_path / "old.pt", "w", format=tarfile.PAX_FORMAT) as tar:
        for name, blob in [("sys_info", b""), ("storages", storages), ("tensors", tensors), ("pickle", main)]:
            data = blob.getvalue() if isinstance(blob, io.BytesIO) else blob
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    loaded = torch_load(tmp_path / "old.pt")
    np.testing.assert_array_equal(loaded["w"].numpy(), w.reshape(4, 3).T)
    assert loaded["v"].tolist() == [3.0, 4.0]


class Evil:
    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


class EvalEvil:
    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self) -> Any:
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


@pytest.mark.parametrize("evil_cls", [Evil, EvalEvil])
@pytest.mark.parametrize("how", ["zip", "legacy", "raw_pickle"])
def test_torch_load_refuses_malicious_pickle(tmp_path: pathlib.Path, evil_cls: type, how: str) -> None:
    marker = tmp_path / "pwned"
    payload = {"w": torch.ones(2), "x": evil_cls(marker)}
    fn = tmp_path / "evil.pt"
    if how == "raw_pickle":
        fn.write_bytes(pickle.dumps(payload["x"]))
    else:
        torch.save(payload, fn, _use_new_zipfile_serialization=how == "zip")
    with pytest.raises(UnsafePickleError, match="refused to load the global (posix|os|nt|builtins|__builtin__)"):
        torch_load(fn)
    assert not marker.exists()


def test_torch_load_refuses_pickled_modules(tmp_path: pathlib.Path) -> None:
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    with pytest.raises(UnsafePickleError, match="state dict"):
        torch_load(tmp_path / "module.pt")


def test_torch_load_rejects_files_that_are_not_checkpoints(tmp_path: pathlib.Path) -> None:
    (tmp_path / "junk.pt").write_bytes(b"hello, this is not a checkpoint" * 20)
    with pytest.raises(CheckpointError, match="not a torch.save file"):
        torch_load(tmp_path / "junk.pt")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("readme.txt", "hi")
    with pytest.raises(CheckpointError, match="data.pkl"):
        torch_load(tmp_path / "other.zip")


def test_torch_load_rejects_truncated_files(tmp_path: pathlib.Path) -> None:
    torch.save({"w": torch.arange(64.0)}, tmp_path / "m.pt", _use_new_zipfile_serialization=False)
    raw = (tmp_path / "m.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        torch_load(tmp_path / "cut.pt")


# ---- archives and TensorIO ----
def test_zip_extract_gives_views_for_stored_and_bytes_for_deflated(tmp_path: pathlib.Path) -> None:
    with zipfile.ZipFile(tmp_path / "a.zip", "w") as z:
        z.writestr("stored.bin", b"\x01\x02\x03", compress_type=zipfile.ZIP_STORED)
        z.writestr("dir/deflated.txt", b"hello " * 50, compress_type=zipfile.ZIP_DEFLATED)
    members = zip_extract(tmp_path / "a.zip")
    assert members["stored.bin"].device.startswith("DISK:") and members["stored.bin"].tolist() == [1, 2, 3]
    assert bytes(members["dir/deflated.txt"].numpy()) == b"hello " * 50


def test_tar_extract_reads_gzipped_tar(tmp_path: pathlib.Path) -> None:
    with tarfile.open(tmp_path / "a.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("x.bin")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"abcd"))
    assert {k: bytes(v.numpy()) for k, v in tar_extract(tmp_path / "a.tar.gz").items()} == {"x.bin": b"abcd"}


def test_tensorio_seeks_and_reads_like_a_file() -> None:
    f = TensorIO(Tensor(bytes(range(100))))
    assert f.read(3) == b"\x00\x01\x02" and f.tell() == 3
    f.seek(-2, io.SEEK_END)
    assert f.read() == b"\x62\x63" and f.read(5) == b""
    f.seek(10)
    f.seek(5, io.SEEK_CUR)
    assert f.read(2) == b"\x0f\x10" and len(f) == 100
    with pytest.raises(DTypeError, match="uint8"):
        TensorIO(Tensor([1.0, 2.0]))


# ---- get_state_dict / get_parameters ----
class Point(NamedTuple):
    x: Tensor
    y: Tensor


class Block:
    def __init__(self) -> None:
        self.w = Tensor([1.0, 2.0])
        self.cfg = {"scale": Tensor([3.0]), "name": "blk"}
        self.pair = Point(Tensor([4.0]), Tensor([5.0]))
        self.np = np  # a module attribute is not walked
        self.parent: Any = None


class Net:
    def __init__(self) -> None:
        self.blocks = [Block(), Block()]
        self.head = (Tensor([6.0]),)
        for b in self.blocks:
            b.parent = self  # a cycle


def test_get_state_dict_walks_attributes_dicts_lists_and_namedtuples() -> None:
    net = Net()
    sd = get_state_dict(net)
    assert list(sd) == [
        *(f"blocks.{i}.{k}" for i in range(2) for k in ("w", "cfg.scale", "pair.x", "pair.y")),
        "head.0",
    ]
    assert sd["blocks.1.pair.y"] is net.blocks[1].pair.y
    assert list(get_state_dict(Block(), prefix="enc.")) == ["enc.w", "enc.cfg.scale", "enc.pair.x", "enc.pair.y"]
    assert list(get_state_dict({"a": [Tensor([1])], 3: {"b": Tensor([2])}})) == ["a.0", "3.b"]
    assert [t.shape for t in get_parameters(net)] == [(2,), (1,), (1,), (1,)] * 2 + [(1,)]


def test_get_state_dict_with_tensor_type_filters() -> None:
    class Marked(Tensor):
        __slots__ = ()

    obj = {"a": Marked([1.0]), "b": Tensor([2.0])}
    assert list(get_state_dict(obj, tensor_type=Marked)) == ["a"]


# ---- load_state_dict ----
class Small:
    def __init__(self, device: str | None = None) -> None:
        self.w = Tensor.zeros(2, 3, device=device).contiguous().realize()
        self.b = Tensor.zeros(3, device=device).contiguous().realize()
        self.s = Tensor.zeros(1, device=device).contiguous().realize()


def test_load_state_dict_from_safetensors_onto_device(xgrad_device: str, tmp_path: pathlib.Path) -> None:
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    safe_save(
        {"w": Tensor(w), "b": Tensor([7.0, 8.0, 9.0]), "s": Tensor(np.array(0.5, np.float32))},
        tmp_path / "m.safetensors",
    )
    model = Small(xgrad_device)
    before = model.w.uop.base
    load_state_dict(model, safe_load(tmp_path / "m.safetensors"), verbose=False)
    assert model.w.device == xgrad_device and model.w.uop.base is before  # written in place
    np.testing.assert_array_equal(model.w.numpy(), w)
    assert model.b.tolist() == [7.0, 8.0, 9.0] and model.s.tolist() == [0.5]  # () loaded into (1,)


def test_load_state_dict_shape_mismatch_names_key_and_shapes() -> None:
    model = Small()
    sd = {"w": Tensor.ones(3, 2), "b": Tensor.ones(3), "s": Tensor.ones(1)}
    with pytest.raises(ShapeError, match=r"'w' has shape \(3, 2\) in the state dict but \(2, 3\) in the model"):
        load_state_dict(model, sd, verbose=False)
    assert model.b.tolist() == [0.0, 0.0, 0.0]  # nothing loaded


def test_load_state_dict_missing_keys_strict_and_not(capsys: Any) -> None:
    model = Small()
    sd = {"w": Tensor.ones(2, 3), "extra.weight": Tensor.ones(1)}
    with pytest.raises(StateDictError, match=r"2 model tensor\(s\) missing.*'b', 's'.*'extra.weight'.*strict=False"):
        load_state_dict(model, sd, verbose=False)
    assert model.w.tolist() == [[0.0] * 3] * 2
    load_state_dict(model, sd, strict=False, verbose=True)
    out = capsys.readouterr().out
    assert "'extra.weight'" in out and "not loading 2" in out and "loaded 1 tensors" in out
    assert model.w.tolist() == [[1.0] * 3] * 2 and model.b.tolist() == [0.0] * 3


def test_load_state_dict_unexpected_keys_are_not_an_error_when_strict() -> None:
    model = Small()
    sd = {"w": Tensor.ones(2, 3), "b": Tensor.ones(3), "s": Tensor.ones(1), "other": Tensor.ones(5)}
    load_state_dict(model, sd, verbose=False)
    assert model.s.tolist() == [1.0]


def test_load_state_dict_casts_consumes_and_stays_lazy() -> None:
    model = Small()
    model.b = Tensor.zeros(3)  # lazy: replaced without computing the initializer
    sd = {"w": Tensor.ones(2, 3, dtype=dtypes.float16), "b": Tensor([1, 2, 3]), "s": Tensor([4.0])}
    load_state_dict(model, sd, verbose=False, consume=True, realize=False)
    assert sd == {}
    assert model.w.dtype == dtypes.float32 and model.b.dtype == dtypes.float32
    assert model.w.tolist() == [[1.0] * 3] * 2 and model.b.tolist() == [1.0, 2.0, 3.0] and model.s.tolist() == [4.0]


def test_load_state_dict_from_torch_checkpoint(tmp_path: pathlib.Path) -> None:
    lin = torch.nn.Linear(3, 2)
    torch.save(lin.state_dict(), tmp_path / "lin.pt")

    class Lin:
        def __init__(self) -> None:
            self.weight = Tensor.zeros(2, 3).contiguous().realize()
            self.bias = Tensor.zeros(2).contiguous().realize()

    model = Lin()
    load_state_dict(model, torch_load(tmp_path / "lin.pt"), verbose=False)
    x = np.arange(3, dtype=np.float32)
    ours = Tensor(x) @ model.weight.T + model.bias
    np.testing.assert_allclose(ours.numpy(), lin(torch.from_numpy(x)).detach().numpy(), rtol=1e-6)
    np.testing.assert_array_equal(model.weight.numpy(), lin.weight.detach().numpy())


# ---- docstrings ----
@pytest.mark.parametrize(
    "name", ["xgrad.nn.state", "xgrad.nn.safetensors", "xgrad.nn.torch_load", "xgrad.nn.fileview", "xgrad.nn.archives"]
)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), verbose=False, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
