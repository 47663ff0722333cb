"""Multi-device tensors on logical CPU devices (CPU, CPU:1, ...): sharding, per-shard ops, allreduce, autograd,
data-parallel training and TinyJit, checked against numpy, torch and the same program on one device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from xgrad import Context, Device, Tensor, TinyJit, nn
from xgrad.engine.multi import schedule_multi
from xgrad.engine.schedule import ScheduleStats, create_schedule
from xgrad.errors import DeviceError, XgradError
from xgrad.mixin.multi import ShardingError
from xgrad.nn.optim import SGD, Adam
from xgrad.nn.state import get_parameters

D2 = ("CPU", "CPU:1")
D4 = ("CPU", "CPU:1", "CPU:2", "CPU:3")


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _schedule(t: Tensor) -> list[Any]:
    items, _, _ = schedule_multi([t.uop], create_schedule)
    return items


# ---- device names ----
def test_canonicalize_index0_and_case() -> None:
    assert Device.canonicalize("cpu:0") == "CPU"
    assert Device.canonicalize("cpu:2") == "CPU:2"
    assert Tensor([1, 2]).shard(("cpu:0", "cpu:1")).device == D2


def test_cpu_index_devices_have_own_buffers_and_copy_items() -> None:
    a = Tensor([1.0, 2.0], device="CPU:1")
    b = a.to("CPU")
    items = _schedule(b)
    assert [it.is_copy for it in items] == [True]
    assert items[0].bufs[0].device == "CPU" and items[0].bufs[1].device == "CPU:1"
    assert b.tolist() == [1.0, 2.0] and a.device == "CPU:1"


def test_device_item_of_multi_name_raises() -> None:
    with pytest.raises(DeviceError, match="several devices"):
        Device[Device.canonicalize(D2)]


# ---- shard / gather ----
@pytest.mark.parametrize("devices", [D2, D4])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_shard_round_trip(devices: tuple[str, ...], axis: int | None) -> None:
    a = _data(4, 8)
    t = Tensor(a).shard(devices, axis)
    assert t.device == devices and t.shape == (4, 8) and t.shard_axis == axis
    np.testing.assert_array_equal(t.numpy(), a)
    t.realize()
    assert t.shard_axis == axis
    gathered = t.to("CPU:1")
    assert gathered.device == "CPU:1"
    np.testing.assert_array_equal(gathered.numpy(), a)


def test_shard_uneven_axis_raises_runtime_error() -> None:
    with pytest.raises(ShardingError, match=r"shape \(3, 4\).*axis 0.*4 devices"):
        Tensor(_data(3, 4)).shard(D4, axis=0)
    with pytest.raises(RuntimeError):
        Tensor(_data(3, 4)).shard(D2, axis=0)


def test_shard_in_place_like_and_to_tuple_replicates() -> None:
    a = _data(4, 6)
    t = Tensor(a)
    assert t.shard_(D2, axis=1) is t and t.shard_axis == 1
    y = Tensor(a * 2).shard_like(t)
    assert y.device == D2 and y.shard_axis == 1
    r = Tensor(a).to(D4)
    assert r.device == D4 and r.shard_axis is None
    np.testing.assert_array_equal((t + y).numpy(), a * 3)
    resharded = t.shard(D2, axis=0)
    assert resharded.shard_axis == 0
    np.testing.assert_array_equal(resharded.numpy(), a)


def test_tensor_from_list_on_device_tuple() -> None:
    t = Tensor([[1.0, 2.0], [3.0, 4.0]], device=D2)
    assert t.device == D2 and t.shard_axis is None
    assert t.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_creation_on_device_tuple() -> None:
    e = Tensor.empty(4, 4, device=D2)
    assert e.device == D2 and e.shard_axis is None
    e.assign(Tensor.ones(4, 4).shard(D2, 0)).realize()
    e.assign(e * 3).realize()
    np.testing.assert_array_equal(e.numpy(), np.full((4, 4), 3.0, np.float32))
    assert Tensor.zeros(2, 3, device=D2).tolist() == [[0.0] * 3] * 2
    assert Tensor.arange(4, device=D2).tolist() == [0, 1, 2, 3]
    r = Tensor.rand(8, device=D2)
    assert r.device == D2 and ((r.numpy() >= 0) & (r.numpy() < 1)).all()


def test_to_in_place_moves_grad() -> None:
    w = Tensor([1.0, 2.0])
    (w * w).sum().backward()
    assert w.to_(D2) is w and w.device == D2
    assert w.grad is not None and w.grad.device == D2
    assert w.grad.tolist() == [2.0, 4.0]


def test_reshard_onto_other_devices() -> None:
    a = _data(4, 2)
    b = Tensor(a).shard(D2, 0).shard(("CPU:2", "CPU:3"), 1)
    assert b.device == ("CPU:2", "CPU:3") and b.shard_axis == 1
    np.testing.assert_array_equal(b.numpy(), a)


def test_devices_of_different_backends() -> None:
    a = _data(4, 3)
    t = Tensor(a).shard(("CPU", "PYTHON:1"), 0)
    np.testing.assert_allclose((t * 2).sum(0).numpy(), (a * 2).sum(0), rtol=1e-6)


def test_load_state_dict_into_sharded_model() -> None:
    from xgrad.nn.state import get_state_dict, load_state_dict

    model = nn.Linear(4, 2)
    for p in get_state_dict(model).values():
        p.shard_(D2, 0).realize()
    w, bias = _data(2, 4), _data(2, seed=1)
    load_state_dict(model, {"weight": Tensor(w), "bias": Tensor(bias)}, verbose=False)
    assert model.weight.device == D2 and model.weight.shard_axis == 0
    x = _data(3, 4, seed=2)
    np.testing.assert_allclose(model(Tensor(x).to(D2)).numpy(), x @ w.T + bias, rtol=1e-5, atol=1e-6)


def test_assign_into_shards_and_across_split_axis() -> None:
    want = np.zeros((8, 8), np.float32)
    t = Tensor.zeros(8, 8).contiguous().shard(D4, 0).realize()
    t[:, 1:3].assign(Tensor.ones(8, 2).shard(D4, 0)).realize()  # inside every shard
    want[:, 1:3] = 1
    v = np.arange(12, dtype=np.float32).reshape(3, 4)
    t[1:4, 2:6].assign(Tensor(v).to(D4)).realize()  # rows 1-3 span the shards of CPU and CPU:1
    want[1:4, 2:6] = v
    np.testing.assert_array_equal(t.numpy(), want)
    assert t.device == D4 and t.shard_axis == 0
    with pytest.raises(XgradError, match="moves the split axis"):
        t.flip(0).assign(Tensor.zeros(8, 8).to(D4)).realize()


def test_mixing_single_and_multi_device_raises() -> None:
    with pytest.raises(XgradError, match="different devices"):
        Tensor([1.0, 2.0]).shard(D2) + Tensor([1.0, 2.0])


# ---- per-shard ops ----
@pytest.mark.parametrize("devices", [D2, D4])
def test_elementwise_matching_and_mismatched_sharding(devices: tuple[str, ...]) -> None:
    a, b = _data(4, 8), _data(4, 8, seed=1)
    x0, x1, xr = Tensor(a).shard(devices, 0), Tensor(b).shard(devices, 1), Tensor(b).to(devices)
    np.testing.assert_allclose((x0 * 2 + 1).numpy(), a * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose((x0 + x1).numpy(), a + b, rtol=1e-6)
    np.testing.assert_allclose((x0 * xr).exp().numpy(), np.exp(a * b), rtol=1e-5)
    assert (x0 + xr).shard_axis == 0 and (xr + x1).shard_axis == 1
    np.testing.assert_array_equal((x0 < x1).numpy(), a < b)


@pytest.mark.parametrize("devices", [D2, D4])
@pytest.mark.parametrize("axis", [0, 1])
def test_movement_ops(devices: tuple[str, ...], axis: int) -> None:
    a = _data(4, 8)
    t = Tensor(a).shard(devices, axis)
    np.testing.assert_array_equal(t.T.numpy(), a.T)
    assert t.T.shard_axis == 1 - axis
    np.testing.assert_array_equal(t.reshape(2, 2, 8).numpy(), a.reshape(2, 2, 8))
    np.testing.assert_array_equal(t.reshape(32).numpy(), a.reshape(32))
    np.testing.assert_array_equal(t.reshape(4, 8, 1).expand(4, 8, 3).numpy(), np.broadcast_to(a[..., None], (4, 8, 3)))
    np.testing.assert_array_equal(t[1:3].numpy(), a[1:3])
    np.testing.assert_array_equal(t[:, 2:7].numpy(), a[:, 2:7])
    np.testing.assert_array_equal(t.pad(((1, 0), (0, 2))).numpy(), np.pad(a, ((1, 0), (0, 2))))
    np.testing.assert_array_equal(t.flip(0).numpy(), a[::-1])
    np.testing.assert_array_equal(t.flip(1).numpy(), a[:, ::-1])


def test_slice_across_shards_copies_only_its_parts() -> None:
    a = np.arange(32, dtype=np.float32).reshape(8, 4)
    t = Tensor(a).shard(D4, 0).realize()
    y = t[1:3]  # row 1 lives on CPU, row 2 on CPU:1
    assert y.shard_axis is None
    assert [it.bufs[0].size for it in _schedule(y) if it.is_copy] == [4] * 6
    np.testing.assert_array_equal(y.numpy(), a[1:3])


def test_reshape_keeps_shard_boundaries() -> None:
    t = Tensor(_data(4, 8)).shard(D2, axis=0)
    assert t.reshape(2, 2, 8).shard_axis == 0
    assert t.reshape(8, 4).shard_axis == 0
    assert Tensor(_data(4, 8)).shard(D2, axis=1).reshape(4, 2, 4).shard_axis == 1


@pytest.mark.parametrize("devices", [D2, D4])
@pytest.mark.parametrize("x_axis", [None, 0, 1])
@pytest.mark.parametrize("w_axis", [None, 0, 1])
def test_matmul_every_sharding(devices: tuple[str, ...], x_axis: int | None, w_axis: int | None) -> None:
    a, w = _data(8, 12), _data(12, 4, seed=1)
    out = Tensor(a).shard(devices, x_axis) @ Tensor(w).shard(devices, w_axis)
    assert out.device == devices
    np.testing.assert_allclose(out.numpy(), a @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("devices", [D2, D4])
@pytest.mark.parametrize("axis", [0, 1])
def test_reductions_over_sharded_and_other_axes(devices: tuple[str, ...], axis: int) -> None:
    a = _data(4, 8)
    t = Tensor(a).shard(devices, axis)
    for dim in (0, 1, None):
        np.testing.assert_allclose(t.sum(dim).numpy(), a.sum(dim), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(t.mean(dim).numpy(), a.mean(dim), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(t.max(dim).numpy(), a.max(dim))
    assert t.sum(axis).shard_axis is None  # an allreduce leaves every device with the whole result
    assert t.sum(1 - axis).shard_axis == 0  # the other axis is reduced away: the split axis is now axis 0


def test_composite_ops_along_split_axis() -> None:
    a = _data(8, 4)
    t = Tensor(a).shard(D4, 0)
    np.testing.assert_allclose(t.prod(0).numpy(), a.prod(0), rtol=1e-4)
    np.testing.assert_allclose(t.softmax(0).numpy(), np.exp(a) / np.exp(a).sum(0), rtol=1e-4)
    np.testing.assert_allclose(t.cumsum(0).numpy(), a.cumsum(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(t.argmax(0).numpy(), a.argmax(0))
    np.testing.assert_array_equal(Tensor.cat(t, t, dim=0).numpy(), np.concatenate([a, a]))
    np.testing.assert_array_equal(t[::2].numpy(), a[::2])
    np.testing.assert_allclose((t.T @ t).numpy(), a.T @ a, rtol=1e-4, atol=1e-5)


# ---- allreduce strategies ----
def test_ring_and_naive_allreduce_agree_and_ring_copies_chunks() -> None:
    a = np.random.default_rng(0).integers(-8, 8, (8, 30)).astype(np.float32)  # exact sums: any order agrees
    t = Tensor(a).shard(D4, axis=0).realize()
    with Context(RING=0):
        naive_items = _schedule(t.sum(0))
        naive = t.sum(0).numpy()
    with Context(RING=2):
        ring_items = _schedule(t.sum(0))
        ring = t.sum(0).numpy()
    np.testing.assert_array_equal(naive, a.sum(0))
    np.testing.assert_array_equal(ring, naive)
    naive_copies = [it.bufs[0].size for it in naive_items if it.is_copy]
    ring_copies = [it.bufs[0].size for it in ring_items if it.is_copy]
    assert naive_copies == [30] * 12  # every partial to every other device
    assert sorted(ring_copies) == sorted([7, 7, 8, 8] * 6)  # 4 chunks, 3 reduce-scatter + 3 all-gather steps


def test_forced_ring_on_two_devices_matches_naive() -> None:
    a = np.random.default_rng(1).integers(-8, 8, (4, 5)).astype(np.float32)
    t = Tensor(a).shard(D2, axis=0).realize()
    with Context(RING=2):
        ring = t.sum(0).numpy()
        assert sorted(it.bufs[0].size for it in _schedule(t.sum(0)) if it.is_copy) == [2, 2, 3, 3]
    with Context(RING=0):
        np.testing.assert_array_equal(t.sum(0).numpy(), ring)
    np.testing.assert_array_equal(ring, a.sum(0))


def test_ring_threshold_picks_ring_for_big_reductions() -> None:
    t = Tensor(_data(8, 64)).shard(D4, axis=0).realize()
    with Context(RING=1, RING_ALLREDUCE_THRESHOLD=32):
        assert any(it.is_copy and it.bufs[0].size == 16 for it in _schedule(t.sum(0)))
    with Context(RING=1, RING_ALLREDUCE_THRESHOLD=1 << 20):
        assert all(it.bufs[0].size == 64 for it in _schedule(t.sum(0)) if it.is_copy)


# ---- autograd ----
@pytest.mark.parametrize("devices", [D2, D4])
def test_gradients_match_torch(devices: tuple[str, ...]) -> None:
    torch = pytest.importorskip("torch")
    a, w, v = _data(8, 6), _data(6, 4, seed=1), _data(4, seed=2)
    x, wt, vt = Tensor(a), Tensor(w), Tensor(v)
    xs, ws, vs = x.shard(devices, 0), wt.to(devices), vt.shard(devices, 0)
    loss = ((xs @ ws).relu() * vs).sum(1).max() + (xs @ ws).mean()
    gx, gw, gv = loss.gradient(x, wt, vt)
    tx, tw, tv = (torch.tensor(n, requires_grad=True) for n in (a, w, v))
    tl = ((tx @ tw).relu() * tv).sum(1).max() + (tx @ tw).mean()
    tl.backward()
    np.testing.assert_allclose(loss.numpy(), tl.detach().numpy(), rtol=1e-5)
    for got, want in ((gx, tx), (gw, tw), (gv, tv)):
        np.testing.assert_allclose(got.numpy(), want.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_backward_into_replicated_weight_stays_replicated() -> None:
    w = Tensor(_data(6, 4)).to(D2).realize()
    x = Tensor(_data(8, 6, seed=1)).shard(D2, 0)
    (x @ w).sum().backward()
    assert w.grad is not None and w.grad.device == D2 and w.grad.shard_axis is None
    np.testing.assert_allclose(w.grad.numpy(), np.broadcast_to(_data(8, 6, seed=1).sum(0)[:, None], (6, 4)), rtol=1e-5)


# ---- data-parallel training ----
class _MLP:
    def __init__(self) -> None:
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 4)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def _train(devices: tuple[str, ...] | None, opt_cls: Any, steps: int, jit: bool = False) -> list[float]:
    """Loss per step of the same MLP and data, on one device or data parallel over `devices`."""
    rng = np.random.default_rng(0)
    model = _MLP()
    for p in get_parameters(model):
        p.assign(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.3)).realize()
        if devices is not None:
            p.to_(devices).realize()
    opt = opt_cls(get_parameters(model), lr=0.05)

    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step()
        return loss.realize()

    run = TinyJit(step) if jit else step
    losses = []
    with Context(TRAINING=1):
        for i in range(steps):
            x = Tensor(rng.standard_normal((16, 8)).astype(np.float32))
            y = Tensor(rng.integers(0, 4, 16).astype(np.int32))
            if devices is not None:
                x, y = x.shard(devices, 0), y.shard(devices, 0)
            x, y = x.realize(), y.realize()
            scheduled = ScheduleStats.calls
            loss = run(x, y)
            assert not (jit and i >= 2 and ScheduleStats.calls != scheduled), "a TinyJit replay scheduled"
            losses.append(float(loss.item()))
    if devices is not None:
        assert all(p.device == devices and p.shard_axis is None for p in get_parameters(model))
    return losses


@pytest.mark.parametrize("opt_cls", [SGD, Adam])
def test_data_parallel_training_matches_one_device(opt_cls: Any) -> None:
    one = _train(None, opt_cls, steps=10)
    four = _train(D4, opt_cls, steps=10)
    assert one[-1] < one[0]
    np.testing.assert_allclose(four, one, rtol=1e-4)  # only the order of the batch sums differs


def test_tensor_parallel_training_keeps_weight_sharding() -> None:
    """l1 split on its output features, l2 on its input features (Megatron style), inputs replicated."""

    def train(devices: tuple[str, ...] | None) -> list[float]:
        rng = np.random.default_rng(0)
        model = _MLP()
        for p in get_parameters(model):
            p.assign(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.3)).realize()
        if devices is not None:
            model.l1.weight.shard_(devices, 0)
            model.l1.bias.shard_(devices, 0)
            model.l2.weight.shard_(devices, 1)
            model.l2.bias.to_(devices)
        opt = Adam(get_parameters(model), lr=0.05)
        losses = []
        with Context(TRAINING=1):
            for _ in range(4):
                x = Tensor(rng.standard_normal((16, 8)).astype(np.float32))
                y = Tensor(rng.integers(0, 4, 16).astype(np.int32))
                if devices is not None:
                    x, y = x.to(devices), y.to(devices)
                opt.zero_grad()
                loss = model(x).sparse_categorical_crossentropy(y)
                loss.backward()
                opt.step()
                losses.append(float(loss.item()))
        if devices is not None:
            assert [p.shard_axis for p in get_parameters(model)] == [0, 0, 1, None]
        return losses

    np.testing.assert_allclose(train(D4), train(None), rtol=1e-4)


def test_jitted_data_parallel_step_replays() -> None:
    eager = _train(D2, Adam, steps=5)
    jitted = _train(D2, Adam, steps=5, jit=True)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)


def test_data_parallel_cnn_matches_one_device() -> None:
    """The small CNN of examples/train_digits.py (convolutions, relu, linear, Adam) trained data parallel."""
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).parents[3] / "examples" / "train_digits.py"
    spec = importlib.util.spec_from_file_location("train_digits_for_multi", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # its dataclasses look their module up
    spec.loader.exec_module(example)

    def train(devices: tuple[str, ...] | None) -> list[float]:
        rng = np.random.default_rng(0)
        model = example.DigitsNet()
        for p in get_parameters(model):
            p.assign(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.2)).realize()
            if devices is not None:
                p.to_(devices).realize()
        opt = Adam(get_parameters(model), lr=0.01)
        losses = []
        with Context(TRAINING=1):
            for _ in range(3):
                x = Tensor(rng.standard_normal((8, 1, 8, 8)).astype(np.float32))
                y = Tensor(rng.integers(0, 10, 8).astype(np.int32))
                if devices is not None:
                    x, y = x.shard(devices, 0), y.shard(devices, 0)
                opt.zero_grad()
                loss = model(x).sparse_categorical_crossentropy(y)
                loss.backward()
                opt.step()
                losses.append(float(loss.item()))
        return losses

    np.testing.assert_allclose(train(D4), train(None), rtol=1e-4)


def test_setitem_into_a_sharded_tensor_matches_numpy() -> None:
    a = _data(4, 6)
    t = Tensor(a).shard(D2, axis=0).contiguous().realize()
    t[1:3, 2:4] = Tensor([[7.0, 8.0], [9.0, 10.0]]).shard(D2)
    a[1:3, 2:4] = [[7.0, 8.0], [9.0, 10.0]]
    np.testing.assert_array_equal(t.numpy(), a)


def test_safe_save_of_a_sharded_tensor_round_trips(tmp_path: Any) -> None:
    from xgrad.nn.state import safe_load, safe_save

    a = _data(4, 3)
    safe_save({"w": Tensor(a).shard(D2, axis=0)}, str(tmp_path / "w.safetensors"))
    np.testing.assert_array_equal(safe_load(str(tmp_path / "w.safetensors"))["w"].numpy(), a)
