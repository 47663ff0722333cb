"""A CI-sized, representative subset of the op conformance suite (packages/core/tests/test_ops.py, test_reduce.py,
test_conv.py, test_nn_functional.py) as tensor programs on a given device, shared by the compile-only tests (every
kernel rendered and compiled for sm_80/sm_90/sm_120) and the mock-GPU tests (every kernel run and compared with
numpy): elementwise float math, int division and bit ops, every cast family incl. half/bfloat16/fp8, bitcast, where,
movement ops, reductions, softmax, cumsum, argmax, gather, matmul (float32, float16 and bfloat16 on tensor cores),
conv2d, pooling, layernorm, attention-like chains and symbolic (variable) shapes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from xgrad.dtype import dtypes
from xgrad.tensor import Tensor


@dataclass(frozen=True)
class OpCase:
    """An op: `build(device)` makes the result tensor; `expect()` is numpy's value (None: compile-only), `atol` the
    tolerance of the comparison."""

    name: str
    build: Callable[[str], Tensor]
    expect: Callable[[], np.ndarray] | None
    atol: float = 1e-5
    rtol: float = 1e-5


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(*shape: int, seed: int = 0, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return _rng(seed).uniform(low, high, size=shape).astype(np.float32)


def i32(*shape: int, seed: int = 0, low: int = -50, high: int = 50) -> np.ndarray:
    return _rng(seed).integers(low, high, size=shape).astype(np.int32)


A, B = f32(8, 33), f32(8, 33, seed=1)
P = f32(8, 33, seed=2, low=0.1, high=4.0)
IA = i32(8, 16)
IB = np.where(i32(8, 16, seed=1, low=-7, high=8) == 0, 5, i32(8, 16, seed=1, low=-7, high=8)).astype(np.int32)
M1, M2 = f32(32, 48, seed=3), f32(48, 24, seed=4)
H1, H2 = M1.astype(np.float16), M2.astype(np.float16)
T1, T2 = f32(32, 64, seed=5), f32(64, 16, seed=6)
IMG, W = f32(2, 3, 10, 10, seed=7), f32(4, 3, 3, 3, seed=8)
SM = f32(4, 40, seed=9, low=-6, high=6)


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even), as float32."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _conv2d(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1), np.float64)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", x[:, :, i : i + h - kh + 1, j : j + wd - kw + 1], w[:, :, i, j])
    return out.astype(np.float32)


def _t(a: np.ndarray, device: str, dtype: Any = None) -> Tensor:
    return Tensor(a, device=device, dtype=dtype)


def _layernorm(x: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    return _softmax(q @ k.T / np.sqrt(q.shape[-1])) @ v


Q, K, V = f32(16, 32, seed=10), f32(24, 32, seed=11), f32(24, 32, seed=12)
IDX = _rng(13).integers(0, 33, size=(8, 5)).astype(np.int32)

OPS: list[OpCase] = [
    OpCase("add_mul", lambda d: _t(A, d) * _t(B, d) + 1.5, lambda: A * B + 1.5),
    OpCase("div", lambda d: _t(A, d) / _t(P, d), lambda: A / P),
    OpCase("exp_log", lambda d: _t(P, d).log() + _t(A, d).exp(), lambda: np.log(P) + np.exp(A), 1e-5, 1e-5),
    OpCase("sin_sqrt", lambda d: _t(A, d).sin() + _t(P, d).sqrt(), lambda: np.sin(A) + np.sqrt(P), 1e-5, 1e-5),
    OpCase("relu_max_where", lambda d: (_t(A, d) > 0).where(_t(A, d), _t(B, d)).maximum(-0.5).relu(),
           lambda: np.maximum(np.maximum(np.where(A > 0, A, B), -0.5), 0)),
    OpCase("int_divmod", lambda d: _t(IA, d) // _t(IB, d) + _t(IA, d) % 7,
           lambda: IA // IB + IA % 7),
    OpCase("bit_ops", lambda d: (_t(IA, d) & 12) ^ (_t(IB, d) | 3) << 2,
           lambda: (IA & 12) ^ ((IB | 3) << 2)),
    OpCase("cast_half", lambda d: _t(A, d).cast(dtypes.float16) * 3,
           lambda: (A.astype(np.float16) * 3).astype(np.float16), 2e-3, 2e-3),
    OpCase("cast_bf16", lambda d: (_t(A, d).cast(dtypes.bfloat16) + 1).cast(dtypes.float32),
           lambda: _bf16_round(_bf16_round(A) + 1), 1e-2, 1e-2),
    OpCase("cast_int64_uint8", lambda d: (_t(A * 40, d).cast(dtypes.int64) + 3).cast(dtypes.uint8).cast(dtypes.int32),
           lambda: ((A * 40).astype(np.int64) + 3).astype(np.uint8).astype(np.int32)),
    OpCase("cast_fp8", lambda d: _t(A, d).cast(dtypes.fp8e4m3).cast(dtypes.float32), None),
    OpCase("float64", lambda d: _t(A.astype(np.float64), d).exp() * 2, lambda: np.exp(A.astype(np.float64)) * 2,
           1e-12, 1e-12),
    OpCase("bitcast", lambda d: _t(A, d).bitcast(dtypes.int32) >> 3, lambda: A.view(np.int32) >> 3),
    OpCase("bool_logic", lambda d: ((_t(A, d) > 0) & (_t(B, d) < 0.5)).cast(dtypes.int32),
           lambda: ((A > 0) & (B < 0.5)).astype(np.int32)),
    OpCase("movement",
           lambda d: _t(A, d).reshape(4, 66).permute(1, 0).flip(0).pad(((1, 2), (0, 1))).shrink(((2, 40), None)) * 2,
           lambda: np.pad(A.reshape(4, 66).T[::-1], ((1, 2), (0, 1)))[2:40] * 2),
    OpCase("sum_axis", lambda d: _t(A, d).sum(1), lambda: A.sum(1)),
    OpCase("max_mean", lambda d: _t(A, d).max(0) + _t(B, d).mean(), lambda: A.max(0) + B.mean()),
    OpCase("sum_big", lambda d: _t(f32(4096, seed=14), d).sum(), lambda: f32(4096, seed=14).sum(), 1e-3, 1e-4),
    OpCase("argmax", lambda d: _t(A, d).argmax(1).cast(dtypes.int32), lambda: A.argmax(1).astype(np.int32)),
    OpCase("softmax", lambda d: _t(SM, d).softmax(-1), lambda: _softmax(SM)),
    OpCase("log_softmax", lambda d: _t(SM, d).log_softmax(-1), lambda: np.log(_softmax(SM)), 1e-5, 1e-5),
    OpCase("cumsum", lambda d: _t(A, d).cumsum(1), lambda: A.cumsum(1), 1e-4, 1e-5),
    OpCase("gather", lambda d: _t(A, d).gather(1, _t(IDX, d)), lambda: np.take_along_axis(A, IDX, 1)),
    OpCase("matmul_f32", lambda d: _t(M1, d) @ _t(M2, d), lambda: M1 @ M2, 1e-4, 1e-5),
    OpCase("matmul_f16_tc", lambda d: _t(H1, d).matmul(_t(H2, d), dtype=dtypes.float32),
           lambda: H1.astype(np.float32) @ H2.astype(np.float32), 1e-3, 1e-4),
    OpCase("matmul_bf16_tc", lambda d: _t(T1, d).cast(dtypes.bfloat16).realize().matmul(
               _t(T2, d).cast(dtypes.bfloat16).realize(), dtype=dtypes.float32),
           lambda: _bf16_round(T1) @ _bf16_round(T2), 1e-3, 1e-4),
    OpCase("matmul_f16_out_f16", lambda d: _t(H1, d) @ _t(H2, d),
           lambda: (H1.astype(np.float32) @ H2.astype(np.float32)).astype(np.float16), 5e-2, 1e-2),
    OpCase("conv2d", lambda d: _t(IMG, d).conv2d(_t(W, d), padding=1), lambda: _conv2d(IMG, W, 1), 1e-4, 1e-4),
    OpCase("max_pool", lambda d: _t(IMG, d).max_pool2d(2), lambda: IMG.reshape(2, 3, 5, 2, 5, 2).max((3, 5))),
    OpCase("avg_pool", lambda d: _t(IMG, d).avg_pool2d(2), lambda: IMG.reshape(2, 3, 5, 2, 5, 2).mean((3, 5))),
    OpCase("layernorm", lambda d: _t(SM, d).layernorm(), lambda: _layernorm(SM), 1e-4, 1e-4),
    OpCase("attention", lambda d: (_t(Q, d) @ _t(K, d).T / np.sqrt(32)).softmax(-1) @ _t(V, d),
           lambda: _attention(Q, K, V), 1e-4, 1e-4),
]  # fmt: skip

OPS_BY_NAME = {op.name: op for op in OPS}


def op_params() -> list[Any]:
    import pytest

    return [pytest.param(op, id=op.name) for op in OPS]
