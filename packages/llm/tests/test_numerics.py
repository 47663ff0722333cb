"""llama.cpp's CPU numerics (`xgrad_llm.numerics`) against numpy oracles of ggml's rules, written from its source and
checked once against its compiled library (llama-cpp-python 0.3.36's libggml-cpu.so: `from_float` of Q8_0 and Q8_K
on 300 random rows, ties and zero blocks included, and its 65,536-entry GELU table): the activation quantisers, the
float16/bfloat16 roundings, the GELU table, a product with packed K-quant and Q8_0 weights, and a tiny llama run
with `numerics="llama.cpp"` against a numpy forward pass that rounds where llama.cpp rounds."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import numpy as np
import pytest

from xgrad import Tensor
from xgrad.dtype import dtypes
from xgrad_llm.model import ModelError, Transformer
from xgrad_llm.numerics import activations, gelu_f16, q8_0_values, q8_k_values, round_bf16, round_f16
from xgrad_llm.packed import PackedMatrix
from xgrad_llm.quants import GGMLType

F32 = np.float32


def ref_q8_0(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_0 (x86 AVX path) then dequantised: scale float16(amax / 127), quants
    rint(x * (127 / amax)) (halves to even), both products and quotients rounded to float32."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(1, keepdims=True)
    d = (amax / F32(127)).astype(np.float16).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    return (np.rint((b * inv).astype(F32)) * d).reshape(x.shape)


def ref_q8_k(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_K_ref then dequantised: iscale = -127 / (the value of largest magnitude, the first
    one), quants min(127, nearest_int(iscale * x)) (halves to even), block scale 1 / iscale."""
    out = np.empty_like(x).reshape(-1, 256)
    for i, b in enumerate(x.reshape(-1, 256)):
        j = int(np.argmax(np.abs(b)))  # the first of the largest magnitude
        if b[j] == 0:
            out[i] = 0
            continue
        iscale = F32(-127) / b[j]
        q = np.minimum(np.rint((iscale * b).astype(F32)), 127)
        out[i] = q * (F32(1) / iscale)
    return out.reshape(x.shape)


