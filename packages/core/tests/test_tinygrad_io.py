"""tinygrad compatibility, data access and IO: `Tensor.data()`'s memoryview (format, itemsize, shape), `Tensor.const`,
`Tensor(bytes)`, file tensors read and written the way tinygrad code does (slices read like seeks, setitem and assign
written to the file at once, tinygrad's RuntimeError for a view DISK cannot read), `tar_extract`'s error types, numpy
input that is not aligned, and assigning a single-device value to a multi-device tensor. Oracles: numpy, struct, the
bytes in the file."""

from __future__ import annotations

import io
import pathlib
import struct
import sys
import tarfile

import numpy as np
import pytest

from xgrad import Device, Tensor, Variable, dtypes
from xgrad.nn.state import tar_extract


# ---- Tensor.data() ----
@pytest.mark.parametrize(
    ("dtype", "np_dtype", "fmt"),
    [
        (dtypes.float32, np.float32, "f"),
        (dtypes.float64, np.float64, "d"),
        (dtypes.int8, np.int8, "b"),
        (dtypes.uint8, np.uint8, "B"),
        (dtypes.int16, np.int16, "h"),
        (dtypes.uint16, np.uint16, "H"),
        (dtypes.int32, np.int32, "i"),
        (dtypes.uint32, np.uint32, "I"),
        (dtypes.int64, np.int64, "q"),
        (dtypes.uint64, np.uint64, "Q"),
        (dtypes.bool, np.bool_, "?"),
    ],
)
def test_data_is_a_memoryview_in_the_dtypes_struct_format(dtype: object, np_dtype: type, fmt: str) -> None:
    a = np.array([[1, 0, 3], [4, 5, 0]]).astype(np_dtype)
    mv = Tensor(a, dtype=dtype).data()
    assert mv.format == fmt and mv.itemsize == struct.calcsize(fmt) == a.itemsize
    assert mv.shape == (2, 3) and mv.tolist() == a.tolist()
    assert mv.nbytes == a.nbytes and bytes(mv) == a.tobytes()


def test_data_of_a_0d_and_an_empty_tensor() -> None:
    mv = Tensor(3, dtype=dtypes.int32).data()
    assert (mv.format, mv.itemsize, mv.shape, mv.tolist()) == ("i", 4, (), 3)
    for empty in (Tensor([], dtype=dtypes.int32), Tensor([], dtype=dtypes.int32).reshape(0, 2)):
        mv = empty.data()
        assert (mv.format, mv.itemsize, mv.shape, list(mv)) == ("i", 4, (0,), [])


def test_data_of_half_follows_what_memoryview_can_cast() -> None:
    a = np.array([[1, 2.5], [3, 4]], dtype=np.float16)
    mv = Tensor(a).data()
    if sys.version_info >= (3, 12):
        assert (mv.format, mv.shape) == ("e", (2, 2))
    else:  # memoryview cannot cast to 'e' before 3.12: the raw bytes
        assert mv.format == "B"
    assert bytes(mv) == a.tobytes()


def test_data_of_a_view_and_of_lazy_work() -> None:
    t = Tensor.arange(12, dtype=dtypes.float32).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(t[1:, ::2].data()), np.arange(12.0).reshape(3, 4)[1:, ::2])
    assert struct.unpack("<2f", bytes((t[0, :2] * 2 + 1).data())) == (1.0, 3.0)


# ---- Tensor.const and Tensor(bytes) ----
def test_tensor_const() -> None:
    c = Tensor.const(2.5)
    assert c.shape == () and c.dtype == dtypes.float32 and c.item() == 2.5
    assert Tensor.const(3, dtypes.int8).dtype == dtypes.int8 and Tensor.const(True).dtype == dtypes.bool
    v = Variable("x", 1, 10)
    assert Tensor.const(v.bind(5), dtypes.int32).item() == 5
    assert (Tensor.const(v.bind(7), dtypes.int32) * 2).item() == 14


def test_tensor_from_bytes() -> None:
    assert Tensor(b"\xaa\xbb\xcc\xdd").tolist() == [170, 187, 204, 221]
    t = Tensor(struct.pack("ff", 0.234, 0.8585), dtype=dtypes.float32)  # the bytes are the float32 values
    assert t.shape == (2,)
    np.testing.assert_allclose(t.numpy(), [0.234, 0.8585], rtol=1e-6)
    assert Tensor(struct.pack("<3h", -2, 7, 300), dtype=dtypes.int16).tolist() == [-2, 7, 300]
    with pytest.raises(ValueError, match="multiple of"):
        Tensor(b"\x00" * 6, dtype=dtypes.float32)
    # bfloat16 (no numpy dtype): the bytes are bfloat16 bit patterns; a float32 with them as its top half is the value
    bits = np.array([0x3F80, 0xC020, 0x7F80, 0x0001, 0x4049], dtype=np.uint16)
    want = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(Tensor(bits.tobytes(), dtype=dtypes.bfloat16).numpy(), want)


