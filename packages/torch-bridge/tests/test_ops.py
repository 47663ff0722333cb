"""torch's own ops on `xgrad` against torch CPU: forward and backward, several shapes and dtypes, views and in-place
writes through views."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (torch's own spelling)

import xgrad_torch
from xgrad import Tensor
from xgrad_torch.ops import TABLE

Fn = Callable[..., Any]


def _inputs(shapes: list[tuple[int, ...]], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
    low = 0 if dtype in (torch.uint8, torch.bool) else -5
    return [torch.randint(low, 6, s, generator=g, dtype=dtype) for s in shapes]


def _flat(out: Any) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]


def check(fn: Fn, shapes: list[tuple[int, ...]], dtype: torch.dtype = torch.float32, grad: bool = True,
          atol: float = 1e-5, seed: int = 0) -> None:  # fmt: skip
    """fn on CPU and on xgrad gives the same outputs and (for float inputs) the same input gradients."""
    cpu = [t.requires_grad_(grad and dtype.is_floating_point) for t in _inputs(shapes, dtype, seed)]
    dev = [t.detach().to("xgrad").requires_grad_(grad and dtype.is_floating_point) for t in cpu]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an op that fell back to CPU fails the test
        out_c, out_x = _flat(fn(*cpu)), _flat(fn(*dev))
        assert len(out_c) == len(out_x)
        for c, x in zip(out_c, out_x):
            assert x.device.type == "xgrad" and x.dtype == c.dtype and x.shape == c.shape
            np.testing.assert_allclose(x.detach().cpu().numpy(), c.detach().numpy(), atol=atol, rtol=1e-4)
        if not (grad and dtype.is_floating_point) or not any(c.dtype.is_floating_point for c in out_c):
            return
        g = torch.Generator().manual_seed(seed + 1)
        pairs = [(c, x) for c, x in zip(out_c, out_x) if c.dtype.is_floating_point]
        weights = [torch.randn(c.shape, generator=g) for c, _ in pairs]
        sum(((c * w).sum() for (c, _), w in zip(pairs, weights)), torch.tensor(0.0)).backward()
        total = torch.tensor(0.0, device="xgrad")
        for (_, x), w in zip(pairs, weights):
            total = total + (x * w.to("xgrad")).sum()
        total.backward()
    for c, x in zip(cpu, dev):
        assert (c.grad is None) == (x.grad is None)
        if c.grad is not None:
            np.testing.assert_allclose(x.grad.cpu().numpy(), c.grad.numpy(), atol=atol * 10, rtol=1e-4)


ELEMENTWISE = {
    "add_alpha": (lambda a, b: torch.add(a, b, alpha=2), 2),
    "sub_broadcast": (lambda a, b: a - b[:1], 2),
    "mul": (lambda a, b: a * b, 2),
    "div": (lambda a, b: a / (b.abs() + 1), 2),
    "pow": (lambda a, b: a.abs() ** 1.5 + 2**b, 2),
    "maximum_where": (lambda a, b: torch.where(a > b, a, b * 2).maximum(b), 2),
    "exp_log": (lambda a: (a.exp() + 1).log(), 1),
    "sqrt_rsqrt": (lambda a: (a.abs() + 1).sqrt() * (a * a + 1).rsqrt(), 1),
    "trig": (lambda a: a.sin() + a.cos() * a.tanh(), 1),
    "sigmoid_relu_gelu": (lambda a: torch.sigmoid(a) + F.relu(a) + F.gelu(a) + F.silu(a), 1),
    "leaky_elu": (lambda a: F.leaky_relu(a, 0.1) + F.elu(a) + F.hardtanh(a), 1),
    "clamp_lerp": (lambda a, b: a.clamp(-0.5, 0.5) + torch.lerp(a, b, 0.3), 2),
    "addcmul_addcdiv": (lambda a, b: torch.addcmul(a, a, b, value=0.5) + torch.addcdiv(a, a, b.abs() + 1, value=2), 2),
    "scalar_ops": (lambda a: 3 - a * 2 + 1 / (a.abs() + 2) - a / 4, 1),
}


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 5)])
@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_matches_cpu(name: str, shape: tuple[int, ...]) -> None:
    fn, arity = ELEMENTWISE[name]
    check(fn, [shape] * arity)


EDGE_FLOATS = [-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.7, -3.7, float("inf"), float("-inf"), float("nan")]
EDGE_UNARY = ["abs", "neg", "exp", "log", "sqrt", "rsqrt", "sin", "tanh", "sigmoid", "floor", "ceil", "trunc", "round",
              "frac", "sign", "reciprocal", "relu", "erf", "expm1", "log1p", "log2", "log10", "isnan", "isinf",
              "isfinite", "isneginf", "isposinf", "signbit", "logical_not"]  # fmt: skip
EDGE_BINARY = ["add", "sub", "mul", "div", "remainder", "fmod", "pow", "maximum", "minimum", "floor_divide", "atan2",
               "eq", "lt", "ge", "bitwise_and", "logical_xor", "copysign"]  # fmt: skip


def _same(want: torch.Tensor, got: torch.Tensor) -> bool:
    return want.dtype == got.dtype and torch.allclose(want.double(), got.double(), equal_nan=True, atol=1e-5, rtol=1e-4)


def test_elementwise_edge_values_match_cpu() -> None:
    """Halves (round to even), signed zeros, infinities, NaN, negative ints; float and int, tensor and scalar."""
    f = torch.tensor(EDGE_FLOATS)
    i = torch.tensor([-7, -1, 0, 1, 2, 9], dtype=torch.int32)
    g = torch.tensor([2.0, -3.0, 0.5, -0.5, 3.0, 1.5, -2.0, 2.0, 2.0, 2.0, -1.0, 1.0])
    j = torch.tensor([2, 3, -3, 1, -4, 2], dtype=torch.int32)
    bad = []
    for name in EDGE_UNARY:
        for t in (f, i):
            try:
                want = getattr(torch, name)(t)
            except RuntimeError:  # not defined for this dtype on CPU either
                continue
            if not _same(want, got := getattr(torch, name)(t.to("xgrad")).cpu()):
                bad.append(f"{name}({t.dtype}): want {want.tolist()} got {got.tolist()}")
    for name in EDGE_BINARY:
        for a, b in ((f, g), (i, j), (i, 2), (f, 2), (i, 2.5)):
            try:
                want = getattr(torch, name)(a, b)
            except (RuntimeError, TypeError):  # not defined for these operands on CPU either
                continue
            other = b.to("xgrad") if isinstance(b, torch.Tensor) else b
            if not _same(want, got := getattr(torch, name)(a.to("xgrad"), other).cpu()):
                bad.append(
                    f"{name}({a.dtype}, {b!r}): want {want.tolist()} {want.dtype} got {got.tolist()} {got.dtype}"
                )
    assert bad == []


def test_int_division_rounding_modes_match_cpu() -> None:
    a, b = torch.tensor([-7, 7, -8, 5, 0, 9]), torch.tensor([2, -2, 3, -3, 4, 3])
    for mode in ("trunc", "floor", None):
        want = torch.div(a, b, rounding_mode=mode)
        assert torch.equal(torch.div(a.to("xgrad"), b.to("xgrad"), rounding_mode=mode).cpu(), want), mode
        assert torch.equal(torch.div(a.to("xgrad"), -2, rounding_mode=mode).cpu(), torch.div(a, -2, rounding_mode=mode))
    assert torch.equal((a.to("xgrad") % b.to("xgrad")).cpu(), a % b)
    assert torch.equal(torch.fmod(a.to("xgrad"), b.to("xgrad")).cpu(), torch.fmod(a, b))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_int_ops_and_promotion_match_cpu(dtype: torch.dtype) -> None:
    check(lambda a, b: (a + b * 3, a * b - 1, a // (b.abs() + 1), a % 3, a > b, a == b, a + 0.5, a / 2), [(4, 5)] * 2,
          dtype=dtype)  # fmt: skip


def test_bool_and_comparison_ops_match_cpu() -> None:
    check(lambda a, b: ((a > 0) & (b < 0), (a > 0) | (b > 0), ~(a > b), (a > 0).sum(), (a > 0).any(), (a > 0).all(1)),
          [(3, 4)] * 2)  # fmt: skip


REDUCTIONS = {
    "sum": lambda a: (a.sum(), a.sum(1), a.sum((0, 1), keepdim=True)),
    "mean_var_std": lambda a: (a.mean(0), a.var(1), a.std(), a.var(0, correction=0)),
    "max_min": lambda a: (a.amax(1), a.amin(0, keepdim=True), a.max(), a.min(), *a.max(1)),
    "argmax": lambda a: (a.argmax(), a.argmax(1), a.argmin(0, keepdim=True)),
    "logsumexp_norm": lambda a: (a.logsumexp(1), torch.linalg.vector_norm(a, dim=1), a.norm()),
    "cumsum_prod": lambda a: (a.cumsum(1), (a / 4 + 1).prod(1)),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_match_cpu(name: str) -> None:
    check(REDUCTIONS[name], [(4, 6)])


def test_int_sum_is_int64_as_torch() -> None:
    check(lambda a: (a.sum(), a.sum(0), a.max(), a.argmax(1)), [(3, 5)], dtype=torch.int32)


NN = {
    "linear": (lambda x, w, b: F.linear(x, w, b), [(5, 4), (3, 4), (3,)]),
    "matmul_bmm": (lambda a, b: (a @ b, torch.bmm(a, b)), [(2, 3, 4), (2, 4, 5)]),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), [(3, 5), (3, 4), (4, 5)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1), [(2, 3, 6, 6), (4, 3, 3, 3), (4,)]),
    "conv2d_stride_groups": (lambda x, w: F.conv2d(x, w, stride=2, groups=2), [(1, 4, 7, 7), (6, 2, 3, 3)]),
    "conv1d": (lambda x, w: F.conv1d(x, w, padding=2, dilation=2), [(2, 3, 9), (2, 3, 3)]),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1), [(1, 2, 4, 4), (2, 3, 3, 3)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), [(2, 3, 6, 6)]),
    "max_pool2d_stride_pad": (lambda x: F.max_pool2d(x, 3, stride=2, padding=1), [(1, 2, 7, 7)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2) + F.adaptive_avg_pool2d(x, 1).mean(), [(2, 3, 6, 6)]),
    "batch_norm_train": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [(4, 3, 5, 5), (3,), (3,)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (6,), w, b), [(2, 5, 6), (6,), (6,)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [(2, 4, 3, 3), (4,), (4,)]),
    "softmax": (lambda x: (F.softmax(x, 1), F.log_softmax(x, -1)), [(3, 7)]),
    "mse_loss": (lambda x, y: F.mse_loss(x, y), [(4, 5), (4, 5)]),
    "bce": (lambda x, y: F.binary_cross_entropy(torch.sigmoid(x), torch.sigmoid(y).detach()), [(4, 5), (4, 5)]),
}


@pytest.mark.parametrize("name", sorted(NN))
def test_nn_ops_match_cpu(name: str) -> None:
    fn, shapes = NN[name]
    check(fn, shapes, atol=1e-4)


@pytest.mark.parametrize("needs", [(True, False), (False, True)], ids=["input_grad_only", "weight_grad_only"])
def test_conv_backward_gives_only_the_gradients_asked_for(needs: tuple[bool, bool]) -> None:
    g = torch.Generator().manual_seed(3)
    cpu = [torch.randn(2, 3, 6, 6, generator=g), torch.randn(4, 3, 3, 3, generator=g)]
    cpu = [t.requires_grad_(need) for t, need in zip(cpu, needs)]
    dev = [t.detach().to("xgrad").requires_grad_(need) for t, need in zip(cpu, needs)]
    weight = torch.randn(2, 4, 4, 4, generator=g)
    (F.conv2d(*cpu, padding=0) * weight).sum().backward()
    (F.conv2d(*dev, padding=0) * weight.to("xgrad")).sum().backward()
    for c, x in zip(cpu, dev):
        assert (c.grad is None) == (x.grad is None)
        if c.grad is not None:
            np.testing.assert_allclose(x.grad.cpu().numpy(), c.grad.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "conv",
    [
        lambda x, w, b: F.conv2d(x, w, b, padding=1),
        lambda x, w, b: F.conv2d(x, w[:, :2], b, stride=2, groups=2),  # the weight a view
        lambda x, w, b: F.conv_transpose2d(x, w.transpose(0, 1), b, stride=2, padding=1),
    ],
    ids=["conv2d", "groups_view_weight", "transposed"],
)
def test_conv_backward_reuses_the_forward_graph(conv: Fn, monkeypatch: pytest.MonkeyPatch) -> None:
    # the backward differentiates the graph its forward built (kept while autograd may need it), not a second one
    calls: list[int] = []
    conv2d = Tensor.conv2d

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return conv2d(*args, **kwargs)

    g = torch.Generator().manual_seed(4)
    cpu = [torch.randn(*s, generator=g).requires_grad_() for s in [(2, 4, 6, 6), (4, 4, 3, 3), (4,)]]
    dev = [t.detach().to("xgrad").requires_grad_() for t in cpu]
    weight = torch.randn(conv(*cpu).shape, generator=g)
    (conv(*cpu) * weight).sum().backward()
    monkeypatch.setattr(Tensor, "conv2d", counted)
    (conv(*dev) * weight.to("xgrad")).sum().backward()
    assert len(calls) == 1
    for c, x in zip(cpu, dev):
        np.testing.assert_allclose(x.grad.cpu().numpy(), c.grad.numpy(), atol=1e-4, rtol=1e-4)


def test_conv_backward_without_the_forward_graph_matches_cpu() -> None:
    # a second backward through the same graph (retain_graph) finds the forward's graph taken: it builds it again
    g = torch.Generator().manual_seed(5)
    cpu = [torch.randn(*s, generator=g).requires_grad_() for s in [(2, 3, 5, 5), (4, 3, 3, 3)]]
    dev = [t.detach().to("xgrad").requires_grad_() for t in cpu]
    for xs in (cpu, dev):
        out = F.conv2d(*xs).square().sum()
        out.backward(retain_graph=True)
        out.backward()
    for c, x in zip(cpu, dev):
        np.testing.assert_allclose(x.grad.cpu().numpy(), c.grad.numpy(), atol=1e-4, rtol=1e-4)


def test_conv_forwards_without_backward_keep_one_graph_per_conv() -> None:
    # an evaluation without no_grad, into the same input buffer each time: each forward replaces its conv's kept graph
    g = torch.Generator().manual_seed(6)
    w_cpu = torch.randn(4, 3, 3, 3, generator=g).requires_grad_()
    w = w_cpu.detach().to("xgrad").requires_grad_()
    x = torch.zeros(2, 3, 6, 6).to("xgrad")
    batches = [torch.randn(2, 3, 6, 6, generator=g) for _ in range(5)]
    for batch in batches:
        x.copy_(batch)
        F.conv2d(x, w)
    assert len(xgrad_torch.ops_nn._saved_convs[xgrad_torch.storage.holder_of(x)]) == 1
    F.conv2d(x, w).square().sum().backward()
    F.conv2d(batches[-1], w_cpu).square().sum().backward()
    np.testing.assert_allclose(w.grad.cpu().numpy(), w_cpu.grad.numpy(), atol=1e-4, rtol=1e-4)


def test_conv_of_a_tensor_with_itself_matches_cpu() -> None:
    # input and weight are one node: each gets its own gradient (one leaf for both gave their sum to each, twice)
    check(lambda t: F.conv2d(t, t), [(2, 2, 3, 3)], atol=1e-4)


def test_view_scatters_match_cpu() -> None:
    # torch's own kernels size their copy from the storage's bytes, which the bridge's storages do not report
    check(lambda a, s: torch.slice_scatter(a, s, 1, 1, 4), [(4, 5), (4, 3)])
    check(lambda a, s: torch.slice_scatter(a.t(), s, 0, 0, 4, 2), [(4, 5), (2, 4)])
    check(lambda a, r: torch.select_scatter(a, r, 0, 2), [(4, 5), (5,)])
    check(lambda a, d: torch.diagonal_scatter(a, d, 1), [(4, 5), (4,)])


def test_cross_entropy_and_nll_match_cpu() -> None:
    target = torch.tensor([1, 0, 4, 2, -100, 3])
    check(lambda x: (F.cross_entropy(x, target.to(x.device)), F.nll_loss(F.log_softmax(x, 1), target.to(x.device),
          reduction="sum")), [(6, 5)])  # fmt: skip
    weight = torch.rand(5)
    check(lambda x: F.cross_entropy(x, target.to(x.device), weight=weight.to(x.device), reduction="none"), [(6, 5)])


def test_embedding_forward_backward_matches_cpu() -> None:
    idx = torch.tensor([[1, 3, 3], [0, 9, 1]])
    check(lambda w: F.embedding(idx.to(w.device), w), [(10, 4)])


def test_indexing_scatter_gather_match_cpu() -> None:
    idx = torch.tensor([2, 0, 2])
    gidx = torch.tensor([[0, 1, 1, 3], [2, 2, 0, 1], [3, 3, 3, 0]])
    check(lambda a: (a[idx.to(a.device)], a[:, idx.to(a.device)], a.index_select(1, idx.to(a.device))), [(3, 4)])
    check(lambda a: (a.gather(1, gidx.to(a.device)[:, :3]), a.scatter(1, gidx.to(a.device)[:, :2], 7.0)), [(3, 4)])
    check(lambda a, s: torch.zeros(3, 4, device=a.device).scatter_add(1, gidx.to(a.device), s) + a, [(3, 4), (3, 4)])
    check(lambda a: a[a > 0], [(3, 4)], grad=False)


def test_index_put_and_masked_fill_match_cpu() -> None:
    def fn(a: torch.Tensor) -> torch.Tensor:
        b = a.clone()
        b[torch.tensor([0, 2], device=a.device)] = 5.0
        b.index_put_((torch.tensor([1, 1], device=a.device), torch.tensor([0, 0], device=a.device)),
                     torch.tensor(1.5, device=a.device), accumulate=True)  # fmt: skip
        return b.masked_fill(a < 0, -1.0)

    check(fn, [(3, 4)])


def test_sort_topk_match_cpu() -> None:
    check(lambda a: (*a.sort(1), *a.sort(0, descending=True), *a.topk(2, 1)), [(4, 6)])


def test_cat_stack_pad_flip_match_cpu() -> None:
    check(lambda a, b: (torch.cat([a, b], 0), torch.stack([a, b], 1), F.pad(a, (1, 2, 0, 1)), a.flip(1), a.roll(1, 0),
          a.tril(), a.triu(1)), [(3, 4), (3, 4)])  # fmt: skip


VIEWS = {
    "slice_transpose": lambda a: a[1:, ::2].transpose(0, 2) * 2,
    "permute_reshape": lambda a: a.permute(2, 0, 1).reshape(4, -1) + 1,
    "expand_unsqueeze": lambda a: a[:, :1].expand(3, 5, 4) * a[:1],
    "select_diag_unfold": lambda a: a[1] + a[:, :, 0].diagonal().sum() + a.unfold(1, 2, 1).sum(-1).mean(),
    "contiguous_view": lambda a: a.transpose(0, 1).contiguous().view(-1) ** 2,
    "split_chunk": lambda a: sum(t.sum() for t in (*a.split(2, 1), *a.chunk(2, 2))),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_match_cpu(name: str) -> None:
    check(VIEWS[name], [(3, 5, 4)])


def test_in_place_through_views_updates_base_and_live_views() -> None:
    def fn(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        base = a.detach().clone()
        row, col, block = base[1], base[:, 2], base[1:, 1:3]
        live = base.t()
        row.mul_(10)
        col.add_(1)
        block.zero_()
        base[0, ::2] = -3.0
        live[3].fill_(7.0)
        flat = base.view(-1)
        flat[5:7].sub_(2)
        return base, row, col, block, live, flat

    for dtype in (torch.float32, torch.int32):
        check(fn, [(3, 4)], dtype=dtype, grad=False)


def test_in_place_ops_keep_autograd_correct() -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = a * 2
        c.add_(b).mul_(b)
        c[:, 0].mul_(3)
        return c.sigmoid()

    check(fn, [(3, 4), (3, 4)])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int8, torch.uint8, torch.bool])
def test_dtypes_round_trip_and_compute(dtype: torch.dtype) -> None:
    src = _inputs([(3, 4)], dtype if dtype != torch.bool else torch.int32, 3)[0]
    src = src > 0 if dtype == torch.bool else src
    x = src.to("xgrad")
    assert x.dtype == dtype
    assert torch.equal(x.cpu(), src)
    if dtype != torch.bool:
        np.testing.assert_allclose((x * 2).cpu().numpy(), (src * 2).numpy(), rtol=1e-3)
        assert torch.equal(x.to(torch.float32).cpu(), src.to(torch.float32))


def test_creation_and_random_fills() -> None:
    assert torch.equal(torch.zeros(2, 3, device="xgrad").cpu(), torch.zeros(2, 3))
    assert torch.equal(torch.full((2, 2), 3, device="xgrad").cpu(), torch.full((2, 2), 3))
    assert torch.equal(torch.arange(1, 10, 2, device="xgrad").cpu(), torch.arange(1, 10, 2))
    assert torch.equal(torch.ones_like(torch.empty(4, device="xgrad")).cpu(), torch.ones(4))
    torch.xgrad.manual_seed(0)
    u = torch.empty(4000, device="xgrad").uniform_(-2, 3).cpu()
    n = torch.randn(4000, device="xgrad").cpu()
    b = torch.empty(4000, device="xgrad").bernoulli_(0.25).cpu()
    assert -2 <= u.min() and u.max() < 3 and abs(u.mean().item() - 0.5) < 0.1
    assert abs(n.mean().item()) < 0.1 and abs(n.std().item() - 1) < 0.1
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean().item() - 0.25) < 0.05
    torch.xgrad.manual_seed(0)
    assert torch.equal(torch.empty(4000, device="xgrad").uniform_(-2, 3).cpu(), u), "manual_seed makes draws repeat"


def test_dropout_train_and_eval() -> None:
    x = torch.ones(1000, device="xgrad", requires_grad=True)
    y = F.dropout(x, 0.5, training=True)
    kept = (y.detach().cpu() != 0).float()
    assert 0.4 < kept.mean().item() < 0.6 and set(y.detach().cpu().unique().tolist()) <= {0.0, 2.0}
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), kept * 2)
    assert torch.equal(F.dropout(x, 0.5, training=False).detach().cpu(), torch.ones(1000))


def test_item_print_and_host_reads() -> None:
    x = torch.tensor([[1.5, -2.0], [3.0, 4.0]]).to("xgrad")
    assert (x.sum() * 2).item() == 13.0
    assert x.tolist() == [[1.5, -2.0], [3.0, 4.0]]
    assert "device='xgrad:0'" in repr(x)
    assert x.nonzero().cpu().tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]


def test_table_covers_the_kinds_the_readme_lists() -> None:
    kinds = {e.kind for e in TABLE.values()}
    assert {"unary", "binary", "compare", "reduce", "view", "creation", "copy", "random", "foreach", "nn", "loss",
            "index", "sort", "matmul"} <= kinds  # fmt: skip
    backward = ["convolution_backward", "max_pool2d_with_indices_backward", "native_batch_norm_backward",
                "native_layer_norm_backward", "_log_softmax_backward_data", "embedding_dense_backward"]  # fmt: skip
    for name in [
        *backward,
        "nll_loss_backward",
        "_foreach_addcdiv_.Scalar",
        "index_put_",
        "topk",
        "_local_scalar_dense",
    ]:
        assert name in TABLE, name
    assert xgrad_torch.__version__