def _rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows of 2048 activations: gaussian over a wide range of scales, some on a grid of quarters (many halfway
    products), some with zero blocks, tiny ones (the float16 scale underflows) and small integers (exact ties)."""
    rows = []
    for i in range(n):
        x = rng.standard_normal(2048).astype(F32) * F32(10 ** rng.uniform(-3, 3))
        kind = i % 5
        if kind == 1:
            x = (np.round(x * 4) / 4).astype(F32)
        if kind == 2:
            x[::37] = 0
            x[:256] = 0
        if kind == 3:
            x = x * F32(1e-7)
        if kind == 4:
            x = rng.integers(-3, 4, 2048).astype(F32)
        rows.append(x)
    return np.stack(rows)


def test_q8_0_activations_are_ggmls() -> None:
    x = _rows(np.random.default_rng(0), 20)
    assert np.array_equal(q8_0_values(Tensor(x)).numpy(), ref_q8_0(x))


def test_q8_k_activations_are_ggmls() -> None:
    x = _rows(np.random.default_rng(1), 20)
    x[0, 7] = -np.abs(x[0]).max()  # the largest magnitude twice, with both signs
    x[0, 9] = -x[0, 7]
    assert np.array_equal(q8_k_values(Tensor(x)).numpy(), ref_q8_k(x))


def test_quantised_input_of_a_computed_tensor_rounds_the_stored_product() -> None:
    """x * id is rounded to float32 before it is rounded to an integer, even where the CPU compiler would contract a
    product and a subtraction into an FMA."""
    x = _rows(np.random.default_rng(2), 10)
    y = (x * F32(1.7)).astype(F32)
    assert np.array_equal(q8_k_values(Tensor(x) * 1.7).numpy(), ref_q8_k(y))
    assert np.array_equal(q8_0_values(Tensor(x) * 1.7).numpy(), ref_q8_0(y))


def test_activation_type_follows_the_weight_type() -> None:
    x = _rows(np.random.default_rng(3), 2)
    for t in (GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q4_1, GGMLType.IQ4_NL, GGMLType.MXFP4):
        assert np.array_equal(activations(Tensor(x), t).numpy(), ref_q8_0(x)), t.name
    for t in (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_XS):
        assert np.array_equal(activations(Tensor(x), t).numpy(), ref_q8_k(x)), t.name
    assert np.array_equal(activations(Tensor(x), GGMLType.F16).numpy(), x.astype(np.float16).astype(F32))
    assert np.array_equal(activations(Tensor(x), GGMLType.F32).numpy(), x)


def test_f16_and_bf16_rounding() -> None:
    x = np.random.default_rng(4).standard_normal(10000).astype(F32) * F32(100)
    x[:4] = [1 + 2**-11, 1 + 3 * 2**-11, 70000.0, 1e-9]  # halfway cases, overflow, underflow
    with np.errstate(over="ignore"):
        ref16 = x.astype(np.float16).astype(F32)
    assert np.array_equal(round_f16(Tensor(x)).numpy(), ref16)
    u = x.view(np.uint32)
    ref = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).view(F32)  # round to nearest even on the top 16 bits
    assert np.array_equal(round_bf16(Tensor(x)).numpy(), ref)


def test_gelu_reads_the_float16_table() -> None:
    """Every float16 input in (-10, 10): float16 of gelu's tanh form evaluated in float32 as ggml writes it. ggml's
    table (built with C's tanhf) equals xgrad's on all 37,376 of these inputs (checked against libggml-cpu.so); the
    oracle's numpy tanh differs from tanhf in the last bits, which 1 + tanh(...) magnifies where it nearly cancels
    (x < -1), so there the oracle is held to 1.3e-4."""
    h = np.arange(65536, dtype=np.uint16).view(np.float16).astype(F32)
    h = h[np.isfinite(h) & (np.abs(h) < 10)]
    inner = (F32(0.7978845608028654) * h * (F32(1) + F32(0.044715) * h * h)).astype(F32)
    ref = (F32(0.5) * h * (F32(1) + np.tanh(inner))).astype(np.float16).astype(F32)
    out = gelu_f16(Tensor(h)).numpy()
    assert np.all(out.astype(np.float16).astype(F32) == out)  # float16 values
    assert np.array_equal(out[h >= -1], ref[h >= -1])
    assert np.abs(out - ref).max() <= 1.3e-4 and (out == ref).mean() > 0.99
    edges = gelu_f16(Tensor(np.array([-10.0, -12.0, 10.0, 12.5, 9.9999], F32))).numpy()
    assert edges.tolist()[:4] == [0.0, 0.0, 10.0, 12.5] and edges[4] == 10.0  # 9.9999 looks up float16 10.0


def _random_blocks(rng: np.random.Generator, type_id: GGMLType, rows: int, cols: int) -> np.ndarray:
    """Random valid GGUF blocks of a K-quant or Q8_0 matrix: random bytes, with the float16 scale fields set to
    small finite values."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(type_id))]
    b = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    scales = {GGMLType.Q4_K: (0, 2), GGMLType.Q6_K: (size - 2,), GGMLType.Q8_0: (0,)}[type_id]
    for at in scales:
        b[:, at : at + 2] = (
            (rng.uniform(0.001, 0.01, (len(b), 1)) * rng.choice([-1, 1], (len(b), 1))).astype(np.float16).view(np.uint8)
        )
    return b.reshape(-1)


@pytest.mark.parametrize("type_id", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0], ids=lambda t: t.name)
def test_quantised_product_matches_integer_block_sums(type_id: GGMLType) -> None:
    """x @ W.T with llama.cpp's activations and packed weights equals the numpy oracle of llama.cpp's sum: per block,
    the integer dot product of the weight's and the activation's quants times the two scales (here as the float64
    product of gguf's dequantised weights with the dequantised activations: the same real number)."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(5)
    n, k = 48, 512
    raw = _random_blocks(rng, type_id, n, k)
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(type_id))).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((3, k)).astype(F32)
    xq = (ref_q8_k if type_id != GGMLType.Q8_0 else ref_q8_0)(x).astype(np.float64)
    m = PackedMatrix(Tensor(raw), type_id, (n, k))
    out = (activations(Tensor(x), type_id) @ m.t()).numpy()
    ref = xq @ w.T
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6 * np.abs(ref).max())
    plain = (Tensor(x) @ m.t()).numpy()  # without the activation quantisation: off by its rounding
    assert np.abs(plain - ref).max() > 100 * np.abs(out - ref).max()


def test_unknown_numerics_is_refused(tmp_path: pathlib.Path) -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    pytest.importorskip("gguf")
    from serve_helpers import write_model

    from xgrad_llm.gguf import open_gguf

    _, path = write_model(tmp_path)
    with pytest.raises(ModelError, match="numerics='llama'.*xgrad, llama.cpp"):
        Transformer(open_gguf(path), cache_len=8, numerics="llama")


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def _llama_numerics_logits(w: dict[str, np.ndarray], spec: object, ids: list[int]) -> np.ndarray:
    """A numpy forward pass (float64) of a tiny llama whose matrices are Q8_0, rounding where llama.cpp does: each
    matrix input quantised to Q8_0 blocks (`ref_q8_0`), keys, values and queries to float16 after RoPE, attention
    weights to float16. Logits (T, vocab)."""
    s: Any = spec
    hd, t = s.head_dim, len(ids)

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g

    def mm(x: np.ndarray, m: np.ndarray) -> np.ndarray:
        return ref_q8_0(x.astype(F32)).astype(np.float64) @ m.T

    def f16(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float16).astype(np.float64)

    def rope(x: np.ndarray) -> np.ndarray:
        half = hd // 2
        ang = np.arange(t)[:, None] * (1.0 / s.rope_theta ** (np.arange(0, hd, 2) / hd))[None, :]
        cos, sin = np.concatenate([np.cos(ang)] * 2, -1)[:, None], np.concatenate([np.sin(ang)] * 2, -1)[:, None]
        return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    h = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(s.n_layers):
        p = f"model.layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        q = f16(rope(mm(x, w[p + "self_attn.q_proj.weight"]).reshape(t, s.n_heads, hd)))
        k = f16(rope(mm(x, w[p + "self_attn.k_proj.weight"]).reshape(t, s.n_kv_heads, hd)))
        v = f16(mm(x, w[p + "self_attn.v_proj.weight"]).reshape(t, s.n_kv_heads, hd))
        rep = s.n_heads // s.n_kv_heads
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        att = np.exp(scores - scores.max(-1, keepdims=True))
        att = f16(att / att.sum(-1, keepdims=True))
        h = h + mm(np.einsum("hts,shd->thd", att, v).reshape(t, -1), w[p + "self_attn.o_proj.weight"])
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gated = _silu(mm(x, w[p + "mlp.gate_proj.weight"])) * mm(x, w[p + "mlp.up_proj.weight"])
        h = h + mm(gated, w[p + "mlp.down_proj.weight"])
    return mm(rms(h, w["model.norm.weight"]), w["model.embed_tokens.weight"])


def _q8_llama(tmp_path: pathlib.Path, seed: int) -> tuple[dict[str, Any], pathlib.Path, Any]:
    """A tiny llama (serve_helpers' SPEC) with seeded weights, written as a Q8_0 GGUF: (its float32 state as torch
    tensors, the file, SPEC)."""
    torch = pytest.importorskip("torch")
    gguf = pytest.importorskip("gguf")
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from serve_helpers import SPEC, NumpyLlama
    from tiny_models import write_gguf

    state = {k: torch.from_numpy(v.copy()) for k, v in NumpyLlama(SPEC, seed=seed).w.items()}
    holder = type("M", (), {"state_dict": lambda self: state})()
    return state, write_gguf(SPEC, holder, tmp_path / "q8.gguf", gguf.GGMLQuantizationType.Q8_0), SPEC


def test_tiny_llama_with_llama_cpp_numerics_matches_a_numpy_forward(tmp_path: pathlib.Path) -> None:
    """A 2-layer Q8_0 llama run with numerics="llama.cpp" (llama.cpp's sums for this machine's vector width: prefill,
    then decode steps through the float16 KV cache) against `_llama_numerics_logits`, and float32 numerics against
    it. (The oracle computes in float64: a value
    within float32 error of a rounding boundary could round the other way on one side; none does here.)"""
    from xgrad_llm.generate import LLM

    state, path, spec = _q8_llama(tmp_path, seed=3)
    w = {k: v.numpy().astype(np.float64) for k, v in state.items()}  # gguf's dequantisation of the file's blocks
    ids = [2, 5, 100, 270, 271, 30, 260, 262, 263, 9, 40, 200]
    want = _llama_numerics_logits(w, spec, ids)
    llm = LLM.load(path, max_context=32, chunk=4, numerics="llama.cpp")
    assert llm.model.cache_v[0].dtype.name == "float16"
    got = np.stack([llm.runner.feed(ids[: n + 1]) for n in range(3, len(ids))])  # a prefill, then decodes
    fp32 = Transformer(llm.file, cache_len=32).logits_all(ids).numpy()[0]
    err, err32 = np.abs(got - want[3:]).max(), np.abs(fp32 - want).max()
    assert err < 1e-4 and err32 > 100 * err  # measured: 1.5e-6 and 0.19
    # float32 copies of the weights: the same sums (llama.cpp's, from the file's blocks), so no fused q/k/v
    dense = Transformer(llm.file, cache_len=32, quantized=False, numerics="llama.cpp")
    assert "attn_qkv" not in dense.layers[0] and "attn_q" in dense.layers[0].ints
    packed = Transformer(llm.file, cache_len=32, numerics="llama.cpp")
    np.testing.assert_array_equal(dense.logits_all(ids).numpy(), packed.logits_all(ids).numpy())
    np.testing.assert_allclose(dense.logits_all(ids).numpy()[0], want, atol=1e-4, rtol=0)


def test_numerics_name_a_vector_width() -> None:
    """ "llama.cpp-avx2" sums in 8 float32 lanes, "llama.cpp-avx512" in 16, "llama.cpp" as llama.cpp built for this
    machine would (AVX-512 where the CPU has it)."""
    from xgrad_llm.numerics import NUMERICS, host_lanes, lanes_of

    assert set(NUMERICS) == {"xgrad", "llama.cpp", "llama.cpp-avx2", "llama.cpp-avx512"}
    assert (lanes_of("xgrad"), lanes_of("llama.cpp-avx2"), lanes_of("llama.cpp-avx512")) == (0, 8, 16)
    try:
        avx512 = "avx512f" in pathlib.Path("/proc/cpuinfo").read_text().split()
    except OSError:
        avx512 = False
    assert lanes_of("llama.cpp") == host_lanes() == (16 if avx512 else 8)


def _buffer_bytes(tensors: list[Tensor]) -> int:
    """Bytes of the distinct realized buffers that `tensors` (lazy views and ops over them) read."""
    seen: dict[Any, int] = {}
    for t in tensors:
        for u in t.uop.toposort:
            if u.op.name == "BUFFER":
                seen[u] = u.arg[1] * u.dtype.itemsize
    return sum(seen.values())


def _weights(model: Transformer) -> list[Tensor]:
    """Every weight tensor the model holds: W.T views, norms, and the fields of llama.cpp numerics' `BlockInts`."""
    out = [model.tok_embd_t, model.output, model.output_norm]
    for layer in model.layers:
        out.extend(layer.values())
    for ints in model.block_ints.values():
        out.extend(x for x in (ints.q, ints.d, ints.sc, ints.m, ints.dmin) if x is not None)
    return out


