"""tinygrad's parameter rule on xgrad: every tensor is a parameter (`is_param` True, the results of ops too),
`is_param_(False)` marks a buffer, optimizers train what is marked and only realize the rest; torch's
`requires_grad=` stays as an alias. Training results are compared with torch's optimizers on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xgrad import Tensor, nn
from xgrad.nn.optim import OptimizerError
from xgrad.nn.state import get_parameters

rng = np.random.default_rng(21)


def test_every_tensor_is_a_param_and_ops_keep_it() -> None:
    x = Tensor([1.0, 2.0])
    assert x.is_param
    assert (x * 2).is_param and x.detach().is_param and x.sum().is_param and x.reshape(2, 1).is_param
    assert Tensor.zeros(2).is_param and Tensor.rand(3).is_param and Tensor.arange(3).is_param


def test_is_param_false_marks_a_buffer_that_clone_and_to_keep() -> None:
    b = Tensor([1.0, 2.0])
    assert b.is_param_(False) is b and b.is_param is False
    assert b.clone().is_param is False
    assert b.to(b.device).is_param is False
    assert Tensor([1.0]).clone().is_param is True


def test_requires_grad_is_an_alias_that_sets_is_param() -> None:
    assert Tensor([1.0], requires_grad=False).is_param is False
    assert Tensor([1.0], requires_grad=True).is_param is True
    t = Tensor([1.0])
    assert t.requires_grad_(False).is_param is False
    assert t.requires_grad_(True).is_param is True


def test_a_plain_tensor_handed_to_adam_trains_like_torch() -> None:
    # tinygrad training code: no is_param_(), no requires_grad; torch with requires_grad=True is the oracle
    w_init = rng.standard_normal((4, 3)).astype(np.float32)
    x_np = rng.standard_normal((8, 4)).astype(np.float32)
    y_np = rng.standard_normal((8, 3)).astype(np.float32)
    w = Tensor(w_init)
    opt = nn.optim.Adam([w], lr=0.05)
    tw = torch.tensor(w_init, requires_grad=True)
    topt = torch.optim.Adam([tw], lr=0.05)
    x, y = Tensor(x_np), Tensor(y_np)
    for _ in range(4):
        with Tensor.train():
            opt.zero_grad()
            ((x @ w - y) ** 2).mean().backward()
            opt.step()
        topt.zero_grad()
        ((torch.tensor(x_np) @ tw - torch.tensor(y_np)) ** 2).mean().backward()
        topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_optimizer_trains_params_and_only_realizes_buffers() -> None:
    w, buf = Tensor([1.0, 2.0]), Tensor([5.0]).is_param_(False)
    opt = nn.optim.SGD([w, buf], lr=0.5)
    assert opt.params == [w] and opt.buffers == [buf]
    (w * w).sum().backward()
    with Tensor.train():
        opt.step()
    assert w.tolist() == [0.0, 0.0] and buf.tolist() == [5.0]
    with pytest.raises(RuntimeError, match="no trainable"):  # tinygrad code catches the builtin type
        nn.optim.SGD([Tensor([1.0]).is_param_(False)])


def test_batchnorm_running_statistics_and_optimizer_state_are_buffers() -> None:
    bn = nn.BatchNorm(3)
    params = get_parameters(bn)
    trained = [t for t in params if t.is_param]
    assert {id(t) for t in trained} == {id(bn.weight), id(bn.bias)}
    assert bn.running_mean is not None and not bn.running_mean.is_param
    assert bn.num_batches_tracked is not None and not bn.num_batches_tracked.is_param
    opt = nn.optim.Adam(params)
    assert len(opt.params) == 2 and len(opt.buffers) == 3
    given = {id(t) for t in params}
    state = [t for t in get_parameters(opt) if id(t) not in given]  # lr, the moments, the beta powers
    assert len(state) >= 3 and not any(t.is_param for t in state)


def test_backward_fills_grad_of_every_float_tensor_in_the_graph() -> None:
    # as tinygrad: intermediates and buffers get a gradient too (is_param is what optimizers read, not backward)
    src = Tensor([1.0, 2.0, 3.0])
    mid = src * 3.0
    buf = Tensor([2.0, 2.0, 2.0]).is_param_(False)
    (mid * buf).sum().backward()
    assert src.grad is not None and mid.grad is not None and buf.grad is not None
    np.testing.assert_allclose(src.grad.numpy(), [6.0, 6.0, 6.0])
    np.testing.assert_allclose(mid.grad.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_allclose(buf.grad.numpy(), [3.0, 6.0, 9.0])


def test_backward_skips_bare_constants_and_frozen_inputs() -> None:
    # tinygrad skips a bare constant; requires_grad=False (xgrad's alias) keeps an input batch's gradient uncomputed
    w = Tensor(1.0)
    x = Tensor(rng.standard_normal((2, 3)).astype(np.float32), requires_grad=False)
    p = Tensor(rng.standard_normal((3,)).astype(np.float32))
    ((x @ p) + w).sum().backward()
    assert w.grad is None and x.grad is None and p.grad is not None
    np.testing.assert_allclose(p.grad.numpy(), x.numpy().sum(0), rtol=1e-6)


def test_requires_grad_true_gives_a_scalar_its_own_buffer_and_a_gradient() -> None:
    # Tensor(2.0) is a constant node shared by every equal constant; requires_grad=True makes it a parameter of its own
    x = Tensor([1.0, 2.0, 3.0])
    s = Tensor(2.0, requires_grad=True)
    (x * s * 2.0).sum().backward()
    assert s.grad is not None
    np.testing.assert_allclose(s.grad.numpy(), 12.0)
    np.testing.assert_allclose(x.grad.numpy() if x.grad is not None else None, [4.0, 4.0, 4.0])


def test_optimizer_refuses_an_int_param_with_a_runtime_error() -> None:
    with pytest.raises(OptimizerError, match="float"):
        nn.optim.SGD([Tensor([1, 2])])


def test_clones_of_equal_constants_are_separate_parameters() -> None:
    # tinygrad's test: two clones of Tensor(3.5) are two parameters; torch gives each a gradient of 1
    w1, w2 = Tensor(3.5).clone(), Tensor(3.5).clone()
    assert w1.is_param and w2.is_param
    nn.optim.SGD([w1, w2], lr=0.01)
    w1.add(w2).backward()
    tw1, tw2 = torch.tensor(3.5, requires_grad=True), torch.tensor(3.5, requires_grad=True)
    tw1.add(tw2).backward()
    assert w1.grad is not None and w2.grad is not None and tw1.grad is not None
    assert w1.grad.item() == tw1.grad.item() == 1.0 and w2.grad.item() == 1.0


def test_to_another_device_keeps_is_param_and_the_gradient() -> None:
    s = Tensor([1.0, 2.0, 3.0]).is_param_(False)
    s.sum().backward()
    t = s.to("CPU:1")
    assert t.is_param is False and t.grad is not None and t.grad.device == "CPU:1"
    assert t.grad.tolist() == [1.0, 1.0, 1.0]


def test_shard_and_replicate_keep_is_param() -> None:
    for flag in (True, False):
        s = Tensor([1.0, 2.0, 3.0, 4.0]).is_param_(flag)
        assert s.shard(("CPU", "CPU:1"), axis=0).is_param is flag
        assert s.to(("CPU", "CPU:1")).is_param is flag


def test_lamb_with_its_state_moved_to_another_device_steps_as_before() -> None:
    # tinygrad's CPU-offload case: the moments and beta powers moved with to_(), the parameter stays
    init = rng.standard_normal((3, 4)).astype(np.float32)
    results = []
    for offload in (False, True):
        t = Tensor(init.copy())
        opt = nn.optim.LAMB([t], lr=0.1, weight_decay=0.01)
        if offload:
            for s in [*opt.m, *opt.v, opt.b1_t, opt.b2_t]:
                s.to_("CPU:1")
        for _ in range(3):
            opt.zero_grad()
            (t * t).sum().backward()
            with Tensor.train():
                opt.step()
        assert t.device == "CPU" and opt.m[0].device == ("CPU:1" if offload else "CPU")
        results.append(t.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)


@pytest.mark.parametrize("opt_cls", [nn.optim.Adam, nn.optim.AdamW, nn.optim.SGD])
def test_a_weight_passed_twice_trains_as_once(opt_cls: type) -> None:
    init = rng.standard_normal((1, 4)).astype(np.float32)
    losses = []
    for twice in (False, True):
        w = Tensor(init.copy())
        opt = opt_cls([w, w] if twice else [w], lr=0.1)
        for _ in range(3):
            loss = w.sum()
            opt.zero_grad()
            loss.backward()
            with Tensor.train():
                opt.step()
        losses.append(loss.numpy())
    np.testing.assert_allclose(losses[1], losses[0], atol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Tensor.zeros(2, requires_grad=False),
        lambda: Tensor.rand(2, requires_grad=False),
        lambda: Tensor([1.0]).ones_like(requires_grad=False),
        lambda: Tensor.arange(3.0, requires_grad=False),
    ],
)
def test_requires_grad_false_on_creation_methods_makes_a_buffer(make: object) -> None:
    t = make()  # type: ignore[operator]
    assert t.requires_grad is False and t.is_param is False
    with pytest.raises(OptimizerError, match="no trainable"):
        nn.optim.SGD([t])


def test_setting_the_requires_grad_attribute_is_requires_grad_() -> None:
    # old tinygrad code assigns the attribute
    w, frozen = Tensor([1.0, 2.0]), Tensor([3.0, 4.0])
    frozen.requires_grad = False
    opt = nn.optim.SGD([w, frozen], lr=0.5)
    assert opt.params == [w] and opt.buffers == [frozen]
    (w * frozen).sum().backward()
    assert frozen.grad is None and w.grad is not None
    s = Tensor(2.0)
    s.requires_grad = True  # a 0-d constant gets a buffer of its own, so it can have a gradient
    (s * Tensor([1.0, 2.0])).sum().backward()
    assert s.grad is not None and s.grad.item() == 3.0
