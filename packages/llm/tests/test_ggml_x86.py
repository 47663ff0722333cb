"""llama.cpp's x86 kernels as xgrad tensor ops (`xgrad_llm.ggml_x86`) against numpy models of the same kernels
(packages/llm/scripts/check_llamacpp_ops.py and emulate_llamacpp.py, written from ggml's source and checked bit for
bit against every node llama.cpp's AVX2 build computes for Gemma 3 270M): every result must be the same float32, bit
for bit, for both vector widths."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

from xgrad import Tensor
from xgrad_llm import ggml_x86
from xgrad_llm.quants import BLOCK_SIZES, GGMLType

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import check_llamacpp_ops as ref  # noqa: E402
import emulate_llamacpp as emu  # noqa: E402

F32 = np.float32
ISA = {8: "avx2", 16: "avx512"}


def _f16_bytes(rng: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    return np.frombuffer(rng.uniform(lo, hi, n).astype(np.float16).tobytes(), np.uint8).reshape(n, 2)


def random_blocks(kind: GGMLType, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random bytes of a (rows, cols) matrix of `kind`, with sane float16 scales."""
    rng = np.random.default_rng(seed)
    block, size = BLOCK_SIZES[kind]
    n = rows * cols // block
    b = rng.integers(0, 256, (n, size)).astype(np.uint8)
    d_at = {GGMLType.Q6_K: 208}.get(kind, 0)
    b[:, d_at : d_at + 2] = _f16_bytes(rng, n, 1e-3, 2e-2)
    if kind == GGMLType.Q4_K:
        b[:, 2:4] = _f16_bytes(rng, n, 1e-3, 2e-2)
    if kind == GGMLType.Q6_K:  # int8 sub-scales of a realistic size
        b[:, 192:208] = rng.integers(-40, 40, (n, 16)).astype(np.int8).view(np.uint8)
    return b.reshape(-1)


class _Raw:
    """Stands in for a GGUF file in check_llamacpp_ops.Weights: one matrix from bytes."""

    def __init__(self, raw: np.ndarray, kind: GGMLType, shape: tuple[int, int]) -> None:
        info = type("Info", (), {"type": int(kind), "shape": shape})()
        self.tensors = {"w": info}
        self._raw = raw

    def raw(self, name: str) -> Tensor:
        return Tensor(self._raw)


@pytest.mark.parametrize("sliced", [False, True])
@pytest.mark.parametrize("kind", [GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K])
def test_product_is_llama_cpps_vec_dot(kind: GGMLType, sliced: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole, and (`sliced`) 8 of the matrix's 28 rows at a time as a big matrix's product runs (Gemma 3's output
    head), the last slice shorter."""
    rows, cols = 28, 512
    raw = random_blocks(kind, rows, cols, seed=int(kind))
    weights = ref.Weights.__new__(ref.Weights)
    weights.file = _Raw(raw, kind, (rows, cols))  # type: ignore[assignment]
    weights.cache = {}
    x = np.random.default_rng(7).standard_normal((3, cols)).astype(F32)
    x[1, :40] = 0  # a zero block
    want = np.stack([ref.matvec(weights.get("w"), r) for r in x])
    if sliced:  # the lane sums of 8 rows: 3 inputs x 8 rows x blocks x 8 lanes x 4 bytes
        monkeypatch.setattr(ggml_x86, "SLICE_BYTES", 3 * 8 * (cols // BLOCK_SIZES[kind][0]) * 8 * 4)
    got = ggml_x86.product(Tensor(x), ggml_x86.BlockInts.from_raw(Tensor(raw), kind, (rows, cols))).numpy()
    assert got.dtype == F32
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("length", [256, 48])  # 48: all leftovers for 16 lanes (4 x 16 > 48), some for 8
def test_float16_dots_are_ggmls(lanes: int, length: int) -> None:
    rng = np.random.default_rng(lanes + length)
    a = rng.standard_normal((5, length)).astype(np.float16).astype(F32)
    b = rng.standard_normal((3, 1, length)).astype(np.float16).astype(F32)
    if length % (4 * lanes) == 0:
        want = emu.f16_dot(a, b, ISA[lanes])
    else:  # the accumulators' part, then the rest one by one in float64
        main = length - length % (4 * lanes)
        head = emu.f16_dot(a[..., :main], b[..., :main], ISA[lanes]).astype(np.float64) if main else 0.0
        want = (head + np.cumsum((a * b)[..., main:].astype(np.float64), -1)[..., -1]).astype(F32)
    np.testing.assert_array_equal(ggml_x86.vec_dot_f16(Tensor(a), Tensor(b), lanes).numpy(), want)
    if length % lanes == 0:
        tiny = ggml_x86.tiny_dot_f16(Tensor(a), Tensor(b), lanes).numpy()
        np.testing.assert_array_equal(tiny, emu.tiny_dot(a, b, ISA[lanes]))


@pytest.mark.parametrize("lanes", [8, 16])
def test_softmax_is_ggmls(lanes: int) -> None:
    rng = np.random.default_rng(lanes)
    x = (rng.standard_normal((4, 3, 128)) * 6).astype(F32)
    x[..., 70:] = -np.inf  # masked
    x[0, 0, :] = np.where(np.arange(128) < 70, -200.0, -np.inf)  # far below the max but one: underflows
    x[0, 0, 5] = 3.0
    np.testing.assert_array_equal(ggml_x86.softmax(Tensor(x), lanes).numpy(), emu.soft_max(x, ISA[lanes]))


def test_rms_norm_and_rope_are_ggmls() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 4, 64)).astype(F32)
    w = rng.standard_normal(64).astype(F32)
    want = (ref.rms_norm(x, 1e-6) * w).astype(F32)
    np.testing.assert_array_equal(ggml_x86.rms_norm(Tensor(x), Tensor(w), 1e-6).numpy(), want)
    tables = ggml_x86.rope_tables(64, 10000.0, 1.0, 6, None)
    cos, sin = Tensor(tables[0]).reshape(6, 1, 32), Tensor(tables[1]).reshape(6, 1, 32)
    a, b = ggml_x86.rotate(Tensor(x[..., :32]), Tensor(x[..., 32:]), cos, sin)
    got = np.concatenate([a.numpy(), b.numpy()], -1)
    want = np.stack([ref.rope_neox(x[p], p, 10000.0) for p in range(6)])
    np.testing.assert_array_equal(got, want)
