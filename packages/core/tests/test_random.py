"""Random numbers (`xgrad.mixin.random`) on every available device (fixture `xgrad_device`).

The generator is checked bit for bit: Threefry-2x32 against the Random123 known-answer vectors and against a
pure-Python reference written here from the published algorithm, and `rand` against the documented stream (key from
sha256 of device index and seed, word `w` from block `counter + w // 2`, float32 = top 24 bits * 2**-24). The
distributions get statistical sanity checks (moments, a chi-square bucket test, permutations); dropout and random
factors are compared with torch forward and backward.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from xgrad.dtype import DType, dtypes
from xgrad.engine.jit import TinyJit
from xgrad.errors import DTypeError, ShapeError, XgradError
from xgrad.helpers import Context
from xgrad.tensor import Tensor
from xgrad.testing import skip_unsupported
from xgrad.uop.ops import Ops

M32 = 0xFFFFFFFF


# ---- pure-Python reference (Salmon et al. 2011, Threefry-2x32 with 20 rounds) ----
def ref_threefry(c0: int, c1: int, k0: int, k1: int) -> tuple[int, int]:
    rotations = [13, 15, 26, 6, 17, 29, 16, 24]
    keys = [k0, k1, 0x1BD11BDA ^ k0 ^ k1]
    x = [(c0 + keys[0]) & M32, (c1 + keys[1]) & M32]
    for rnd in range(20):
        x[0] = (x[0] + x[1]) & M32
        rot = rotations[rnd % 8]
        x[1] = (((x[1] << rot) | (x[1] >> (32 - rot))) & M32) ^ x[0]
        if rnd % 4 == 3:
            inj = rnd // 4 + 1
            x[0] = (x[0] + keys[inj % 3]) & M32
            x[1] = (x[1] + keys[(inj + 1) % 3] + inj) & M32
    return x[0], x[1]


def ref_key(seed: int, device_index: int = 0) -> tuple[int, int]:
    digest = hashlib.sha256(f"{device_index}:{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:8], "little")


def ref_words(key: tuple[int, int], first_block: int, num: int) -> list[int]:
    out = []
    for w in range(num):
        block = first_block + w // 2
        out.append(ref_threefry(block & M32, (block >> 32) & M32, *key)[w % 2])
    return out


# Random123 kat_vectors, threefry2x32 with 20 rounds: (counter words, key words, output words)
KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
]


def samples(device: str) -> int:
    """Sample count for statistical checks: the PYTHON reference device interprets every op, so it gets fewer."""
    return 256 if device.startswith("PYTHON") else 4096


def u32(values: list[int] | list[list[int]], device: str) -> Tensor:
    return Tensor(values, device=device, dtype=dtypes.uint32)


# ---- threefry and random_bits ----
def test_reference_threefry_matches_known_answers() -> None:
    for counter, key, want in KAT:
        assert ref_threefry(*counter, *key) == want


def test_threefry_matches_known_answers_for_uint32_words(xgrad_device: str) -> None:
    blocks = u32([list(c) for c, _, _ in KAT], xgrad_device)
    keys = u32([list(k) for _, k, _ in KAT], xgrad_device)
    assert blocks.threefry(keys).tolist() == [list(w) for _, _, w in KAT]


def test_threefry_matches_known_answers_for_uint64(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.uint64)
    blocks = Tensor([c[1] << 32 | c[0] for c, _, _ in KAT], device=xgrad_device, dtype=dtypes.uint64)
    keys = Tensor([k[1] << 32 | k[0] for _, k, _ in KAT], device=xgrad_device, dtype=dtypes.uint64)
    assert blocks.threefry(keys).tolist() == [w[1] << 32 | w[0] for _, _, w in KAT]
    assert blocks.threefry(0).tolist()[0] == KAT[0][2][1] << 32 | KAT[0][2][0]


def test_threefry_matches_reference_with_broadcast_key(xgrad_device: str) -> None:
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 2**32, size=(2, 3, 2), dtype=np.uint64).tolist()
    key = [0xDEADBEEF, 0x01234567]
    got = u32(blocks, xgrad_device).threefry(u32(key, xgrad_device)).tolist()
    assert got == [[list(ref_threefry(*b, *key)) for b in row] for row in blocks]
    assert u32(blocks[0][0], xgrad_device).threefry(0x0123456700000005).tolist() == list(
        ref_threefry(*blocks[0][0], 5, 0x01234567)
    )


def test_threefry_raises_for_bad_input(xgrad_device: str) -> None:
    with pytest.raises(DTypeError, match="int32"):
        Tensor([1, 2], device=xgrad_device).threefry(0)
    with pytest.raises(ShapeError, match="2 words"):
        u32([1, 2, 3], xgrad_device).threefry(0)


@pytest.mark.parametrize("counter,num", [((0, 0), 5), ((0xFFFFFFFE, 7), 7), ((0xFFFFFFFF, 0xFFFFFFFF), 4)])
def test_random_bits_matches_reference_across_carries(xgrad_device: str, counter: tuple[int, int], num: int) -> None:
    key = (0x9E3779B9, 0x7F4A7C15)
    got = Tensor.random_bits(u32(list(key), xgrad_device), u32(list(counter), xgrad_device), num).tolist()
    assert got == ref_words(key, counter[1] << 32 | counter[0], num)


def test_random_bits_raises_for_bad_key(xgrad_device: str) -> None:
    with pytest.raises(DTypeError, match="key"):
        Tensor.random_bits(Tensor([1, 2], device=xgrad_device), u32([0, 0], xgrad_device), 3)


# ---- the stream: seed, counter, determinism ----
def test_rand_matches_reference_stream(xgrad_device: str) -> None:
    Tensor.manual_seed(1234)
    first = Tensor.rand(5, device=xgrad_device).numpy()
    second = Tensor.rand(2, 3, device=xgrad_device).numpy()
    key = ref_key(1234)
    want_first = [(w >> 8) * 2.0**-24 for w in ref_words(key, 0, 5)]
    want_second = [(w >> 8) * 2.0**-24 for w in ref_words(key, 3, 6)]  # 5 words used 3 blocks
    assert first.tolist() == want_first
    assert second.reshape(-1).tolist() == want_second
    assert Tensor._device_rng_counters[xgrad_device].tolist() == [6, 0]


def test_repeated_draws_from_a_kept_graph_follow_the_reference_stream(xgrad_device: str) -> None:
    """Later draws of a size copy the graph the first one built (over placeholder key and counter buffers) onto the
    new counter snapshot: the numbers must be those of the stream, draw after draw, for words and for blocks."""
    Tensor.manual_seed(77)
    key = ref_key(77)
    got = [Tensor.rand(7, device=xgrad_device).tolist() for _ in range(4)]  # 4 blocks a draw
    for i, draw in enumerate(got):
        assert draw == [(w >> 8) * 2.0**-24 for w in ref_words(key, 4 * i, 7)]
    blocks = [Tensor._random_blocks(3, xgrad_device) for _ in range(2)]  # counters 16.. and 19..
    for i, (x0, x1) in enumerate(blocks):
        words = ref_words(key, 16 + 3 * i, 6)
        assert x0.tolist() == words[0::2] and x1.tolist() == words[1::2]


def test_kept_draw_graphs_are_bounded(xgrad_device: str) -> None:
    import xgrad.mixin.random as random_mixin

    Tensor.rand(1, device=xgrad_device).realize()  # the key is realized: later draws use kept graphs
    for n in range(1, random_mixin.DRAW_GRAPHS_KEPT + 10):
        Tensor.rand(n, device=xgrad_device)
    assert len(random_mixin._DRAW_GRAPHS) == random_mixin.DRAW_GRAPHS_KEPT


def test_float64_and_randn_take_both_words_of_a_block(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float64)
    Tensor.manual_seed(99)
    got64 = Tensor.rand(3, device=xgrad_device, dtype=dtypes.float64).tolist()
    normal = Tensor.randn(4, device=xgrad_device).numpy()
    words = ref_words(ref_key(99), 0, 6 + 8)
    assert got64 == [((words[2 * i] >> 5) * 2.0**26 + (words[2 * i + 1] >> 6)) * 2.0**-53 for i in range(3)]
    u1 = np.array([(w >> 8) * 2.0**-24 for w in words[6::2]])
    u2 = np.array([(w >> 8) * 2.0**-24 for w in words[7::2]])
    np.testing.assert_allclose(normal, np.sqrt(-2 * np.log(1 - u1)) * np.cos(2 * np.pi * u2), rtol=1e-4, atol=1e-5)


def test_rand_is_reproducible_after_manual_seed(xgrad_device: str) -> None:
    Tensor.manual_seed(42)
    a, b = Tensor.rand(3, device=xgrad_device).tolist(), Tensor.rand(3, device=xgrad_device).tolist()
    assert a != b
    Tensor.manual_seed(42)
    assert Tensor.rand(3, device=xgrad_device).tolist() == a
    assert Tensor.rand(3, device=xgrad_device).tolist() == b
    Tensor.manual_seed(43)
    assert Tensor.rand(3, device=xgrad_device).tolist() != a


def test_rand_draws_stay_distinct_while_lazy(xgrad_device: str) -> None:
    Tensor.manual_seed(7)
    draws = [Tensor.rand(4, device=xgrad_device, contiguous=False) for _ in range(3)]
    values = [d.tolist() for d in reversed(draws)][::-1]  # realized in reverse order: each keeps its own block range
    Tensor.manual_seed(7)
    assert values == [Tensor.rand(4, device=xgrad_device).tolist() for _ in range(3)]
    assert len({tuple(v) for v in values}) == 3


def test_rand_in_tinyjit_continues_the_sequence(xgrad_device: str) -> None:
    def step(x: Tensor) -> Tensor:
        return (x + Tensor.rand(3, device=xgrad_device)).realize()

    x = Tensor([10.0, 20.0, 30.0], device=xgrad_device).realize()
    Tensor.manual_seed(5)
    plain = [step(x).tolist() for _ in range(4)]
    Tensor.manual_seed(5)
    jitted = TinyJit(step)
    assert [jitted(x).tolist() for _ in range(4)] == plain
    assert len({tuple(p) for p in plain}) == 4


@pytest.mark.parametrize("shape", [(), (0,), (2, 0), (1,), (2, 3)])
def test_rand_has_shape_and_range(xgrad_device: str, shape: tuple[int, ...]) -> None:
    x = Tensor.rand(*shape, device=xgrad_device)
    assert (x.shape, x.dtype, x.device) == (shape, dtypes.float32, xgrad_device)
    v = x.numpy()
    assert v.shape == shape and ((v >= 0) & (v < 1)).all()


def test_rand_of_zero_elements_keeps_the_counter(xgrad_device: str) -> None:
    Tensor.manual_seed(0)
    Tensor.rand(1, device=xgrad_device).realize()
    Tensor.rand(0, 3, device=xgrad_device).realize()
    assert Tensor._device_rng_counters[xgrad_device].tolist() == [1, 0]


def test_rand_contiguous_flag_controls_realization(xgrad_device: str) -> None:
    assert Tensor.rand(3, device=xgrad_device).uop.op is Ops.CONTIGUOUS
    assert Tensor.rand(3, device=xgrad_device, contiguous=False).uop.op is not Ops.CONTIGUOUS


def test_rand_raises_for_non_float_dtype(xgrad_device: str) -> None:
    with pytest.raises(DTypeError, match="int32"):
        Tensor.rand(3, device=xgrad_device, dtype=dtypes.int32)
    with pytest.raises(ShapeError, match="negative"):
        Tensor.rand(2, -1, device=xgrad_device)


# ---- distributions ----
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64])
def test_rand_moments_for_dtype(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    Tensor.manual_seed(11)
    n = samples(xgrad_device)
    x = Tensor.rand(n, device=xgrad_device, dtype=dtype)
    assert x.dtype == dtype
    v = x.numpy().astype(np.float64)
    assert ((v >= 0) & (v < 1)).all()
    assert abs(v.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(v.var() - 1 / 12) < 5 * math.sqrt((1 / 80 - 1 / 144) / n)
    assert len(np.unique(v)) > min(n // 4, 2 ** dtypes.finfo(dtype)[1])


def test_rand_float32_uses_24_bits(xgrad_device: str) -> None:
    Tensor.manual_seed(2)
    v = Tensor.rand(samples(xgrad_device), device=xgrad_device).numpy().astype(np.float64)
    k = v * 2**24
    assert (k == np.floor(k)).all()  # k * 2**-24, exactly
    assert (k % 2 == 1).any()  # the lowest of the 24 bits is used too


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.float64])
def test_randn_moments_for_dtype(xgrad_device: str, dtype: DType) -> None:
    skip_unsupported(xgrad_device, dtype)
    Tensor.manual_seed(12)
    n = samples(xgrad_device)
    x = Tensor.randn(n, device=xgrad_device, dtype=dtype)
    assert (x.shape, x.dtype) == ((n,), dtype)
    v = x.numpy().astype(np.float64)
    assert np.isfinite(v).all()
    assert abs(v.mean()) < 5 / math.sqrt(n)
    assert abs(v.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs(np.mean(np.abs(v) < 1) - 0.6827) < 5 * math.sqrt(0.22 / n)


def test_normal_and_uniform_have_their_parameters(xgrad_device: str) -> None:
    Tensor.manual_seed(13)
    n = samples(xgrad_device)
    v = Tensor.normal(n, mean=3.0, std=0.5, device=xgrad_device).numpy()
    assert abs(v.mean() - 3.0) < 5 * 0.5 / math.sqrt(n) and abs(v.std() - 0.5) < 0.05
    u = Tensor.uniform(n, low=-2.0, high=6.0, device=xgrad_device).numpy()
    assert ((u >= -2.0) & (u < 6.0)).all()
    assert abs(u.mean() - 2.0) < 5 * 8 / math.sqrt(12 * n)
    assert Tensor.uniform(2, 2, low=1.0, high=2.0, device=xgrad_device, dtype=dtypes.float16).dtype == dtypes.float16


def test_like_forms_follow_self(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float16)
    x = Tensor.zeros(2, 3, device=xgrad_device, dtype=dtypes.float16)
    for r in (x.rand_like(), x.randn_like()):
        assert (r.shape, r.dtype, r.device) == ((2, 3), dtypes.float16, xgrad_device)
    assert x.rand_like(dtype=dtypes.float32).dtype == dtypes.float32
    ints = Tensor([[1, 2]], device=xgrad_device)
    assert ints.rand_like().dtype == dtypes.float32 and ints.randn_like().dtype == dtypes.float32


def test_init_helpers_have_torch_bounds(xgrad_device: str) -> None:
    Tensor.manual_seed(14)
    shape = (16, 8, 3) if not xgrad_device.startswith("PYTHON") else (8, 4, 3)
    fan_in, fan_out = shape[1] * shape[2], shape[0] * shape[2]
    numel = shape[0] * fan_in
    bounds = {
        "scaled_uniform": 1 / math.sqrt(numel),
        "glorot_uniform": math.sqrt(6 / (shape[0] + fan_in)),
        "kaiming_uniform": math.sqrt(2 / (1 + 0.2**2)) * math.sqrt(3 / fan_in),  # torch.nn.init gain * sqrt(3/fan_in)
    }
    for name, bound in bounds.items():
        kw = {"a": 0.2} if name == "kaiming_uniform" else {}
        v = getattr(Tensor, name)(*shape, device=xgrad_device, **kw).numpy()
        assert v.shape == shape and np.abs(v).max() <= bound
        assert np.abs(v).max() > 0.8 * bound, name
    torch.manual_seed(0)  # unseeded, torch's own estimate over 96 values missed the 15% band now and then
    t = torch.empty(shape)
    torch.nn.init.kaiming_normal_(t, a=0.2)
    want_std = math.sqrt(2 / (1 + 0.2**2)) / math.sqrt(fan_in)
    v = Tensor.kaiming_normal(*shape, a=0.2, device=xgrad_device).numpy()
    assert abs(v.std() / want_std - 1) < 0.15 and abs(t.std().item() / want_std - 1) < 0.15
    del fan_out


# ---- integers ----
def test_randint_buckets_pass_chi_square(xgrad_device: str) -> None:
    Tensor.manual_seed(21)
    n = samples(xgrad_device)
    v = Tensor.randint(n, low=-3, high=5, device=xgrad_device).numpy()
    assert v.dtype == np.int32 and v.min() >= -3 and v.max() < 5
    counts = np.bincount(v + 3, minlength=8)
    chi2 = ((counts - n / 8) ** 2 / (n / 8)).sum()
    assert chi2 < 30, counts  # 7 degrees of freedom: P(chi2 > 30) < 1e-4


@pytest.mark.parametrize(
    "dtype,low,high",
    [
        (dtypes.int8, -128, 128),
        (dtypes.uint8, 250, 256),
        (dtypes.int16, -7, -2),
        (dtypes.uint16, 0, 65536),
        (dtypes.int32, -(2**31), 2**31),
        (dtypes.uint32, 2**32 - 5, 2**32),
        (dtypes.int64, -(2**40), 2**40),
        (dtypes.int64, -(2**62), -(2**62) + 3),
        (dtypes.uint64, 0, 2**64),
    ],
)
def test_randint_stays_in_range_for_dtype(xgrad_device: str, dtype: DType, low: int, high: int) -> None:
    skip_unsupported(xgrad_device, dtype)
    x = Tensor.randint(4, 16, low=low, high=high, device=xgrad_device, dtype=dtype)
    assert (x.shape, x.dtype) == ((4, 16), dtype)
    values = [v for row in x.tolist() for v in row]
    assert all(low <= v < high for v in values)
    assert len(set(values)) >= min(high - low, 32)


def test_randint_shapes_and_errors(xgrad_device: str) -> None:
    assert Tensor.randint(0, 2, device=xgrad_device).shape == (0, 2)
    assert Tensor.randint(device=xgrad_device).shape == ()
    with pytest.raises(XgradError, match="low < high"):
        Tensor.randint(3, low=5, high=5, device=xgrad_device)
    with pytest.raises(DTypeError, match="float32"):
        Tensor.randint(3, device=xgrad_device, dtype=dtypes.float32)
    with pytest.raises(DTypeError, match="int8"):
        Tensor.randint(3, low=0, high=300, device=xgrad_device, dtype=dtypes.int8)
    with pytest.raises(DTypeError, match="int bounds"):
        Tensor.randint(3, low=0.5, high=3, device=xgrad_device)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, 1, 9, 33])
def test_randperm_is_a_permutation(xgrad_device: str, n: int) -> None:
    Tensor.manual_seed(n)
    p = Tensor.randperm(n, device=xgrad_device)
    assert (p.shape, p.dtype) == ((n,), dtypes.int32)
    assert sorted(p.tolist()) == list(range(n))


def test_randperm_draws_differ_and_cover_positions(xgrad_device: str) -> None:
    Tensor.manual_seed(31)
    perms = [
        tuple(Tensor.randperm(4, device=xgrad_device, dtype=dtypes.int16 if i % 2 else None).tolist())
        for i in range(24)
    ]
    assert len(set(perms)) >= 10
    assert {p[0] for p in perms} == {0, 1, 2, 3}
    with pytest.raises(ShapeError, match="n >= 0"):
        Tensor.randperm(-1, device=xgrad_device)


# ---- sampling ----
def test_multinomial_with_replacement_follows_weights(xgrad_device: str) -> None:
    Tensor.manual_seed(41)
    n = samples(xgrad_device)
    w = np.array([1.0, 0.0, 2.0, 5.0], dtype=np.float32)
    v = Tensor(w, device=xgrad_device).multinomial(n, replacement=True).numpy()
    assert v.shape == (n,) and v.dtype == np.int32
    counts = np.bincount(v, minlength=4)
    assert counts[1] == 0
    expected = w / w.sum() * n
    chi2 = sum((counts[i] - expected[i]) ** 2 / expected[i] for i in (0, 2, 3))
    assert chi2 < 25, counts  # 2 degrees of freedom


def test_multinomial_without_replacement_draws_distinct(xgrad_device: str) -> None:
    Tensor.manual_seed(42)
    w = Tensor([[1.0, 0.0, 3.0, 4.0, 2.0], [0.0, 0.0, 1.0, 0.0, 1.0]], device=xgrad_device)
    rows = w.multinomial(2).tolist()
    assert len(rows) == 2 and all(len(set(r)) == 2 for r in rows)
    assert 1 not in rows[0] and sorted(rows[1]) == [2, 4]
    assert Tensor([0.0, 1.0, 0.0], device=xgrad_device).multinomial().tolist() == [1]


def test_multinomial_raises_for_bad_arguments(xgrad_device: str) -> None:
    with pytest.raises(ShapeError, match=r"\(2, 2, 2\)"):
        Tensor.ones(2, 2, 2, device=xgrad_device).multinomial()
    with pytest.raises(ShapeError, match="without replacement"):
        Tensor.ones(3, device=xgrad_device).multinomial(4)
    with pytest.raises(XgradError, match="num_samples"):
        Tensor.ones(3, device=xgrad_device).multinomial(0)


# ---- dropout and gradients ----
def test_dropout_is_identity_outside_training(xgrad_device: str) -> None:
    x = Tensor([1.0, 2.0, 3.0], device=xgrad_device)
    assert x.dropout(0.5) is x
    with Context(TRAINING=1):
        assert x.dropout(0.0) is x
        assert x.dropout(1.0).tolist() == [0.0, 0.0, 0.0]
        with pytest.raises(XgradError, match=r"\[0, 1\]"):
            x.dropout(1.5)


@pytest.mark.parametrize("shape,p", [((), 0.5), ((0, 3), 0.5), ((4, 32), 0.25)])
def test_dropout_matches_torch_with_the_same_mask(xgrad_device: str, shape: tuple[int, ...], p: float) -> None:
    Tensor.manual_seed(51)
    a = np.random.default_rng(0).uniform(0.5, 2.0, size=shape).astype(np.float32)
    x = Tensor(a, device=xgrad_device, requires_grad=True)  # a 0-d input needs a buffer of its own for gradients
    with Context(TRAINING=1):
        out = x.dropout(p)
    upstream = np.random.default_rng(1).uniform(-1, 1, size=shape).astype(np.float32)
    (g,) = out.gradient(x, gradient=Tensor(upstream, device=xgrad_device))  # before reading out (that realizes it)
    out.realize(g)
    got = out.numpy()
    mask = got != 0
    t = torch.tensor(a, requires_grad=True)
    want = t * torch.tensor(mask) / (1 - p)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-6)
    (wg,) = torch.autograd.grad(want, [t], torch.tensor(upstream))
    np.testing.assert_allclose(g.numpy(), wg.numpy(), rtol=1e-6)
    if a.size >= 64:
        assert abs(mask.mean() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / a.size)


def test_dropout_keeps_half_dtype(xgrad_device: str) -> None:
    skip_unsupported(xgrad_device, dtypes.float16)
    x = Tensor.ones(8, device=xgrad_device, dtype=dtypes.float16)
    with Context(TRAINING=1):
        out = x.dropout(0.5)
    assert out.dtype == dtypes.float16 and set(out.tolist()) <= {0.0, 2.0}


def test_random_factor_is_a_constant_for_gradients(xgrad_device: str) -> None:
    Tensor.manual_seed(61)
    a = np.array([[1.0, -2.0, 0.5], [3.0, 0.0, -1.0]], dtype=np.float32)
    x = Tensor(a, device=xgrad_device)
    r = x.rand_like()
    n = Tensor.randn(2, 3, device=xgrad_device)
    out = (x * r + x * x * n).sum()
    (g,) = out.gradient(x)
    x.is_param_()
    out.backward()  # before reading out (that realizes it)
    assert x.grad is not None
    rv, nv = r.numpy(), n.numpy()
    t = torch.tensor(a, requires_grad=True)
    want = (t * torch.tensor(rv) + t * t * torch.tensor(nv)).sum()
    (wg,) = torch.autograd.grad(want, [t])
    assert out.item() == pytest.approx(want.item(), rel=1e-5)
    np.testing.assert_allclose(g.numpy(), wg.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), wg.numpy(), rtol=1e-5, atol=1e-6)


def test_rand_has_no_gradient_path(xgrad_device: str) -> None:
    r = Tensor.rand(3, device=xgrad_device)
    assert r.uop.src[0].op is Ops.DETACH  # the random graph (uint32 words) is cut off from autograd
    (g,) = (r * 2).sum().gradient(r)
    assert g.tolist() == [2.0, 2.0, 2.0]
