"""Where tinygrad raises a builtin exception type, xgrad's error derives from it too, so tinygrad code's `except
RuntimeError:` / `except ValueError:` / ... keeps working. Each case is a call tinygrad's docstrings and tests show
failing, with the builtin type tinygrad raises there (read from tinygrad's source); every error is also an
XgradError that names the problem."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from xgrad import Tensor, dtypes, nn
from xgrad.errors import XgradError

CASES: list[tuple[str, Callable[[], Any], type[BaseException]]] = [
    ("tensor_from_object", lambda: Tensor(object()), RuntimeError),
    ("assign_dtype", lambda: Tensor([1.0]).realize().assign(Tensor([1])), RuntimeError),
    ("assign_device", lambda: Tensor([1.0]).realize().assign(Tensor([1.0], device="PYTHON")), RuntimeError),
    ("setitem_dtype", lambda: Tensor([1.0, 2.0]).realize().__setitem__(0, Tensor(1, dtype=dtypes.int32)), RuntimeError),
    ("div_rounding_mode", lambda: Tensor([1.0]).div(Tensor([2.0]), rounding_mode="bad"), RuntimeError),
    ("clamp_without_bounds", lambda: Tensor([1.0]).clamp(), RuntimeError),
    ("gelu_approximate", lambda: Tensor([1.0]).gelu(approximate="bad"), RuntimeError),
    ("reshape_two_inferred", lambda: Tensor.ones(4).reshape(-1, -1), RuntimeError),
    ("reshape_size", lambda: Tensor.ones(4).reshape(3), ValueError),
    ("expand_fewer_dims", lambda: Tensor.ones(2, 3).expand(3), ValueError),
    ("permute_repeated", lambda: Tensor.ones(2, 3).permute(0, 0), RuntimeError),
    ("flip_repeated", lambda: Tensor.ones(2, 3).flip(0, 0), RuntimeError),
    ("meshgrid_indexing", lambda: Tensor.ones(2).meshgrid(Tensor.ones(2), indexing="zz"), RuntimeError),
    ("diagonal_same_dims", lambda: Tensor.ones(2, 2).diagonal(dim1=0, dim2=0), RuntimeError),
    ("roll_lengths", lambda: Tensor.ones(2, 2).roll((1, 1), (0,)), RuntimeError),
    ("unfold_too_big", lambda: Tensor.ones(4).unfold(0, 5, 1), RuntimeError),
    ("pad_mode", lambda: Tensor.ones(2, 2).pad((1, 1), mode="bogus"), NotImplementedError),
    ("pad_odd_flat", lambda: Tensor.ones(2, 2).pad((1, 1, 1)), ValueError),
    ("dot_0d", lambda: Tensor(1.0).dot(Tensor([1.0])), RuntimeError),
    ("matmul_shapes", lambda: Tensor.ones(2, 3) @ Tensor.ones(2, 3), RuntimeError),
    ("einsum_operand_count", lambda: Tensor.einsum("ij,jk->ik", Tensor.ones(2, 2)), ValueError),
    ("gradient_non_float", lambda: Tensor([1, 2]).sum().gradient(Tensor([1, 2])), RuntimeError),
    ("gradient_non_scalar", lambda: (Tensor([1.0, 2.0]) * 2).gradient(Tensor([1.0])), AssertionError),
    ("topk_too_many", lambda: Tensor.ones(3).topk(5), ValueError),
    ("one_hot_float", lambda: Tensor([1.0]).one_hot(3), RuntimeError),
    ("one_hot_negative_classes", lambda: Tensor([1]).one_hot(-2), ValueError),
    ("gather_ndim", lambda: Tensor.ones(2, 2).gather(0, Tensor([0])), RuntimeError),
    ("scatter_dtype", lambda: Tensor.ones(2).scatter(0, Tensor([0]), Tensor([1])), RuntimeError),
    (
        "scatter_reduce_name",
        lambda: Tensor.ones(2).scatter_reduce(0, Tensor([0]), Tensor([1.0]), reduce="x"),
        RuntimeError,
    ),
    ("scatter_reduce_arg", lambda: Tensor.ones(2).scatter(0, Tensor([0]), Tensor([1.0]), reduce="x"), TypeError),
    ("masked_select_mask", lambda: Tensor.ones(2).masked_select(Tensor([1, 0])), RuntimeError),
    ("loss_reduction", lambda: Tensor.ones(2).binary_crossentropy(Tensor.ones(2), reduction="x"), ValueError),
    ("cross_entropy_labels", lambda: Tensor.ones(2, 3).sparse_categorical_crossentropy(Tensor([[0, 1]])), RuntimeError),
    ("dropout_probability", lambda: Tensor.ones(2).dropout(1.5), ValueError),
    (
        "attention_mask_and_causal",
        lambda: Tensor.ones(1, 2, 2).scaled_dot_product_attention(
            Tensor.ones(1, 2, 2), Tensor.ones(1, 2, 2), attn_mask=Tensor.ones(2, 2), is_causal=True
        ),
        RuntimeError,
    ),
    ("embedding_float_index", lambda: nn.Embedding(3, 2)(Tensor([1.0])), TypeError),
    ("optimizer_lr", lambda: nn.optim.SGD([Tensor([1.0])], lr=-1), ValueError),
    ("optimizer_momentum", lambda: nn.optim.SGD([Tensor([1.0])], momentum=-1), ValueError),
    ("optimizer_weight_decay", lambda: nn.optim.AdamW([Tensor([1.0])], weight_decay=-1), ValueError),
    ("optimizer_outside_training", lambda: nn.optim.SGD([Tensor([1.0])]).step(), RuntimeError),
    (
        "load_state_dict_shape",
        lambda: nn.state.load_state_dict(nn.Linear(2, 2), {"weight": Tensor.ones(3, 3), "bias": Tensor.ones(2)}),
        ValueError,
    ),
    ("from_py_object", lambda: dtypes.from_py(object()), RuntimeError),
    ("bool_of_tensor", lambda: bool(Tensor([1, 2])), TypeError),
    ("len_of_0d", lambda: len(Tensor(1)), TypeError),
    ("index_two_ellipses", lambda: Tensor.ones(2, 2)[..., ...], IndexError),
    ("index_out_of_bounds", lambda: Tensor.ones(2)[5], IndexError),
    ("delete_item", lambda: Tensor.ones(2).__delitem__(0), TypeError),
    ("arange_beyond_dtype", lambda: Tensor.arange(0, 300, dtype=dtypes.int8), OverflowError),
    ("linspace_bool", lambda: Tensor.linspace(0, 1, 3, dtype=dtypes.bool), ValueError),
]


@pytest.mark.parametrize(("fn", "builtin"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error_derives_from_tinygrads_builtin_type(fn: Callable[[], Any], builtin: type[BaseException]) -> None:
    with pytest.raises(builtin) as info:
        fn()
    assert isinstance(info.value, XgradError), f"{type(info.value).__name__} is not an XgradError"
    assert str(info.value), "the error says nothing"
