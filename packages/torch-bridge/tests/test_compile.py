"""torch.compile(model, backend="xgrad"): forward and backward graphs as TinyJit'd xgrad functions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)
from digits import DigitsNet

import xgrad_torch.compile
from xgrad import GlobalCounters, Tensor
from xgrad_torch.registration import BridgeError


def test_compiled_training_matches_cpu_and_replays_kernels() -> None:
    torch.manual_seed(0)
    ref = DigitsNet()
    model = DigitsNet()
    model.load_state_dict(ref.state_dict())
    model = model.to("xgrad")
    opt, ref_opt = torch.optim.Adam(model.parameters(), lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)

    @torch.compile(backend="xgrad", dynamic=False)
    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    @torch.compile(backend="xgrad", dynamic=False)
    def update() -> None:  # Adam's step counts are CPU tensors: graph inputs copied in, mutations copied back
        opt.step()

    g = torch.Generator().manual_seed(1)
    kernels = []
    for step in range(5):
        x, y = torch.randn(32, 1, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        GlobalCounters.reset()
        loss = loss_of(x.to("xgrad"), y.to("xgrad"))
        loss.backward()
        kernels.append(GlobalCounters.kernel_count)
        update()
        ref_opt.zero_grad()
        ref_loss = F.cross_entropy(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        assert abs(loss.item() - ref_loss.item()) < 1e-4, f"step {step}"
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().cpu().numpy(), q.detach().numpy(), atol=1e-4)
    assert kernels[3] == kernels[4], "replays run the captured kernels"
    assert all(state["step"].device.type == "cpu" and state["step"].item() == 5 for state in opt.state.values())
    assert isinstance(xgrad_torch.compile.xgrad_backend, object)


def test_compiled_function_matches_cpu_and_refuses_other_devices() -> None:
    @torch.compile(backend="xgrad", dynamic=False)
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a + b).relu() * b

    for i in range(4):
        a, b = torch.randn(5, 3) + i, torch.randn(5, 3)
        np.testing.assert_allclose(f(a.to("xgrad"), b.to("xgrad")).cpu().numpy(), ((a + b).relu() * b).numpy(),
                                   rtol=1e-6)  # fmt: skip
    with pytest.raises(BridgeError, match="move the model and its inputs to 'xgrad'"):
        graph = xgrad_torch.compile.CompiledGraph(torch.fx.symbolic_trace(torch.nn.ReLU()), [torch.ones(2)])
        graph(torch.ones(2, device="meta"))


def test_compiled_in_place_writes_match_cpu_with_shared_lazy_inputs_and_host_writes() -> None:
    @torch.compile(backend="xgrad", dynamic=False)
    def bump(a: torch.Tensor, b: torch.Tensor, n: torch.Tensor) -> None:
        a.mul_(2).add_(n)
        a[1:].mul_(0.5)  # through a view: a slice_scatter in the graph
        b.add_(a)
        n.add_(1)

    # a and b start as the same lazy zeros (as an optimizer's zeros_like states do): they must stay two buffers
    a, b, n = torch.zeros(4, device="xgrad"), torch.zeros(4, device="xgrad"), torch.tensor(1.0)
    ref_a, ref_b, ref_n = torch.zeros(4), torch.zeros(4), torch.tensor(1.0)
    for i in range(6):
        if i == 4:  # a host write to the CPU input between calls is seen by the next call
            n.fill_(10.0)
            ref_n.fill_(10.0)
        bump(a, b, n)
        ref_a.mul_(2).add_(ref_n)
        ref_a[1:].mul_(0.5)
        ref_b.add_(ref_a)
        ref_n.add_(1)
        np.testing.assert_allclose(a.cpu().numpy(), ref_a.numpy())
        np.testing.assert_allclose(b.cpu().numpy(), ref_b.numpy())
        assert n.item() == ref_n.item(), f"call {i}"


def test_compiled_adam_step_writes_each_state_once(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ref = torch.nn.Linear(3, 2)
    ref.load_state_dict(model.state_dict())
    model = model.to("xgrad")
    opt, ref_opt = torch.optim.Adam(model.parameters(), lr=0.1), torch.optim.Adam(ref.parameters(), lr=0.1)
    update = torch.compile(opt.step, backend="xgrad", dynamic=False)
    kernels, host_reads = [], []
    reads = 0
    numpy = Tensor.numpy

    def counted(self: Tensor) -> np.ndarray:
        nonlocal reads
        reads += 1
        return numpy(self)

    monkeypatch.setattr(Tensor, "numpy", counted)
    for i in range(4):
        for p, q in zip(model.parameters(), ref.parameters()):
            q.grad = torch.full(q.shape, float(i + 1))
            p.grad = q.grad.to("xgrad")
        GlobalCounters.reset()
        reads = 0
        update()
        kernels.append(GlobalCounters.kernel_count)
        host_reads.append(reads)
        ref_opt.step()
        for state, ref_state in zip(opt.state.values(), ref_opt.state.values()):
            assert state["step"].device.type == "cpu" and state["step"].item() == ref_state["step"].item() == i + 1
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().cpu().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-5)
    # the capture (second call) runs, per parameter, one kernel each for the step count, the two moments and the
    # parameter: the new moments are computed into their own buffers and read from there, never copied into them;
    # one more gathers the new step counts, which a replay brings to the host with one read (not one per count)
    assert kernels[1] == 4 * 2 + 1, kernels
    assert host_reads[2:] == [1, 1], host_reads


def test_compiled_outputs_sharing_a_storage_are_realized_once() -> None:
    g = torch.Generator().manual_seed(2)
    x, w, v = torch.randn(4, 2, 3, 3, generator=g), torch.randn(2, 2, 3, 3, generator=g), torch.randn(2, 5, generator=g)

    def loss_of(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        h = F.conv2d(x, w, padding=1).relu()  # relu saved for its backward, its flattened view for the matmul's
        return (h.flatten(1)[:, :2] @ v).square().sum()

    compiled = torch.compile(loss_of, backend="xgrad", dynamic=False)
    ref = [t.clone().requires_grad_(True) for t in (x, w, v)]
    loss_of(*ref).backward()
    kernels = []
    for _ in range(3):
        dev = [t.to("xgrad").requires_grad_(True) for t in (x, w, v)]
        GlobalCounters.reset()
        loss = compiled(*dev)
        kernels.append(GlobalCounters.kernel_count)
        loss.backward()
        np.testing.assert_allclose(loss.item(), loss_of(x, w, v).item(), rtol=1e-5)
        for d, r in zip(dev, ref):
            np.testing.assert_allclose(d.grad.cpu().numpy(), r.grad.numpy(), rtol=1e-4, atol=1e-5)
    # the forward's capture: conv + relu, the matmul's product, the loss (and its reduction): no copy of relu made
    # for its flattened view (5 kernels when each output over the storage was realized on its own)
    assert kernels[1] == 4, kernels


def test_compiled_batchnorm_training_and_sgd_momentum_match_cpu() -> None:
    torch.manual_seed(0)

    def net() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 2))  # fmt: skip

    ref, model = net(), net()
    model.load_state_dict(ref.state_dict())
    model = model.to("xgrad")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    loss_of = torch.compile(lambda x: model(x).square().mean(), backend="xgrad", dynamic=False)
    update = torch.compile(opt.step, backend="xgrad", dynamic=False)  # momentum buffers written in place
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        x = torch.randn(4, 2, 6, 6, generator=g)
        opt.zero_grad()
        loss = loss_of(x.to("xgrad"))  # the forward writes the running statistics in place
        loss.backward()
        update()
        ref_opt.zero_grad()
        ref_loss = ref(x).square().mean()
        ref_loss.backward()
        ref_opt.step()
        assert abs(loss.item() - ref_loss.item()) < 1e-5, f"step {step}"
    for (name, v), w in zip(model.state_dict().items(), ref.state_dict().values()):
        np.testing.assert_allclose(v.cpu().numpy(), w.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_compiled_replays_run_no_kernel_outside_their_captures(monkeypatch: pytest.MonkeyPatch) -> None:
    graphs: list[xgrad_torch.compile.CompiledGraph] = []
    init = xgrad_torch.compile.CompiledGraph.__init__

    def spy(self: xgrad_torch.compile.CompiledGraph, *args: object) -> None:
        init(self, *args)  # type: ignore[arg-type]
        graphs.append(self)

    monkeypatch.setattr(xgrad_torch.compile.CompiledGraph, "__init__", spy)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 3))
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 3))
    model.load_state_dict(ref.state_dict())
    model = model.to("xgrad")
    loss_of = torch.compile(lambda x, y: F.cross_entropy(model(x), y), backend="xgrad", dynamic=False)
    g = torch.Generator().manual_seed(3)
    kernels = []
    for step in range(5):
        x, y = torch.randn(4, 1, 4, 4, generator=g), torch.randint(0, 3, (4,), generator=g)
        dev_x, dev_y = x.to("xgrad"), y.to("xgrad")
        torch.xgrad.synchronize()  # type: ignore[attr-defined]
        model.zero_grad()
        ref.zero_grad()
        GlobalCounters.reset()
        loss = loss_of(dev_x, dev_y)
        loss.backward()  # its incoming gradient, ones_like(loss), is a lazy constant on xgrad
        kernels.append(GlobalCounters.kernel_count)
        ref_loss = F.cross_entropy(ref(x), y)
        ref_loss.backward()
        assert abs(loss.item() - ref_loss.item()) < 1e-5, f"step {step}"
        for p, q in zip(model.parameters(), ref.parameters()):
            np.testing.assert_allclose(p.grad.cpu().numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-6)
    # replays launch the captured kernels only (TinyJit counts none): the backward's ones_like gradient is realized
    # once, not every step, and every captured input is a whole buffer, so TinyJit takes its fast replay path (the
    # flattened activation the backward reads goes in as its buffer and is reshaped inside the capture)
    assert kernels[3:] == [0, 0], kernels
    assert len(graphs) == 2
    for graph in graphs:
        assert graph.jit.captured is not None
        assert all(spec.plain for spec in graph.jit.captured.expected_input_info)


def test_compiled_inputs_read_once_while_unchanged_and_again_after_eager_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked: list[int] = []
    xgrad_input = xgrad_torch.compile.CompiledGraph._xgrad_input

    def spy(self: xgrad_torch.compile.CompiledGraph, k: int, a: torch.Tensor, h: object) -> object:
        looked.append(k)
        return xgrad_input(self, k, a, h)  # type: ignore[arg-type]

    monkeypatch.setattr(xgrad_torch.compile.CompiledGraph, "_xgrad_input", spy)

    @torch.compile(backend="xgrad", dynamic=False)
    def f(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return w * 2 + x

    w, ref = torch.arange(6.0).reshape(2, 3).to("xgrad"), torch.arange(6.0).reshape(2, 3)
    for i in range(6):
        x = torch.full((2, 3), float(i))
        looked.clear()
        out = f(w, x.to("xgrad"))
        np.testing.assert_allclose(out.cpu().numpy(), (ref * 2 + x).numpy())
        if i >= 1:  # w is the same tensor holding the same xgrad Tensor: only the new x is looked at
            assert sorted(looked) == ([0, 1] if i == 4 else [1]), (i, looked)
        if i == 3:  # an eager in-place write gives w's storage a new xgrad Tensor: the next call reads it again
            w.add_(1)
            ref.add_(1)


def test_compiled_constant_input_buffer_is_not_written_by_another_graph() -> None:
    @torch.compile(backend="xgrad", dynamic=False)
    def read(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return g * x

    @torch.compile(backend="xgrad", dynamic=False)
    def bump(g: torch.Tensor) -> None:
        g.add_(1)

    x = torch.arange(3.0).to("xgrad")
    for i in range(4):
        g = torch.ones(3, device="xgrad")  # a lazy constant: `read` gives it a buffer kept for the next call's ones
        np.testing.assert_allclose(read(g, x).cpu().numpy(), [0.0, 1.0, 2.0], err_msg=f"call {i}")
        bump(g)  # writes g in place: not into the buffer `read` keeps for its constant
        np.testing.assert_allclose(g.cpu().numpy(), [2.0, 2.0, 2.0], err_msg=f"call {i}")
