"""Every dequantiser against the `gguf` package's reference (`gguf.quants`), bit for bit, on random and edge blocks."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from xgrad import Tensor
from xgrad.dtype import dtypes
from xgrad.errors import DTypeError, ShapeError
from xgrad_llm.quants import BLOCK_SIZES, DEQUANTISERS, GGMLType, dequantize, tensor_nbytes

TYPES = [d.type for d in DEQUANTISERS.values()]
# byte offsets of each type's float16 scale fields (d, and dmin where it has one), for the edge-value blocks
F16_FIELDS: dict[GGMLType, tuple[int, ...]] = {
    GGMLType.F16: (0,),
    GGMLType.Q4_0: (0,),
    GGMLType.Q4_1: (0, 2),
    GGMLType.Q5_0: (0,),
    GGMLType.Q5_1: (0, 2),
    GGMLType.Q8_0: (0,),
    GGMLType.Q2_K: (80, 82),
    GGMLType.Q3_K: (108,),
    GGMLType.Q4_K: (0, 2),
    GGMLType.Q5_K: (0, 2),
    GGMLType.Q6_K: (208,),
    GGMLType.IQ4_NL: (0,),
    GGMLType.IQ4_XS: (0,),
}
# float16 bit patterns: zeros, extremes, subnormals, negative scales (no NaN: see assert_bit_exact)
F16_EDGES = (0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x03FF, 0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x1234, 0xB123)
# the quantisers the reference has, to make realistic blocks too
QUANTISABLE = {
    GGMLType.F32,
    GGMLType.F16,
    GGMLType.BF16,
    GGMLType.Q4_0,
    GGMLType.Q4_1,
    GGMLType.Q5_0,
    GGMLType.Q5_1,
    GGMLType.Q8_0,
    GGMLType.MXFP4,
}


def reference(raw: np.ndarray, t: GGMLType) -> np.ndarray:
    with np.errstate(all="ignore"):  # inf and NaN scales are among the edge cases
        out: np.ndarray = quants.dequantize(raw.reshape(-1), GGMLQuantizationType(int(t)))
    return out.reshape(-1).astype(np.float32, copy=False)


def ours(raw: np.ndarray, t: GGMLType, device: str = "CPU") -> np.ndarray:
    n = raw.size // BLOCK_SIZES[t][1] * BLOCK_SIZES[t][0]
    out: np.ndarray = dequantize(Tensor(raw.reshape(-1).copy(), device=device), t, (n,)).numpy()
    return out


def assert_bit_exact(expected: np.ndarray, actual: np.ndarray) -> None:
    """Equal bits everywhere but at NaNs, which must be NaN in both (a NaN's payload is the hardware's choice)."""
    assert expected.dtype == actual.dtype == np.float32 and expected.shape == actual.shape
    nan = np.isnan(expected)
    np.testing.assert_array_equal(nan, np.isnan(actual))
    bad = np.nonzero(expected.view(np.uint32)[~nan] != actual.view(np.uint32)[~nan])[0]
    assert bad.size == 0, (
        f"{bad.size} values differ, first at {bad[0]}: {expected[~nan][bad[0]]} vs {actual[~nan][bad[0]]}"
    )


def random_blocks(t: GGMLType, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 256, size=(n, BLOCK_SIZES[t][1]), dtype=np.uint8)


def edge_blocks(t: GGMLType, rng: np.random.Generator) -> np.ndarray:
    """Blocks with every edge scale against quants of all zeros, all ones and random bits."""
    size = BLOCK_SIZES[t][1]
    rows = []
    for fill in (np.zeros(size, np.uint8), np.full(size, 0xFF, np.uint8), random_blocks(t, 1, rng)[0]):
        if t is GGMLType.MXFP4:
            for e in (0, 1, 2, 126, 127, 253, 254, 255):
                rows.append(fill.copy())
                rows[-1][0] = e
            continue
        for edge in F16_EDGES:
            row = fill.copy()
            for at in F16_FIELDS.get(t, ()):
                row[at : at + 2] = np.frombuffer(np.uint16(edge).tobytes(), np.uint8)
            rows.append(row)
    return np.stack(rows)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_reference_on_random_blocks(t: GGMLType) -> None:
    rng = np.random.default_rng(int(t))
    raw = random_blocks(t, 24, rng)
    assert_bit_exact(reference(raw, t), ours(raw, t))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_reference_on_edge_blocks(t: GGMLType) -> None:
    raw = edge_blocks(t, np.random.default_rng(100 + int(t)))
    assert_bit_exact(reference(raw, t), ours(raw, t))


@pytest.mark.parametrize("t", sorted(QUANTISABLE), ids=lambda t: t.name)
def test_dequantize_matches_reference_on_quantized_data(t: GGMLType) -> None:
    rng = np.random.default_rng(200 + int(t))
    block = BLOCK_SIZES[t][0] if BLOCK_SIZES[t][0] > 1 else 32
    x = (rng.standard_normal((8, 4 * block)) * rng.choice([1e-4, 1.0, 300.0], size=(8, 1))).astype(np.float32)
    x[0] = 0.0  # an all-zero row: zero scales
    x[1, ::3] = -x[1, ::3]
    raw = np.asarray(quants.quantize(x, GGMLQuantizationType(int(t)))).view(np.uint8)
    expected = reference(raw, t)
    assert_bit_exact(expected, ours(raw, t))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_on_python_device(t: GGMLType) -> None:
    raw = random_blocks(t, 2, np.random.default_rng(300 + int(t)))
    assert_bit_exact(reference(raw, t), ours(raw, t, device="PYTHON"))


def test_dequantize_keeps_shape_and_fuses_into_matmul() -> None:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    raw = np.asarray(quants.quantize(w, GGMLQuantizationType.Q8_0)).view(np.uint8).reshape(-1)
    weight = dequantize(Tensor(raw.copy()), GGMLType.Q8_0, (6, 64))
    assert weight.shape == (6, 64) and weight.dtype == dtypes.float32
    x = rng.standard_normal((3, 64)).astype(np.float32)
    expected = x @ reference(raw, GGMLType.Q8_0).reshape(6, 64).T
    np.testing.assert_allclose((Tensor(x) @ weight.T).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_dequantize_of_empty_tensor_is_empty() -> None:
    assert dequantize(Tensor.empty(0, dtype=dtypes.uint8), GGMLType.Q4_K, (0, 256)).shape == (0, 256)


def test_dequantize_refuses_types_without_a_dequantiser() -> None:
    with pytest.raises(DTypeError, match="IQ2_XXS"):
        dequantize(Tensor.empty(66, dtype=dtypes.uint8), GGMLType.IQ2_XXS, (256,))


def test_dequantize_refuses_wrong_byte_count() -> None:
    with pytest.raises(ShapeError, match="needs 34 uint8 bytes"):
        dequantize(Tensor.empty(33, dtype=dtypes.uint8), GGMLType.Q8_0, (32,))
    with pytest.raises(ShapeError, match="multiple of 32"):
        tensor_nbytes(GGMLType.Q8_0, (2, 16))


def test_table_covers_the_issue_types() -> None:
    names = {t.name for t in TYPES}
    assert names == {
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4",
    }  # fmt: skip
    for t in GGMLType:  # our block table agrees with the reference's
        from gguf.constants import GGML_QUANT_SIZES

        assert BLOCK_SIZES[t] == GGML_QUANT_SIZES[GGMLQuantizationType(int(t))], t.name
