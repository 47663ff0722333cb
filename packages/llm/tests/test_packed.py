"""Packed quantised matrices (`xgrad_llm.packed`): the same values as the `gguf` package's dequantisation, bit for
bit, from the packed layout; matrix products against numpy; the memory they take; bad input."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_quants import assert_bit_exact, edge_blocks, random_blocks, reference  # noqa: E402

from xgrad import Tensor  # noqa: E402
from xgrad.errors import DTypeError, ShapeError  # noqa: E402
from xgrad.helpers import GlobalCounters  # noqa: E402
from xgrad_llm.packed import LANES, PackedMatrix, can_pack  # noqa: E402
from xgrad_llm.quants import AFFINE, BLOCK_SIZES, GGMLType  # noqa: E402

PACKABLE = sorted(AFFINE)


def matrix_blocks(t: GGMLType, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """Random blocks for a (rows, blocks_per_row * block_size) matrix, with edge-case scales mixed in."""
    rng = np.random.default_rng(seed)
    raw = random_blocks(t, rows * blocks_per_row, rng)
    edges = edge_blocks(t, rng)
    raw[: min(len(edges), len(raw))] = edges[: len(raw)]
    return raw


@pytest.mark.parametrize("t", PACKABLE, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [3, 2 * LANES + 5])  # panels padded with zero rows: one short panel, and more
def test_packed_values_match_reference_bit_for_bit(t: GGMLType, rows: int) -> None:
    raw = matrix_blocks(t, rows, 2, seed=rows * 100 + int(t))
    k = 2 * BLOCK_SIZES[t][0]
    m = PackedMatrix(Tensor(raw.reshape(-1).copy()), t, (rows, k))
    assert m.t().shape == (k, rows)
    assert_bit_exact(reference(raw, t).reshape(rows, k), np.ascontiguousarray(m.t().numpy().T))


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.Q5_0, GGMLType.Q8_0], ids=lambda t: t.name)
def test_packed_values_on_python_device(t: GGMLType) -> None:
    raw = matrix_blocks(t, 5, 1, seed=7)
    k = BLOCK_SIZES[t][0]
    m = PackedMatrix(Tensor(raw.reshape(-1).copy(), device="PYTHON"), t, (5, k))
    assert_bit_exact(reference(raw, t).reshape(5, k), np.ascontiguousarray(m.t().numpy().T))


MATMUL_TYPES = [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q5_0, GGMLType.Q6_K, GGMLType.Q8_0]


@pytest.mark.parametrize("t", MATMUL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("tokens", [1, 7])
def test_packed_matmul_matches_numpy(t: GGMLType, tokens: int) -> None:
    """Decode (one row of activations) and prefill (several): one kernel reads the packed bytes."""
    rows, k = 4 * LANES + 32, 2 * BLOCK_SIZES[t][0]
    raw = random_blocks(t, rows * k // BLOCK_SIZES[t][0], np.random.default_rng(int(t)))
    scales = {GGMLType.Q4_0: (0,), GGMLType.Q5_0: (0,), GGMLType.Q8_0: (0,), GGMLType.Q4_K: (0, 2)}
    for at in scales.get(t, (208,)):  # finite scales of a realistic size
        raw[:, at : at + 2] = np.array([0.01], np.float16).view(np.uint8)
    w = reference(raw, t).reshape(rows, k)
    x = np.random.default_rng(1).standard_normal((tokens, k)).astype(np.float32)
    m = PackedMatrix(Tensor(raw.reshape(-1).copy()), t, (rows, k))
    expected = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose((Tensor(x) @ m.t()).numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("t", MATMUL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("lead", [(1,), (4,), (2, 3)])  # a decode step, a batched round of 4 streams, (B, T)
def test_packed_product_group_by_group_matches_numpy(t: GGMLType, lead: tuple[int, ...]) -> None:
    """`product` sums each scale group's products before scaling them (and adds offset x the group's sum of x): the
    same x @ W.T as numpy's float64 product of the gguf package's dequantised weights, in one kernel."""
    rows, k = 4 * LANES + 32, 4 * BLOCK_SIZES[t][0]  # a short last panel; several scale groups per row
    raw = random_blocks(t, rows * k // BLOCK_SIZES[t][0], np.random.default_rng(int(t) + 10))
    scales = {GGMLType.Q4_0: (0,), GGMLType.Q5_0: (0,), GGMLType.Q8_0: (0,), GGMLType.Q4_K: (0, 2)}
    for at in scales.get(t, (208,)):  # finite scales of a realistic size
        raw[:, at : at + 2] = np.array([0.01], np.float16).view(np.uint8)
    w = reference(raw, t).reshape(rows, k)
    x = np.random.default_rng(2).standard_normal((*lead, k)).astype(np.float32)
    m = PackedMatrix(Tensor(raw.reshape(-1).copy()), t, (rows, k))
    expected = x.astype(np.float64) @ w.T.astype(np.float64)
    GlobalCounters.reset()
    got = m.product(Tensor(x)).realize()
    assert GlobalCounters.kernel_count <= (2 if m.offset is not None else 1)  # the offset's group sums of x: one more
    assert got.shape == (*lead, rows)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_packed_product_refuses_a_wrong_width() -> None:
    m = packed(GGMLType.Q8_0, 16, 64)
    with pytest.raises(ShapeError, match="make its last axis 64"):
        m.product(Tensor.ones(2, 32))


def packed(t: GGMLType, rows: int, k: int) -> PackedMatrix:
    raw = random_blocks(t, rows * k // BLOCK_SIZES[t][0], np.random.default_rng(0))
    return PackedMatrix(Tensor(raw.reshape(-1)), t, (rows, k))


def test_packed_sizes() -> None:
    """4-bit types take half a byte per weight, the others one, plus their scales (float16 where the file's are)."""
    rows, k = 64, 256
    assert packed(GGMLType.Q4_K, rows, k).nbytes == rows * k // 2 + 2 * 4 * rows * k // 32  # float32 scale, offset
    assert packed(GGMLType.Q8_0, rows, k).nbytes == rows * k + 2 * rows * k // 32  # float16 scale per 32
    assert packed(GGMLType.Q6_K, rows, k).nbytes == rows * k + 4 * rows * k // 16  # float32 scale per 16


def test_packed_refuses_bad_input() -> None:
    assert can_pack(GGMLType.Q4_K) and not can_pack(GGMLType.F16) and not can_pack(999)
    with pytest.raises(DTypeError, match="F16 matrix cannot be packed"):
        PackedMatrix(Tensor.empty(64, dtype="uint8"), GGMLType.F16, (1, 32))
    with pytest.raises(ShapeError, match="do not hold"):
        PackedMatrix(Tensor.empty(33, dtype="uint8"), GGMLType.Q8_0, (1, 32))
    with pytest.raises(ShapeError, match="do not hold"):
        PackedMatrix(Tensor.empty(34, dtype="uint8"), GGMLType.Q8_0, (1, 48))


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.Q8_0], ids=lambda t: t.name)
def test_packed_in_chunks_from_a_file(t: GGMLType, tmp_path: pathlib.Path) -> None:
    """Packing reads `chunk` bytes of the file at a time (whole panels; the last run short) and gives the same bytes
    as packing all at once from memory."""
    rows, k = 5 * 2 * LANES + 3, BLOCK_SIZES[t][0]
    raw = matrix_blocks(t, rows, 1, seed=11)
    (tmp_path / "w.bin").write_bytes(raw.tobytes())
    on_disk = Tensor(tmp_path / "w.bin")
    row_bytes = BLOCK_SIZES[t][1]
    whole = PackedMatrix(Tensor(raw.reshape(-1).copy()), t, (rows, k))
    chunked = PackedMatrix(on_disk, t, (rows, k), device="CPU", chunk=2 * 2 * LANES * row_bytes)
    np.testing.assert_array_equal(whole.q.numpy(), chunked.q.numpy())
    for a, b in ((whole.scale, chunked.scale), (whole.offset, chunked.offset)):  # equal, NaNs where NaNs
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert_bit_exact(reference(raw, t).reshape(rows, k), np.ascontiguousarray(chunked.t().numpy().T))
