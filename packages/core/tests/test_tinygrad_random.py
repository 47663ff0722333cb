"""tinygrad compatibility, random numbers: the argument rules of tinygrad's `rand`, `randn`, `normal`, `uniform`,
`randint` and `multinomial` (the builtin error types tinygrad code catches), int dtypes where tinygrad takes them, and
shapes with bound Variables. Distributions are checked against numpy's statistics of the same sample sizes."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Tensor, Variable, dtypes


def test_uniform_int_dtypes_cover_low_to_high_evenly() -> None:
    for dt in (dtypes.int8, dtypes.uint8, dtypes.int64):
        t = Tensor.uniform(3000, low=2, high=7, dtype=dt)
        assert t.dtype == dt
        values, counts = np.unique(t.numpy(), return_counts=True)
        assert values.tolist() == [2, 3, 4, 5, 6]
        assert counts.min() > 450 and counts.max() < 750  # 600 each expected; 6 sigma is about 130


def test_uniform_needs_low_below_high() -> None:
    with pytest.raises(ValueError, match="low < high"):
        Tensor.uniform(3, low=1.0, high=1.0)
    with pytest.raises(ValueError, match="low < high"):
        Tensor.uniform(3, low=2, high=0, dtype=dtypes.int32)


def test_randint_argument_rules() -> None:
    with pytest.raises(TypeError, match="int bounds"):
        Tensor.randint(3, low=0.5, high=3)
    with pytest.raises(TypeError, match="int bounds"):
        Tensor.randint(3, low=0, high=3.0)
    with pytest.raises(TypeError, match="not float32"):
        Tensor.randint(3, high=3, dtype=dtypes.float32)
    with pytest.raises(TypeError, match="not bool"):
        Tensor.randint(3, high=2, dtype=dtypes.bool)
    with pytest.raises(ValueError, match="low < high"):
        Tensor.randint(3, low=3, high=3)
    t = Tensor.randint((40, 50), low=-3, high=2, dtype=dtypes.int16)
    assert t.shape == (40, 50) and t.dtype == dtypes.int16
    assert sorted(np.unique(t.numpy()).tolist()) == [-3, -2, -1, 0, 1]


def test_normal_argument_validation_and_moments() -> None:
    with pytest.raises(ValueError, match="std >= 0"):
        Tensor.normal(3, mean=0.0, std=-1.0)
    x = Tensor.normal(20000, mean=3.0, std=2.0).numpy()
    # the sample mean and std of 20000 draws are within a few standard errors of the true values
    assert abs(x.mean() - 3.0) < 5 * 2.0 / np.sqrt(x.size)
    assert abs(x.std() - 2.0) < 5 * 2.0 / np.sqrt(2 * x.size)
    assert Tensor.normal(2, 2, mean=1.5, std=0.0).tolist() == [[1.5, 1.5], [1.5, 1.5]]


def test_rand_refuses_int_dtypes_with_value_error() -> None:
    with pytest.raises(ValueError, match="floating-point"):
        Tensor.rand(3, dtype=dtypes.int32)
    with pytest.raises(TypeError):  # also xgrad's DTypeError
        Tensor.rand(3, dtype=dtypes.int32)


def test_randn_with_an_int_dtype_is_the_normals_cast() -> None:
    x = Tensor.randn(20000, dtype=dtypes.int32)
    assert x.dtype == dtypes.int32
    v = x.numpy()
    # P(|z| < 1) = 0.6827 gives 0 after rounding toward zero, P(1 <= |z| < 2) = 0.2718 gives +-1
    assert abs((v == 0).mean() - 0.6827) < 0.02 and abs((np.abs(v) == 1).mean() - 0.2718) < 0.02


def test_multinomial_of_one_weight_always_draws_it() -> None:
    assert Tensor([2.0]).multinomial(4, replacement=True).tolist() == [0, 0, 0, 0]
    assert Tensor([2.0]).multinomial(1).tolist() == [0]
    assert Tensor([[1.0], [3.0]]).multinomial(2, replacement=True).tolist() == [[0, 0], [0, 0]]


def test_multinomial_argument_errors_are_assertion_errors() -> None:
    for bad in (lambda: Tensor.ones(2, 2, 2).multinomial(1), lambda: Tensor([1.0, 2.0]).multinomial(0)):
        with pytest.raises(AssertionError):
            bad()
    with pytest.raises(AssertionError, match="without replacement"):
        Tensor([2.0]).multinomial(2)
    with pytest.raises(ValueError):  # a ShapeError as well
        Tensor([2.0]).multinomial(2)


def test_multinomial_frequencies_match_the_weights() -> None:
    w = np.array([1.0, 0.0, 3.0, 4.0])
    draws = Tensor(w).multinomial(8000, replacement=True).numpy()
    freq = np.bincount(draws, minlength=4) / draws.size
    np.testing.assert_allclose(freq, w / w.sum(), atol=0.03)


def test_rand_and_randn_with_a_symbolic_size() -> None:
    v = Variable("v", 1, 10).bind(4)
    r = Tensor.rand(3, v)
    assert r.shape[0] == 3 and r.shape[1] is not None and r.numpy().shape == (3, 4)
    vals = r.numpy()
    assert ((vals >= 0) & (vals < 1)).all()
    assert Tensor.randn(v, 2).numpy().shape == (4, 2)
    assert Tensor.uniform(v, low=-1.0, high=1.0).numpy().shape == (4,)