@pytest.mark.parametrize("quantized", [True, False])
def test_llama_cpp_numerics_hold_each_exact_matrix_once(quantized: bool, tmp_path: pathlib.Path) -> None:
    """Under llama.cpp numerics a Q8_0 matrix (a type `ggml_x86` multiplies exactly) is held once, as the file's
    blocks: the buffers behind every weight the model holds (its W.T views, its `BlockInts`) take exactly the file's
    bytes (they took those plus a packed, or float32, copy before), none is packed, and the token embeddings (W.T
    views over those blocks) are gguf's dequantisation of them, bit for bit."""
    from xgrad_llm.gguf import open_gguf

    state, path, spec = _q8_llama(tmp_path, seed=4)
    f = open_gguf(path)
    matrices = [n for n, info in f.tensors.items() if info.type == GGMLType.Q8_0]
    assert len(matrices) == 1 + 7 * spec.n_layers  # tied embedding, q k v o gate up down
    model = Transformer(f, cache_len=16, quantized=quantized, numerics="llama.cpp")
    assert set(model.block_ints) == set(matrices)
    assert not model.packed and not any(layer.packed for layer in model.layers)
    assert model.weight_nbytes == sum(f.tensors[n].nbytes for n in matrices)
    assert _buffer_bytes(_weights(model)) == sum(info.nbytes for info in f.tensors.values())  # + F32 norms
    ids = [3, 7, 100, 270]
    want = state["model.embed_tokens.weight"].numpy()[ids]  # gguf's dequantisation of the file's blocks
    np.testing.assert_array_equal(model.embed(ids).numpy()[0], want)


