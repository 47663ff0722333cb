"""xgrad.nn.optim: a small two-layer model is trained a few steps with each optimizer, and the parameters are compared
after every step with torch.optim (SGD, Adam, AdamW, Muon) or with a float64 numpy reference written here from the
papers' formulas (LARS, LAMB), whose gradients come from torch autograd."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from xgrad import Context, Tensor
from xgrad.device import Device
from xgrad.errors import XgradError
from xgrad.nn.optim import (
    LAMB,
    LARS,
    SGD,
    Adam,
    AdamW,
    Muon,
    Optimizer,
    OptimizerError,
    OptimizerGroup,
)

STEPS = 4
_rng = np.random.default_rng(0)
X = _rng.standard_normal((5, 4)).astype(np.float32)
Y = _rng.standard_normal((5, 2)).astype(np.float32)
INIT = [_rng.standard_normal((4, 3)).astype(np.float32), _rng.standard_normal((3, 2)).astype(np.float32)]
TOL: dict[str, Any] = {"rtol": 1e-4, "atol": 2e-5}

MakeOpt = Callable[[list[Tensor]], Optimizer]
History = list[list[np.ndarray]]


# ---- the model, in xgrad and in torch ----
def xgrad_loss(ws: list[Tensor], x: Tensor, y: Tensor) -> Tensor:
    return ((x @ ws[0]).tanh() @ ws[1] - y).square().mean()


def torch_loss(ws: list[torch.Tensor]) -> torch.Tensor:
    return ((torch.from_numpy(X).double() @ ws[0]).tanh() @ ws[1] - torch.from_numpy(Y).double()).square().mean()


def make_params(device: str) -> list[Tensor]:
    return [Tensor(w, device=device).is_param_() for w in INIT]


def train_xgrad(ws: list[Tensor], opt: Optimizer, steps: int = STEPS) -> History:
    x, y = Tensor(X, device=ws[0].device), Tensor(Y, device=ws[0].device)
    history = []
    with Context(TRAINING=1):
        for _ in range(steps):
            opt.zero_grad()
            xgrad_loss(ws, x, y).backward()
            opt.step()
            history.append([w.numpy() for w in ws])
    return history


def train_torch(make_opt: Callable[[list[torch.Tensor]], torch.optim.Optimizer], steps: int = STEPS) -> History:
    ws = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in INIT]
    opt = make_opt(ws)
    history = []
    for _ in range(steps):
        opt.zero_grad()
        torch_loss(ws).backward()
        opt.step()
        history.append([w.detach().numpy().copy() for w in ws])
    return history


def torch_grads(ws: list[np.ndarray]) -> list[np.ndarray]:
    tws = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in ws]
    torch_loss(tws).backward()
    return [w.grad.numpy() for w in tws if w.grad is not None]


def train_reference(update: Callable[[int, int, np.ndarray, np.ndarray, dict[str, np.ndarray]], np.ndarray]) -> History:
    """Runs `update(step, layer, w, g, state) -> new w` (step counts from 1) on float64 numpy parameters."""
    ws = [w.astype(np.float64) for w in INIT]
    states: list[dict[str, np.ndarray]] = [{} for _ in ws]
    history = []
    for t in range(1, STEPS + 1):
        grads = torch_grads(ws)
        ws = [update(t, i, w, g, states[i]) for i, (w, g) in enumerate(zip(ws, grads))]
        history.append([w.copy() for w in ws])
    return history


def assert_histories_close(got: History, want: History, **tol: Any) -> None:
    for step, (g_ws, w_ws) in enumerate(zip(got, want, strict=True)):
        for layer, (g, w) in enumerate(zip(g_ws, w_ws, strict=True)):
            np.testing.assert_allclose(g, w, **(tol or TOL), err_msg=f"step {step + 1}, layer {layer}")


# ---- against torch.optim ----
SGD_CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "nesterov": {"momentum": 0.9, "nesterov": True},
    "weight_decay": {"momentum": 0.8, "weight_decay": 0.1},
}


@pytest.mark.parametrize("case", SGD_CASES)
def test_sgd_matches_torch_each_step(xgrad_device: str, case: str) -> None:
    kw = SGD_CASES[case]
    ws = make_params(xgrad_device)
    got = train_xgrad(ws, SGD(ws, lr=0.1, **kw))
    assert_histories_close(got, train_torch(lambda p: torch.optim.SGD(p, lr=0.1, **kw)))


def test_sgd_classic_matches_torch_with_constant_lr() -> None:
    ws = make_params("CPU")
    got = train_xgrad(ws, SGD(ws, lr=0.1, momentum=0.9, weight_decay=0.05, classic=True))
    want = train_torch(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.05))
    assert_histories_close(got, want)


def test_adam_matches_torch_each_step(xgrad_device: str) -> None:
    ws = make_params(xgrad_device)
    got = train_xgrad(ws, Adam(ws, lr=0.05, b1=0.8, b2=0.99))
    assert_histories_close(got, train_torch(lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.8, 0.99), eps=1e-8)))


def test_adamw_matches_torch_each_step(xgrad_device: str) -> None:
    ws = make_params(xgrad_device)
    got = train_xgrad(ws, AdamW(ws, lr=0.05, weight_decay=0.2))
    want = train_torch(lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.2, eps=1e-8))
    assert_histories_close(got, want)


def test_muon_matches_torch_each_step() -> None:
    # torch orthogonalizes in bfloat16, hence the loose tolerance; the float64 reference below is the tight check
    ws = make_params("CPU")
    got = train_xgrad(ws, Muon(ws, lr=0.02, weight_decay=0.1))
    want = train_torch(lambda p: torch.optim.Muon(p, lr=0.02, weight_decay=0.1))
    assert_histories_close(got, want, rtol=0, atol=2e-3)


def test_muon_matches_reference_each_step(xgrad_device: str) -> None:
    a, b, c = 3.4445, -4.775, 2.0315
    lr, wd, mom = 0.02, 0.1, 0.95

    def update(t: int, i: int, w: np.ndarray, g: np.ndarray, s: dict[str, np.ndarray]) -> np.ndarray:
        # Keller Jordan's Muon as torch writes it: dampened momentum, Nesterov by lerp, decoupled weight decay
        s["buf"] = s.get("buf", np.zeros_like(w)) * mom + (1 - mom) * g
        u = g + mom * (s["buf"] - g)
        x = u.T if u.shape[0] > u.shape[1] else u
        x = x / np.linalg.norm(x)
        for _ in range(5):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        x = x.T if u.shape[0] > u.shape[1] else x
        new: np.ndarray = w * (1 - lr * wd) - lr * max(1.0, w.shape[0] / w.shape[1]) ** 0.5 * x
        return new

    ws = make_params(xgrad_device)
    assert_histories_close(train_xgrad(ws, Muon(ws, lr=lr, weight_decay=wd)), train_reference(update))


# ---- against numpy references from the papers ----
def test_lars_matches_paper_each_step(xgrad_device: str) -> None:
    lr, mom, wd, eta = 0.5, 0.9, 0.01, 0.05

    def update(t: int, i: int, w: np.ndarray, g: np.ndarray, s: dict[str, np.ndarray]) -> np.ndarray:
        # You et al. 2017, algorithm 1: local lr = eta*|w| / (|g| + wd*|w|); v = m*v + lr*local_lr*(g + wd*w)
        local_lr = eta * np.linalg.norm(w) / (np.linalg.norm(g) + wd * np.linalg.norm(w))
        s["v"] = mom * s.get("v", np.zeros_like(w)) + lr * local_lr * (g + wd * w)
        new: np.ndarray = w - s["v"]
        return new

    ws = make_params(xgrad_device)
    got = train_xgrad(ws, LARS(ws, lr=lr, momentum=mom, weight_decay=wd, tcoef=eta))
    assert_histories_close(got, train_reference(update))


def test_lars_modern_variant_matches_reference() -> None:
    lr, mom, wd, eta = 0.5, 0.9, 0.01, 0.05

    def update(t: int, i: int, w: np.ndarray, g: np.ndarray, s: dict[str, np.ndarray]) -> np.ndarray:
        # classic=False, pre_wd=False: momentum on the raw grad, decoupled decay, trust ratio applied with lr last
        ratio = eta * np.linalg.norm(w) / (np.linalg.norm(g) + wd * np.linalg.norm(w))
        s["b"] = mom * s.get("b", np.zeros_like(w)) + g
        return w * (1 - wd * lr) - lr * ratio * (g + mom * s["b"])

    ws = make_params("CPU")
    opt = LARS(ws, lr=lr, momentum=mom, weight_decay=wd, tcoef=eta, nesterov=True, classic=False, pre_wd=False)
    assert_histories_close(train_xgrad(ws, opt), train_reference(update))


def test_lamb_matches_paper_each_step(xgrad_device: str) -> None:
    lr, b1, b2, eps, wd = 0.05, 0.9, 0.999, 1e-6, 0.01

    def update(t: int, i: int, w: np.ndarray, g: np.ndarray, s: dict[str, np.ndarray]) -> np.ndarray:
        # You et al. 2019, algorithm 2 with phi = identity
        s["m"] = b1 * s.get("m", np.zeros_like(w)) + (1 - b1) * g
        s["v"] = b2 * s.get("v", np.zeros_like(w)) + (1 - b2) * g * g
        m_hat, v_hat = s["m"] / (1 - b1**t), s["v"] / (1 - b2**t)
        u = m_hat / (np.sqrt(v_hat) + eps) + wd * w
        return w - lr * np.linalg.norm(w) / np.linalg.norm(u) * u

    ws = make_params(xgrad_device)
    assert_histories_close(train_xgrad(ws, LAMB(ws, lr=lr, weight_decay=wd)), train_reference(update))


# ---- fused, state device, lr, dtypes ----
FUSABLE: dict[str, Callable[[list[Tensor], bool], Optimizer]] = {
    "sgd": lambda ws, fused: SGD(ws, lr=0.1, momentum=0.9, nesterov=True, fused=fused),
    "adam": lambda ws, fused: Adam(ws, lr=0.05, fused=fused),
}


@pytest.mark.parametrize("name", FUSABLE)
def test_fused_update_matches_unfused(name: str) -> None:
    ws = make_params("CPU")
    opt = FUSABLE[name](ws, True)
    fused = train_xgrad(ws, opt)
    state = opt.b if isinstance(opt, LARS) else opt.m if isinstance(opt, LAMB) else []
    assert [s.shape for s in state] == [(18,)]
    ws2 = make_params("CPU")
    assert_histories_close(fused, train_xgrad(ws2, FUSABLE[name](ws2, False)))


def test_fuse_optim_knob_sets_the_default() -> None:
    with Context(FUSE_OPTIM=1):
        assert SGD(make_params("CPU")).fused and not SGD(make_params("CPU"), fused=False).fused
        assert not Muon(make_params("CPU")).fused
    assert not Adam(make_params("CPU")).fused


def test_fused_lamb_trust_ratio_spans_all_params() -> None:
    lr = 0.05

    ws = make_params("CPU")
    got = train_xgrad(ws, LAMB(ws, lr=lr, fused=True), steps=1)
    # one step: m_hat = g, v_hat = g^2, so u = g / (|g| + eps) ~ sign(g); the ratio uses the norms of all params
    g = torch_grads([w.astype(np.float64) for w in INIT])
    u = [gi / (np.abs(gi) + 1e-6) for gi in g]
    ratio = np.sqrt(sum((w.astype(np.float64) ** 2).sum() for w in INIT)) / np.sqrt(sum((ui**2).sum() for ui in u))
    assert_histories_close(got, [[w - lr * ratio * ui for w, ui in zip(INIT, u)]])


def test_muon_refuses_fused() -> None:
    with pytest.raises(OptimizerError, match="fused=False"):
        Muon(make_params("CPU"), fused=True)


@pytest.mark.parametrize("state_device", ["CPU:1", "PYTHON"])
def test_state_on_other_device_matches_torch(state_device: str) -> None:
    ws = make_params("CPU")
    opt = AdamW(ws, lr=0.05, weight_decay=0.2, device=state_device)
    got = train_xgrad(ws, opt, steps=3)
    assert {t.device for t in [*opt.m, *opt.v, opt.b1_t, opt.lr]} == {state_device}
    assert {w.device for w in ws} == {"CPU"}
    want = train_torch(lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.2, eps=1e-8), steps=3)
    assert_histories_close(got, want)


def test_lr_change_applies_without_new_schedule() -> None:
    ws = make_params("CPU")
    opt = SGD(ws, lr=0.1, momentum=0.9)
    got = train_xgrad(ws, opt, steps=2)
    opt.lr.assign(Tensor([0.03], device="CPU")).realize()
    compiled = len(Device["CPU"]._programs)
    got += train_xgrad(ws, opt, steps=2)
    assert len(Device["CPU"]._programs) == compiled  # the new lr is data: no kernel is compiled again

    tws = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in INIT]
    topt = torch.optim.SGD(tws, lr=0.1, momentum=0.9)
    want = []
    for step in range(4):
        if step == 2:
            topt.param_groups[0]["lr"] = 0.03
        topt.zero_grad()
        torch_loss(tws).backward()
        topt.step()
        want.append([w.detach().numpy().copy() for w in tws])
    assert_histories_close(got, want)


def test_half_params_keep_float32_state() -> None:
    ws = [Tensor(w, device="CPU", dtype="float16").is_param_() for w in INIT]
    opt = Adam(ws, lr=0.05)
    got = train_xgrad(ws, opt, steps=2)
    assert [w.dtype.name for w in ws] == ["float16", "float16"]
    assert {t.dtype.name for t in [*opt.m, *opt.v]} == {"float32"}
    want = train_torch(lambda p: torch.optim.Adam(p, lr=0.05), steps=2)
    assert_histories_close(got, want, rtol=0, atol=1e-2)


# ---- API behaviour ----
def test_step_raises_outside_training() -> None:
    ws = make_params(Device.DEFAULT)
    opt = SGD(ws, lr=0.1)
    xgrad_loss(ws, Tensor(X), Tensor(Y)).backward()
    with pytest.raises(OptimizerError, match="TRAINING=1"):
        opt.step()
    with Context(TRAINING=0), pytest.raises(XgradError):
        opt.schedule_step()


def test_step_raises_without_grad() -> None:
    ws = make_params("CPU")
    opt = Adam(ws)
    with Context(TRAINING=1), pytest.raises(OptimizerError, match="backward"):
        opt.step()


def test_optimizer_raises_without_params() -> None:
    with pytest.raises(OptimizerError, match="is_param_"):
        SGD([Tensor(INIT[0]).is_param_(False)])
    with pytest.raises(OptimizerError, match="no trainable"):
        SGD([])


def test_adam_adds_no_zero_weight_decay_term_like_torch() -> None:
    # Adam has no weight decay; a `+ 0 * p` term would turn an infinite parameter into NaN, torch leaves it infinite
    w0 = np.array([np.inf, 1.0, -2.0], np.float32)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    w = Tensor(w0).is_param_()
    opt = Adam([w], lr=0.1)
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.Adam([tw], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        (w * Tensor(x)).sum().backward()
        with Context(TRAINING=1):
            opt.step()
        topt.zero_grad()
        (tw * torch.tensor(x)).sum().backward()
        topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5)


def test_requires_grad_marks_what_an_optimizer_trains() -> None:
    # tinygrad code: leaves made with requires_grad=True are trained; requires_grad=False freezes even a layer weight
    w = Tensor([1.0, 2.0], requires_grad=True)
    frozen = Tensor([3.0, 4.0]).is_param_().requires_grad_(False)
    opt = SGD([w, frozen], lr=0.5)
    assert opt.params == [w] and opt.buffers == [frozen]
    (w * w * frozen).sum().backward()
    assert frozen.grad is None
    with Context(TRAINING=1):
        opt.step()
    assert w.tolist() == [1.0 - 0.5 * 2 * 3.0, 2.0 - 0.5 * 2 * 2.0 * 4.0] and frozen.tolist() == [3.0, 4.0]
    with pytest.raises(OptimizerError, match="requires_grad"):
        SGD([Tensor([1.0]).is_param_().requires_grad_(False)])


def test_tensor_train_is_tinygrads_training_mode() -> None:
    # tinygrad code steps its optimizer under `with Tensor.train():` or with `Tensor.training = True`
    ws = make_params(Device.DEFAULT)
    opt = SGD(ws, lr=0.1)
    assert Tensor.training is False
    xgrad_loss(ws, Tensor(X), Tensor(Y)).backward()
    with Tensor.train():
        assert Tensor.training is True
        opt.step()
    assert Tensor.training is False
    tws = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in INIT]
    torch_loss(tws).backward()
    for w, tw in zip(ws, tws):
        assert tw.grad is not None
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy() - 0.1 * tw.grad.numpy(), **TOL)
    Tensor.training = True
    try:
        opt.zero_grad()
        xgrad_loss(ws, Tensor(X), Tensor(Y)).backward()
        opt.step()  # would raise outside training mode
        train_step = Tensor.train(False)(opt.step)
        with pytest.raises(OptimizerError, match="TRAINING=1"):
            train_step()
    finally:
        Tensor.training = False


def test_optimizer_keeps_params_and_realizes_buffers() -> None:
    ws = make_params(Device.DEFAULT)
    running = Tensor([0.0, 0.0]).contiguous().realize().is_param_(False)
    opt = SGD([*ws, running, ws[0]], lr=0.1)
    assert opt.params == ws and opt.buffers == [running]
    xgrad_loss(ws, Tensor(X), Tensor(Y)).backward()
    running.assign(running + 1.0)
    with Context(TRAINING=1):
        opt.step()
    assert running.tolist() == [1.0, 1.0]  # realized by the step, exactly once


def test_grads_and_loss_keep_old_values_when_realized_with_step() -> None:
    ws = make_params(Device.DEFAULT)
    opt = Adam(ws, lr=0.05)
    loss = xgrad_loss(ws, Tensor(X), Tensor(Y)).backward()
    with Context(TRAINING=1):
        loss.realize(*opt.schedule_step())
    tws = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in INIT]
    want_loss = torch_loss(tws)
    want_loss.backward()
    np.testing.assert_allclose(loss.item(), want_loss.item(), **TOL)
    for w, tw in zip(ws, tws):
        assert w.grad is not None and tw.grad is not None
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), **TOL)


def test_zero_grad_clears_grads() -> None:
    ws = make_params(Device.DEFAULT)
    opt = SGD(ws, lr=0.1)
    xgrad_loss(ws, Tensor(X), Tensor(Y)).backward()
    assert all(w.grad is not None for w in ws)
    opt.zero_grad()
    assert all(w.grad is None for w in ws)


def test_optimizer_group_steps_every_optimizer() -> None:
    ws = make_params("CPU")
    group = OptimizerGroup(SGD([ws[0]], lr=0.1, momentum=0.9), Adam([ws[1]], lr=0.05))
    assert len(group) == 2 and isinstance(group[0], LARS) and isinstance(group[1], LAMB)
    assert group.params == ws
    got = train_xgrad(ws, group)

    tws = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in INIT]
    topts = [torch.optim.SGD([tws[0]], lr=0.1, momentum=0.9), torch.optim.Adam([tws[1]], lr=0.05)]
    want = []
    for _ in range(STEPS):
        for o in topts:
            o.zero_grad()
        torch_loss(tws).backward()
        for o in topts:
            o.step()
        want.append([w.detach().numpy().copy() for w in tws])
    assert_histories_close(got, want)


def test_optimizer_group_zero_grad_clears_all() -> None:
    ws = make_params(Device.DEFAULT)
    group = OptimizerGroup(SGD([ws[0]]), AdamW([ws[1]]))
    xgrad_loss(ws, Tensor(X), Tensor(Y)).backward()
    group.zero_grad()
    assert ws[0].grad is None and ws[1].grad is None
