"""MoE routing (`xgrad_llm.moe.route`) against a numpy oracle: softmax, top-k by argsort, renormalisation."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad import Tensor
from xgrad_llm.moe import route


def numpy_route(scores: np.ndarray, k: int, normalize: bool) -> np.ndarray:
    z = scores.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[..., :k]  # stable: the lower index first among equals
    out = np.zeros_like(p)
    np.put_along_axis(out, top, np.take_along_axis(p, top, -1), -1)
    return out / out.sum(-1, keepdims=True) if normalize else out


@pytest.mark.parametrize(("e", "k", "normalize"), [(8, 2, True), (16, 5, False), (6, 1, False)])
def test_route_matches_numpy_top_k(e: int, k: int, normalize: bool) -> None:
    scores = np.random.default_rng(e * 10 + k).standard_normal((2, 7, e)).astype(np.float32)
    got = route(Tensor(scores), k, normalize).numpy()
    np.testing.assert_allclose(got, numpy_route(scores, k, normalize), atol=1e-6, rtol=1e-5)
    assert ((got > 0).sum(-1) == k).all()


def test_route_ties_pick_the_lower_index() -> None:
    scores = np.array([[1.0, 3.0, 1.0, 3.0, 3.0, 0.0]], np.float32)
    got = route(Tensor(scores), 2, False).numpy()
    np.testing.assert_allclose(got, numpy_route(scores, 2, False), atol=1e-7)
    assert np.flatnonzero(got[0]).tolist() == [1, 3]


def test_route_picks_the_top_k_of_a_case_a_fused_softmax_miscounted() -> None:
    """Scores from a tiny OLMoE's decode step where a softmax fused into the ranking kernel (vector exp2 on one side,
    scalar on the other) ranked two experts below themselves."""
    scores = np.array([[[0.1418977, 1.0972812, 1.4616872, 0.2961851, -1.5146896, -0.8382494, -2.3335593, 1.1482496]]])
    got = route(Tensor(scores.astype(np.float32)), 2, False).numpy()
    np.testing.assert_allclose(got, numpy_route(scores, 2, False), atol=1e-6)