def test_llama_cpp_numerics_keep_moe_router_and_shared_expert_packed(tmp_path: pathlib.Path) -> None:
    """qwen2moe's shared expert (Q8_0) is multiplied through its W.T in `moe_ffn`, not llama.cpp's sums: under
    llama.cpp numerics it stays packed and gets no `BlockInts` (which would hold its bytes a second time)."""
    pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import tiny_models as tm

    from xgrad_llm.gguf import open_gguf

    _, path = tm.make(tm.Spec("qwen2moe", n_layers=1), tmp_path, gguf.GGMLQuantizationType.Q8_0)
    model = Transformer(open_gguf(path), cache_len=16, numerics="llama.cpp")
    shared = {f"blk.0.{s}.weight" for s in ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")}
    assert shared <= set(model.packed) and not shared & set(model.block_ints)
    assert "attn_q" in model.layers[0].ints and "attn_q" not in model.layers[0].packed
    assert np.isfinite(model.logits_all([2, 5, 100]).numpy()).all()


def test_embeddings_under_llama_cpp_numerics_are_hidden_states(tmp_path: pathlib.Path) -> None:
    """/v1/embeddings' model swaps the output head for the identity; under llama.cpp numerics the head's `BlockInts`
    were still multiplied, so the "embedding" was the vocabulary's logits. Now: a (dim,) vector within llama.cpp's
    rounding of the float32 numerics' one."""
    import threading

    from xgrad_llm.generate import LLM
    from xgrad_llm.server.embed import Embedder

    _, path, spec = _q8_llama(tmp_path, seed=5)
    ids = [2, 5, 100, 270, 9]
    llama, plain = (
        Embedder(LLM.load(path, max_context=32, chunk=4, numerics=n), threading.Lock()) for n in ("llama.cpp", "xgrad")
    )
    got, want = llama.embed(ids), plain.embed(ids)
    assert got.shape == want.shape == (spec.dim,)
    np.testing.assert_allclose(got, want, atol=0.02)  # measured: 0.003 (of a unit vector)
    # the embedding model's own KV cache is llama.cpp's float16, like the model it copies (it was float32)
    assert llama._model.cache_k[0].dtype == llama.llm.model.cache_k[0].dtype == dtypes.float16
