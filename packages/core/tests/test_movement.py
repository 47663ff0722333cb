"""Movement, joining and tiling ops (`xgrad.mixin.movement`, `xgrad.mixin.rearrange`): forward and backward against
torch on every available device (fixture `xgrad_device`), every dtype for the dtype-agnostic ops, and the errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch_compare import run_docstring

from xgrad.dtype import dtypes, to_np_dtype
from xgrad.errors import IndexingError, ShapeError, XgradError
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported

rng = np.random.default_rng(0)
Fn = Callable[..., Any]


def rand(shape: tuple[int, ...]) -> np.ndarray:
    return np.asarray(rng.uniform(-2.0, 2.0, size=shape), dtype=np.float32)


def _outputs(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check(device: str, fn: Fn, torch_fn: Fn | None, *shapes: tuple[int, ...]) -> None:
    """Forward and backward of `fn` against `torch_fn` (default `fn`) on float64 torch tensors; `fn` may return a
    tuple of tensors. The backward pass uses a random upstream gradient for every output."""
    arrays = [rand(s) for s in shapes]
    xs = [Tensor(a, device=device, requires_grad=True) for a in arrays]  # a 0-d one: a buffer, not a constant
    ts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    outs, wants = _outputs(fn(*xs)), _outputs((torch_fn or fn)(*ts))
    assert len(outs) == len(wants), f"{len(outs)} outputs, torch has {len(wants)}"
    ups = [rand(o.shape) for o in outs]
    loss = outs[0].mul(Tensor(ups[0], device=device)).sum()
    for o, u in zip(outs[1:], ups[1:]):
        loss = loss + o.mul(Tensor(u, device=device)).sum()
    want_loss = sum((w * torch.tensor(u.astype(np.float64))).sum() for w, u in zip(wants, ups))
    grads = loss.gradient(*xs)  # built before reading the outputs: a read may realize them
    for o, w in zip(outs, wants):
        assert o.shape == tuple(w.shape), f"forward shape {o.shape} != torch {tuple(w.shape)}"
        np.testing.assert_allclose(o.numpy(), w.detach().numpy(), atol=1e-6, rtol=1e-6)
    want_grads = torch.autograd.grad(want_loss, ts, allow_unused=True)
    for i, (g, wg, x) in enumerate(zip(grads, want_grads, xs)):
        assert g.shape == x.shape, f"grad {i} shape {g.shape} != input shape {x.shape}"
        expected = np.zeros(x.shape) if wg is None else wg.numpy()
        np.testing.assert_allclose(g.numpy(), expected, atol=1e-5, rtol=1e-5, err_msg=f"gradient of input {i}")


def _rearrange_ref(x: torch.Tensor) -> torch.Tensor:  # 'b (h w) c -> b c h w' with h=2
    b, hw, c = x.shape
    return x.reshape(b, 2, hw // 2, c).permute(0, 3, 1, 2)


CASES: list[tuple[str, Fn, Fn | None, tuple[tuple[int, ...], ...]]] = [
    # rank changes
    ("view", lambda x: x.view(3, -1), lambda x: x.view(3, -1), ((2, 3, 2),)),
    ("view_empty", lambda x: x.view(0, 4), lambda x: x.view(0, 4), ((2, 0, 2),)),
    ("flatten_mid", lambda x: x.flatten(1, 2), lambda x: x.flatten(1, 2), ((2, 3, 2, 2),)),
    ("flatten_0d", lambda x: x.flatten(), lambda x: x.flatten(), ((),)),
    ("unflatten", lambda x: x.unflatten(1, (2, -1)), lambda x: x.unflatten(1, (2, -1)), ((3, 6),)),
    ("transpose_neg", lambda x: x.transpose(-1, 0), lambda x: x.transpose(-1, 0), ((2, 3, 4),)),
    ("T", lambda x: x.T, lambda x: x.T, ((2, 3),)),
    ("T_1d", lambda x: x.T, lambda x: x, ((3,),)),
    ("squeeze_all", lambda x: x.squeeze(), lambda x: x.squeeze(), ((1, 3, 1, 2),)),
    ("squeeze_dims", lambda x: x.squeeze((0, 1)), lambda x: x.squeeze((0, 1)), ((1, 3, 1, 2),)),
    ("squeeze_not_one", lambda x: x.squeeze(1), lambda x: x.squeeze(1), ((1, 3),)),
    ("unsqueeze_neg", lambda x: x.unsqueeze(-1), lambda x: x.unsqueeze(-1), ((2, 3),)),
    ("unsqueeze_0d", lambda x: x.unsqueeze(0), lambda x: x.unsqueeze(0), ((),)),
    ("shrink_to", lambda x: x.shrink_to(2, None), lambda x: x[:2], ((3, 4),)),
    ("pad_to", lambda x: x.pad_to(4, None, value=1.5), lambda x: F.pad(x, (0, 0, 0, 1), value=1.5), ((3, 2),)),
    # joining and splitting
    ("cat", lambda x, y, z: x.cat(y, z, dim=1), lambda x, y, z: torch.cat([x, y, z], 1), ((2, 1), (2, 3), (2, 2))),
    ("cat_empty", lambda x, y: x.cat(y), lambda x, y: torch.cat([x, y]), ((0, 3), (2, 3))),
    ("cat_neg_dim", lambda x, y: x.cat(y, dim=-1), lambda x, y: torch.cat([x, y], -1), ((2, 2, 1), (2, 2, 2))),
    ("stack", lambda x, y: x.stack(y, dim=1), lambda x, y: torch.stack([x, y], 1), ((2, 3), (2, 3))),
    ("stack_last", lambda x, y: x.stack(y, dim=-1), lambda x, y: torch.stack([x, y], -1), ((3,), (3,))),
    ("stack_0d", lambda x, y: x.stack(y), lambda x, y: torch.stack([x, y]), ((), ())),
    ("split_int", lambda x: x.split(2, dim=1), lambda x: x.split(2, dim=1), ((2, 5),)),
    ("split_sizes", lambda x: x.split([1, 0, 2]), lambda x: x.split([1, 0, 2]), ((3, 2),)),
    ("chunk", lambda x: x.chunk(3, dim=-1), lambda x: x.chunk(3, dim=-1), ((2, 7),)),
    ("chunk_more_than_size", lambda x: x.chunk(4), lambda x: x.chunk(4), ((2, 2),)),
    # tiling
    ("repeat", lambda x: x.repeat(2, 1, 3), lambda x: x.repeat(2, 1, 3), ((2, 2),)),
    ("repeat_zero", lambda x: x.repeat(0, 2), lambda x: x.repeat(0, 2), ((2, 2),)),
    ("repeat_interleave", lambda x: x.repeat_interleave(3, 1), lambda x: x.repeat_interleave(3, 1), ((2, 2),)),
    ("repeat_interleave_flat", lambda x: x.repeat_interleave(2), lambda x: x.repeat_interleave(2), ((2, 3),)),
    ("roll", lambda x: x.roll(2, 1), lambda x: x.roll(2, 1), ((2, 5),)),
    ("roll_multi", lambda x: x.roll((-1, 7), (0, 1)), lambda x: x.roll((-1, 7), (0, 1)), ((3, 4),)),
    ("roll_flat", lambda x: x.roll(-3), lambda x: x.roll(-3), ((2, 3),)),
    ("roll_empty", lambda x: x.roll(1, 0), lambda x: x.roll(1, 0), ((0, 3),)),
    ("unfold", lambda x: x.unfold(1, 3, 2), lambda x: x.unfold(1, 3, 2), ((2, 8, 2),)),
    ("unfold_overlap", lambda x: x.unfold(0, 4, 1), lambda x: x.unfold(0, 4, 1), ((6,),)),
    ("unfold_whole", lambda x: x.unfold(-1, 3, 5), lambda x: x.unfold(-1, 3, 5), ((2, 3),)),
    ("unfold_size0", lambda x: x.unfold(0, 0, 2), lambda x: x.unfold(0, 0, 2), ((3,),)),
    ("meshgrid_ij", lambda x, y: x.meshgrid(y), lambda x, y: torch.meshgrid(x, y, indexing="ij"), ((2,), (3,))),
    (
        "meshgrid_xy",
        lambda x, y, z: x.meshgrid(y, z, indexing="xy"),
        lambda x, y, z: torch.meshgrid(x, y, z, indexing="xy"),
        ((2,), (3,), (4,)),
    ),
    # diagonals
    ("diag", lambda x: x.diag(), torch.diag, ((4,),)),
    ("diag_empty", lambda x: x.diag(), torch.diag, ((0,),)),
    ("diagonal", lambda x: x.diagonal(), lambda x: x.diagonal(), ((3, 4),)),
    ("diagonal_offset", lambda x: x.diagonal(2), lambda x: x.diagonal(2), ((3, 4),)),
    ("diagonal_neg_offset", lambda x: x.diagonal(-1, 2, 0), lambda x: x.diagonal(-1, 2, 0), ((3, 2, 4),)),
    ("diagonal_past_edge", lambda x: x.diagonal(5), lambda x: x.diagonal(5), ((3, 4),)),
    # pad modes
    ("pad_flat", lambda x: x.pad((1, 2, 0, 1)), lambda x: F.pad(x, (1, 2, 0, 1)), ((2, 3),)),
    ("pad_pairs", lambda x: x.pad(((1, 0), None)), lambda x: F.pad(x, (0, 0, 1, 0)), ((2, 3),)),
    ("pad_value_neg", lambda x: x.pad((-1, 2), value=-3.0), lambda x: F.pad(x, (-1, 2), value=-3.0), ((2, 3),)),
    ("pad_reflect", lambda x: x.pad((2, 1), mode="reflect"), lambda x: F.pad(x, (2, 1), mode="reflect"), ((2, 4),)),
    (
        "pad_reflect_2d",
        lambda x: x.pad(((1, 2), (2, 0)), mode="reflect"),
        lambda x: F.pad(x[None], (2, 0, 1, 2), mode="reflect")[0],
        ((3, 3),),
    ),
    (
        "pad_replicate",
        lambda x: x.pad((2, 3), mode="replicate"),
        lambda x: F.pad(x, (2, 3), mode="replicate"),
        ((2, 3),),
    ),
    ("pad_circular", lambda x: x.pad((3, 1), mode="circular"), lambda x: F.pad(x, (3, 1), mode="circular"), ((2, 3),)),
    (
        "pad_circular_neg",
        lambda x: x.pad((-1, 2, 1, -1), mode="circular"),
        lambda x: F.pad(x[None], (-1, 2, 1, -1), mode="circular")[0],
        ((3, 4),),
    ),
    (
        "pad_reflect_neg",
        lambda x: x.pad((-1, 2), mode="reflect"),
        lambda x: F.pad(x, (-1, 2), mode="reflect"),
        ((2, 5),),
    ),
    # einops
    ("rearrange_group", lambda x: x.rearrange("b (h w) c -> b c h w", h=2), _rearrange_ref, ((2, 6, 3),)),
    (
        "rearrange_ellipsis",
        lambda x: x.rearrange("a ... c -> c (... a)"),
        lambda x: x.permute(3, 1, 2, 0).reshape(x.shape[3], -1),
        ((2, 3, 2, 4),),
    ),
    (
        "rearrange_units",
        lambda x: x.rearrange("a 1 b -> b () a 1"),
        lambda x: x.permute(2, 1, 0)[..., None],
        ((2, 1, 3),),
    ),
    ("rearrange_0d", lambda x: x.rearrange("-> 1"), lambda x: x.reshape(1), ((),)),
]


@pytest.mark.parametrize("name,fn,torch_fn,shapes", CASES, ids=[c[0] for c in CASES])
def test_movement_matches_torch_forward_and_backward(xgrad_device, name, fn, torch_fn, shapes):
    check(xgrad_device, fn, torch_fn, *shapes)


DTYPES = [
    dtypes.bool,
    dtypes.int8,
    dtypes.uint8,
    dtypes.int16,
    dtypes.int32,
    dtypes.int64,
    dtypes.float16,
    dtypes.float32,
    dtypes.float64,
]
DTYPE_CASES: list[tuple[str, Fn, Fn]] = [
    ("cat", lambda x: x.cat(x.flip(0), dim=1), lambda x: torch.cat([x, x.flip(0)], 1)),
    ("stack", lambda x: x.stack(x, dim=2), lambda x: torch.stack([x, x], 2)),
    ("pad_reflect", lambda x: x.pad((2, 1), mode="reflect"), lambda x: x[:, [2, 1, 0, 1, 2, 3, 2]]),
    ("pad_value", lambda x: x.pad((1, 1), value=1), lambda x: F.pad(x, (1, 1), value=1)),
    ("roll", lambda x: x.roll(1, 1), lambda x: x.roll(1, 1)),
    ("repeat", lambda x: x.repeat(2, 1), lambda x: x.repeat(2, 1)),
    ("unfold", lambda x: x.unfold(1, 2, 1), lambda x: x.unfold(1, 2, 1)),
    ("diagonal", lambda x: x.diagonal(1), lambda x: x.diagonal(1)),
    ("diag", lambda x: x[0].diag(), lambda x: torch.diag(x[0])),
    ("rearrange", lambda x: x.rearrange("a (b c) -> c a b", c=2), lambda x: x.reshape(3, 2, 2).permute(2, 0, 1)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=[d.name for d in DTYPES])
def test_movement_keeps_every_dtype(xgrad_device, dtype):
    skip_unsupported(xgrad_device, dtype)
    np_dt = to_np_dtype(dtype)
    arr = (rng.random((3, 4)) > 0.5) if dtype == dtypes.bool else rng.integers(0, 100, size=(3, 4)).astype(np_dt)
    x = Tensor(arr, device=xgrad_device, dtype=dtype)
    for name, fn, torch_fn in DTYPE_CASES:
        out = fn(x)
        want = torch_fn(torch.from_numpy(arr)).numpy()
        assert out.dtype == dtype, f"{name}: dtype {out.dtype} != {dtype}"
        np.testing.assert_array_equal(out.numpy(), want, err_msg=name)


def test_cat_promotes_dtypes(xgrad_device):
    a = Tensor([1, 2], device=xgrad_device, dtype=dtypes.int32)
    b = Tensor([0.5], device=xgrad_device, dtype=dtypes.float32)
    out = a.cat(b)
    assert out.dtype == dtypes.float32 and out.tolist() == [1.0, 2.0, 0.5]
    assert Tensor([True], device=xgrad_device).cat(Tensor([False, True], device=xgrad_device)).tolist() == [
        True,
        False,
        True,
    ]


def test_split_and_chunk_edge_cases_match_torch(xgrad_device):
    x = Tensor.zeros(0, 2, device=xgrad_device)
    assert [t.shape for t in x.split(2)] == [tuple(t.shape) for t in torch.zeros(0, 2).split(2)]
    assert [t.shape for t in x.chunk(3)] == [tuple(t.shape) for t in torch.zeros(0, 2).chunk(3)]
    y = Tensor.arange(6, device=xgrad_device)
    assert [t.tolist() for t in y.chunk(4)] == [t.tolist() for t in torch.arange(6).chunk(4)]


def test_zero_dim_tensors_keep_their_shape(xgrad_device):
    x = Tensor(3.0, device=xgrad_device)
    assert x.T.shape == () and x.squeeze().shape == () and x.squeeze(0).shape == ()
    assert x.unfold(0, 1, 1).tolist() == [3.0]
    assert x.repeat(2).tolist() == [3.0, 3.0]
    assert x.meshgrid(Tensor([1.0, 2.0], device=xgrad_device))[0].tolist() == [[3.0, 3.0]]


BAD: list[tuple[str, Fn, type[Exception]]] = [
    ("reshape_two_holes", lambda x: x.reshape(-1, -1), ShapeError),
    ("reshape_count", lambda x: x.reshape(4, 2), ShapeError),
    ("reshape_negatives", lambda x: x.reshape(-2, -3), ShapeError),  # their product is the element count
    ("reshape_hole_zero", lambda x: x.reshape(0, -1), ShapeError),
    ("reshape_hole_uneven", lambda x: x.reshape(4, -1), ShapeError),
    ("cat_shapes", lambda x: x.cat(Tensor.zeros(3, 2)), ShapeError),
    ("cat_0d", lambda x: x[0, 0].cat(x[0, 0]), ShapeError),
    ("cat_dim", lambda x: x.cat(x, dim=2), IndexingError),
    ("stack_shapes", lambda x: x.stack(x[:1]), ShapeError),
    ("split_sizes", lambda x: x.split([1, 2]), ShapeError),
    ("split_zero", lambda x: x.split(0), ShapeError),
    ("chunk_zero", lambda x: x.chunk(0), ShapeError),
    ("pad_mode", lambda x: x.pad((1, 1), mode="edge"), XgradError),
    ("pad_mode_value", lambda x: x.pad((1, 1), mode="reflect", value=2.0), XgradError),
    ("pad_reflect_big", lambda x: x.pad((3, 0), mode="reflect"), ShapeError),
    ("pad_circular_big", lambda x: x.pad((0, 4), mode="circular"), ShapeError),
    ("pad_replicate_empty", lambda x: x[:, :0].pad((1, 0), mode="replicate"), ShapeError),
    ("pad_odd", lambda x: x.pad((1, 2, 3)), ShapeError),
    ("pad_to_smaller", lambda x: x.pad_to(1, 3), ShapeError),
    ("shrink_to_rank", lambda x: x.shrink_to(1), ShapeError),
    ("unflatten", lambda x: x.unflatten(1, (2, 2)), ShapeError),
    ("flatten_order", lambda x: x.flatten(1, 0), ShapeError),
    ("repeat_short", lambda x: x.repeat(2), ShapeError),
    ("repeat_interleave_tensor", lambda x: x.repeat_interleave(x), ShapeError),
    ("roll_lengths", lambda x: x.roll((1, 2), 0), ShapeError),
    ("unfold_big", lambda x: x.unfold(1, 4, 1), ShapeError),
    ("unfold_step", lambda x: x.unfold(1, 1, 0), ShapeError),
    ("diag_2d", lambda x: x.diag(), ShapeError),
    ("diagonal_same", lambda x: x.diagonal(0, 1, 1), ShapeError),
    ("meshgrid_index", lambda x: x[0].meshgrid(x[1], indexing="ji"), XgradError),
    ("rearrange_arrow", lambda x: x.rearrange("a b"), ShapeError),
    ("rearrange_missing", lambda x: x.rearrange("a b -> a"), ShapeError),
    ("rearrange_rank", lambda x: x.rearrange("a b c -> a b c"), ShapeError),
    ("rearrange_split", lambda x: x.rearrange("a (b c) -> a b c", b=2), ShapeError),
    ("rearrange_unknown", lambda x: x.rearrange("a (b c) -> a b c"), ShapeError),
    ("rearrange_dup", lambda x: x.rearrange("a a -> a"), ShapeError),
    ("rearrange_nest", lambda x: x.rearrange("a ((b)) -> a b"), ShapeError),
    ("rearrange_number", lambda x: x.rearrange("a (b 3) -> a b", b=1), ShapeError),
    ("rearrange_dots", lambda x: x.rearrange("a ... -> a"), ShapeError),
    ("rearrange_size_name", lambda x: x.rearrange("a b -> b a", c=2), ShapeError),
]


@pytest.mark.parametrize("name,fn,err", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_raise_clear_errors(name, fn, err):
    with pytest.raises(err):
        fn(Tensor.zeros(2, 3))


METHODS = [
    "reshape",
    "view",
    "permute",
    "expand",
    "shrink",
    "flip",
    "pad",
    "shrink_to",
    "pad_to",
    "flatten",
    "unflatten",
    "transpose",
    "unsqueeze",
    "squeeze",
    "cat",
    "stack",
    "split",
    "chunk",
    "unfold",
    "meshgrid",
    "repeat",
    "repeat_interleave",
    "roll",
    "diag",
    "diagonal",
    "rearrange",
]


@pytest.mark.parametrize("name", METHODS)
def test_docstring_example_runs_for_method(name: str) -> None:
    run_docstring(name)


def test_docstring_example_runs_for_T() -> None:  # noqa: N802
    run_docstring("T")