def test_unaligned_and_strided_numpy_input() -> None:
    raw = np.zeros(8 * 4 + 1, dtype=np.uint8)
    a = raw[1:].view(np.float32)  # data pointer 1 byte past an aligned address
    a[:] = np.arange(8, dtype=np.float32) * 1.5
    assert not a.flags.aligned or a.ctypes.data % 4 != 0
    np.testing.assert_array_equal(Tensor(a).numpy(), a)
    b = np.arange(24, dtype=np.int64).reshape(4, 6)[:, ::-2]
    np.testing.assert_array_equal(Tensor(b).numpy(), b)


# ---- file (DISK) tensors ----
def _disk(tmp_path: pathlib.Path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return f"disk:{p}"


def test_file_tensor_slices_read_like_seeks(tmp_path: pathlib.Path) -> None:
    data = bytes(range(256)) * 4
    (tmp_path / "f.bin").write_bytes(data)
    t = Tensor(tmp_path / "f.bin")
    assert t.shape == (1024,) and t.dtype == dtypes.uint8 and t.device.startswith("DISK:")
    for start, stop in [(0, 16), (300, 333), (1000, 1024), (777, 778)]:  # read in place: no kernel on DISK
        assert bytes(t[start:stop].numpy()) == data[start:stop]
    assert bytes(t[5:9].data()) == data[5:9]
    grid = Tensor.empty(16, 16, device=_disk(tmp_path, "g.bin", bytes(range(256))), dtype=dtypes.uint8)
    assert grid[1].to(Device.DEFAULT).tolist() == list(range(16, 32)) == grid[1].tolist()
    np.testing.assert_array_equal(grid[2:4].numpy(), np.arange(32, 64).reshape(2, 16))


def test_file_tensor_copies_from_any_offset(tmp_path: pathlib.Path) -> None:
    data = bytes(range(256)) * 64
    dev = _disk(tmp_path, "big.bin", data)
    for off in [314, 991, 2048, 4095]:
        t = Tensor.empty(len(data), device=dev, dtype=dtypes.uint8)[off:]
        on_dev = t.to(Device.DEFAULT).realize()
        assert bytes(on_dev.numpy()) == data[off:] == bytes(t.numpy())


def test_non_contiguous_disk_views_raise_runtime_error(tmp_path: pathlib.Path) -> None:
    dt = Tensor([0, 1, 2, 3, 4, 5]).to(f"disk:{tmp_path / 's.bin'}")
    with pytest.raises(RuntimeError, match="non-contiguous view is not supported"):
        dt[::2].tolist()
    with pytest.raises(RuntimeError, match="non-contiguous view is not supported"):
        dt.reshape(2, 3).T.tolist()
    with pytest.raises(RuntimeError, match="non-contiguous view is not supported"):
        dt[::2] = Tensor([10, 20, 30])


def test_disk_setitem_writes_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "w.bin"
    dt = Tensor([[1], [2]], dtype=dtypes.int32).to(f"disk:{path}")
    dt[1] = [3]
    assert dt.tolist() == [[1], [3]]
    assert np.frombuffer(path.read_bytes(), dtype=np.int32).tolist() == [1, 3]
    x = Tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=dtypes.int32).to(f"disk:{tmp_path / 'x.bin'}")
    want = np.array([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=np.int32)
    for index, value in [(slice(0, 1), [[13, 12, 11, 10]]), ((1, slice(1, 3)), Tensor([8, 9], dtype=dtypes.int32))]:
        x[index] = value
        want[index] = value.numpy() if isinstance(value, Tensor) else value
    np.testing.assert_array_equal(x.numpy(), want)
    with pytest.raises(RuntimeError, match="advanced setitem"):
        x[Tensor([0, 1]), Tensor([1, 3])] = 99


def test_disk_assign_from_other_devices_and_constants(tmp_path: pathlib.Path) -> None:
    t = Tensor.empty(4, device=f"disk:{tmp_path / 'a.bin'}", dtype=dtypes.float32)
    t.assign(Tensor([1.0, 2.0, 3.0, 4.0]))  # a CPU value, written at once (no realize needed, as in tinygrad)
    assert np.frombuffer((tmp_path / "a.bin").read_bytes(), dtype=np.float32).tolist() == [1.0, 2.0, 3.0, 4.0]
    c = Tensor.empty(4, device=f"disk:{tmp_path / 'c.bin'}", dtype=dtypes.int32)
    c.assign(Tensor.full((4,), 42, dtype=dtypes.int32)).realize()
    assert c.numpy().tolist() == [42] * 4
    c[1:3].assign(Tensor.full((2,), 99, dtype=dtypes.int32)).realize()
    assert c.numpy().tolist() == [42, 99, 99, 42]
    ints = Tensor.empty(10, device=f"disk:{tmp_path / 'i.bin'}", dtype=dtypes.int64)
    for i in range(5):  # numpy values into slices (tinygrad's fetch_cifar does this)
        ints[2 * i : 2 * i + 2].assign(np.array([i, 3]))
    assert ints.numpy().tolist() == [0, 3, 1, 3, 2, 3, 3, 3, 4, 3]
    with pytest.raises(TypeError):
        ints[0:2].assign(Tensor([1.0, 2.0]))


def test_disk_to_disk_copy_through_the_host(tmp_path: pathlib.Path) -> None:
    src = Tensor([1, 2, 3, 4], dtype=dtypes.int32).to(f"disk:{tmp_path / 'src.bin'}")
    dst = Tensor.empty(4, device=f"disk:{tmp_path / 'dst.bin'}", dtype=dtypes.int32)
    dst.assign(src.to("CPU")).realize()
    assert (tmp_path / "dst.bin").read_bytes() == np.array([1, 2, 3, 4], dtype=np.int32).tobytes()


def test_disk_bitcasts_are_views_of_the_file(tmp_path: pathlib.Path) -> None:
    data = bytes(range(256)) * 2
    t = Tensor.empty(16, 32, device=_disk(tmp_path, "b.bin", data), dtype=dtypes.uint8)
    want = np.frombuffer(data, dtype=np.uint8).reshape(16, 32)[1].view(np.uint16)
    assert t[1].bitcast(dtypes.uint16).to(Device.DEFAULT).tolist() == want.tolist()
    assert t.bitcast(dtypes.uint16)[1].tolist() == want.tolist()
    (tmp_path / "v.bin").write_bytes(bytes(range(10, 24)))
    v = Tensor.empty(3, dtype=dtypes.uint32, device=f"disk:{tmp_path / 'v.bin'}").shrink([(0, 2)])
    got = (v.bitcast(dtypes.uint16).to("CPU") + 1).tolist()
    assert got == (np.frombuffer(bytes(range(10, 18)), dtype=np.uint16) + 1).tolist()


def test_assign_through_a_disk_bitcast(tmp_path: pathlib.Path) -> None:
    t = Tensor.empty(32, device=_disk(tmp_path, "h.bin", bytes(32)), dtype=dtypes.uint8)
    t[0:8].bitcast(dtypes.int64).assign([12345])  # how a header length is written
    assert int.from_bytes(t[0:8].data(), "little") == 12345
    floats = t[8:24].bitcast(dtypes.float32)
    floats.assign(Tensor([1.0, 2.0, 3.0, 4.0], dtype=dtypes.float32, device="CPU"))
    assert floats.numpy().tolist() == [1.0, 2.0, 3.0, 4.0]
    raw = (tmp_path / "h.bin").read_bytes()
    assert raw[8:24] == np.array([1, 2, 3, 4], dtype=np.float32).tobytes() and raw[:8] == (12345).to_bytes(8, "little")
    with pytest.raises(ValueError, match="whole number"):
        t[0:6].bitcast(dtypes.float32)


# ---- tar_extract ----
def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def test_tar_extract_members_and_errors(tmp_path: pathlib.Path) -> None:
    files = {"file1.txt": b"Hello, World!", "file2.bin": b"\x00\x01\x02\x03\x04", "empty.txt": b""}
    (tmp_path / "t.tar").write_bytes(_tar(files))
    for source in (str(tmp_path / "t.tar"), Tensor(tmp_path / "t.tar"), Tensor(_tar(files))):
        got = tar_extract(source)
        assert sorted(got) == sorted(files) and len(got["empty.txt"]) == 0
        for name, content in files.items():
            assert bytes(got[name].numpy()) == content
    with pytest.raises(FileNotFoundError):
        tar_extract(str(tmp_path / "missing.tar"))
    with pytest.raises(FileNotFoundError):
        tar_extract(Tensor(pathlib.Path(tmp_path / "missing.tar")))
    for bad in (b"This is not a valid tar file", b"This is not a valid tar file" * 100):
        with pytest.raises(tarfile.ReadError):
            tar_extract(Tensor(bad))
    with pytest.raises(ValueError, match="not a valid tar archive"):  # also xgrad's CheckpointError
        tar_extract(Tensor(b"x" * 1024))


# ---- multi-device assign ----
def test_multi_device_assign_from_a_single_device_value() -> None:
    devs = (Device.DEFAULT, f"{Device.DEFAULT}:1")
    rep = Tensor.zeros(4).contiguous().to(devs).realize()
    rep.assign(Tensor([1.0, 2.0, 3.0, 4.0])).realize()
    assert rep.device == devs and rep.tolist() == [1.0, 2.0, 3.0, 4.0]
    sh = Tensor.zeros(4, 2).contiguous().shard(devs, axis=0).realize()
    value = np.arange(8, dtype=np.float32).reshape(4, 2)
    sh.assign(Tensor(value)).realize()
    assert sh.shard_axis == 0
    np.testing.assert_array_equal(sh.numpy(), value)


# ---- sharding ----
def _devices(n: int) -> tuple[str, ...]:
    return tuple(f"{Device.DEFAULT}:{i}" for i in range(n))


def test_shard_that_does_not_divide_raises_runtime_error() -> None:
    x = Tensor.ones(256).contiguous().realize()
    with pytest.raises(RuntimeError, match="multiple of 3"):
        x.shard_(_devices(3), 0)
    with pytest.raises(RuntimeError):
        Tensor.arange(15).reshape(3, 5).shard(_devices(2), axis=1)


@pytest.mark.parametrize("axis", [0, 1, -1, None])
def test_2d_tensor_sharded_on_either_axis_like_numpy(axis: int | None) -> None:
    a = np.arange(48, dtype=np.float32).reshape(4, 12)
    t = Tensor(a).shard(_devices(4), axis=axis)
    assert t.uop.axis == (None if axis is None else axis % 2) == t.shard_axis
    if axis is not None:
        n = a.shape[axis]
        assert t.uop.bounds == [(k * n // 4, (k + 1) * n // 4) for k in range(4)]
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_allclose((t * 2 + 1).sum(axis=1).numpy(), (a * 2 + 1).sum(axis=1))
    np.testing.assert_allclose((t @ Tensor(a.T).to(t.device)).numpy(), a @ a.T, rtol=1e-6)


def _np_batchnorm(x: np.ndarray, eps: float = 1e-5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(normalised x, batch mean, unbiased batch variance) per channel (axis 1)."""
    axes = (0, 2, 3)
    mean, var = x.mean(axes), x.var(axes)
    out = (x - mean.reshape(1, -1, 1, 1)) / np.sqrt(var.reshape(1, -1, 1, 1) + eps)
    n = x.size // x.shape[1]
    return out, mean, var * n / (n - 1)


def test_batchnorm_statistics_per_shard() -> None:
    from xgrad import Context, nn
    from xgrad.nn.state import get_parameters

    devices = _devices(4)
    a = np.random.default_rng(0).standard_normal((8, 3, 4, 4)).astype(np.float32) * 2 + 1
    x = Tensor(a).shard(devices, axis=0)
    with Context(TRAINING=1):
        bns = []
        for _ in devices:
            bn = nn.BatchNorm2d(3)
            for p in get_parameters(bn):
                p.shard_(devices)
            bns.append(bn)
        outs = [bn(x[b0:b1]) for (b0, b1), bn in zip(x.uop.bounds, bns, strict=True)]
        got = outs[0].cat(*outs[1:]).numpy()
    for k, ((b0, b1), bn) in enumerate(zip(x.uop.bounds, bns, strict=True)):
        want, mean, var = _np_batchnorm(a[b0:b1])
        np.testing.assert_allclose(got[b0:b1], want, rtol=1e-4, atol=1e-4, err_msg=f"shard {k}")
        np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * mean, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(bn.running_var.numpy(), 0.9 + 0.1 * var, rtol=1e-4)


def test_batchnorm_over_a_sharded_batch_uses_the_whole_batch() -> None:
    from xgrad import Context, nn
    from xgrad.nn.state import get_state_dict

    devices = _devices(2)
    a = np.random.default_rng(1).standard_normal((4, 3, 2, 2)).astype(np.float32)
    bn = nn.BatchNorm2d(3)
    for p in get_state_dict(bn).values():
        p.shard_(devices)
    with Context(TRAINING=1):
        got = bn(Tensor(a).shard(devices, axis=0)).numpy()
    want, mean, _ = _np_batchnorm(a)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * mean, rtol=1e-4, atol=1e-6)
