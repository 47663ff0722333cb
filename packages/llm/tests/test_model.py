"""The Transformer against Hugging Face `transformers` (torch, CPU, float32) on tiny random-weight models written as
GGUF files the way llama.cpp's converter writes them (dense and mixture-of-experts, RoPE scaled linearly and by YaRN);
the KV cache against a full recompute."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import tiny_models as tm  # noqa: E402

from xgrad import Variable  # noqa: E402
from xgrad_llm.gguf import open_gguf  # noqa: E402
from xgrad_llm.model import ModelConfig, ModelError, Transformer  # noqa: E402

IDS = [2, 5, 100, 270, 271, 30, 260, 262, 263, 9, 40, 200]

SPECS = {
    "llama": tm.Spec("llama"),
    "llama-linear-rope-mha": tm.Spec("llama", n_kv_heads=4, rope_linear=2.0, rope_theta=500000.0),
    "qwen2": tm.Spec("qwen2", tied=True),  # q/k/v biases
    "qwen3": tm.Spec("qwen3", tied=True, head_dim=32),  # QK-norm; heads * head_dim != dim
    # five sliding-window layers then a global one (the default pattern), window shorter than the prompt
    "gemma3": tm.Spec("gemma3", n_layers=6, n_kv_heads=1, head_dim=32, tied=True, sliding_window=4),
    # logit soft-capping (transformers' Gemma 3 does not apply attn_logit_softcapping, nor does llama.cpp's)
    "gemma3-softcap": tm.Spec("gemma3", n_kv_heads=2, head_dim=16, tied=True, sliding_window=3, final_softcap=3.0),
    # YaRN: the ramp between extrapolated and interpolated pairs falls inside head_dim, attention sharpened
    "qwen3-yarn": tm.Spec("qwen3", tied=True, rope_yarn=4.0, rope_orig_ctx=64),
    "llama-yarn": tm.Spec("llama", rope_yarn=8.0, rope_orig_ctx=32, rope_theta=500000.0),  # pair-wise RoPE
    # MoE: 8 experts, top 2; qwen3moe renormalises the top-k probabilities, olmoe does not (and norms q/k over all
    # heads, and clips q/k/v here), qwen2moe adds a sigmoid-gated shared expert
    "qwen3moe": tm.Spec("qwen3moe", tied=True, head_dim=32),
    # transformers' norm_topk_prob=False, said in the file by llama.cpp's expert_weights_norm key
    "qwen3moe-unnormed": tm.Spec(
        "qwen3moe", tied=True, head_dim=32, norm_topk=False, extra={"qwen3moe.expert_weights_norm": False}
    ),
    "olmoe": tm.Spec("olmoe", clip_qkv=1.0),
    "qwen2moe": tm.Spec("qwen2moe", n_layers=1, n_experts=4, n_experts_used=3),
}


@pytest.fixture(scope="module", params=list(SPECS))
def model(request: Any, tmp_path_factory: Any) -> tuple[Any, pathlib.Path]:
    return tm.make(SPECS[request.param], tmp_path_factory.mktemp(request.param))


# the cache test skips the variants whose decode step has nothing new (test time: each compiles its own kernels)
CACHE_SPECS = [
    name for name in SPECS if name not in ("llama-yarn", "qwen3-yarn", "olmoe", "qwen2moe", "qwen3moe-unnormed")
]


@pytest.fixture(scope="module", params=CACHE_SPECS)
def cache_model(request: Any, tmp_path_factory: Any) -> tuple[Any, pathlib.Path]:
    return tm.make(SPECS[request.param], tmp_path_factory.mktemp(request.param))


def test_logits_match_transformers_f32(model: tuple[Any, pathlib.Path]) -> None:
    hf, path = model
    ref = tm.hf_logits(hf, IDS)
    out = Transformer(open_gguf(path), cache_len=32).logits_all(IDS).numpy()[0]
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=0)


def test_kv_cache_decode_equals_full_recompute(cache_model: tuple[Any, pathlib.Path]) -> None:
    _, path = cache_model
    f = open_gguf(path)
    full = Transformer(f, cache_len=32).logits_all(IDS).numpy()[0]
    m = Transformer(f, cache_len=32)
    n = 5
    prefill = m.forward(m.embed(IDS[:n]), 0, n - 1).numpy()
    np.testing.assert_allclose(prefill[0], full[n - 1], atol=1e-4, rtol=0)
    pos = Variable("start_pos", 0, 31)
    for p in range(n, len(IDS)):  # one token at a time, at a symbolic position
        logits = m.forward(m.embed([IDS[p]]), pos.bind(p), 0).numpy()
        np.testing.assert_allclose(logits[0], full[p], atol=1e-4, rtol=0)


def test_output_head_only_on_last_position(tmp_path: pathlib.Path) -> None:
    spec = tm.Spec("llama", n_layers=1)
    hf, p = tm.make(spec, tmp_path)
    m = Transformer(open_gguf(p), cache_len=16)
    out = m.forward(m.embed(IDS[:4]), 0, 3)
    assert out.shape == (1, spec.vocab_size)
    np.testing.assert_allclose(out.numpy()[0], tm.hf_logits(hf, IDS[:4])[3], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("arch", "qtype"),
    [(a, q) for a in ("llama", "qwen3") for q in ("Q8_0", "Q4_0")] + [("qwen3moe", "Q8_0")],
)
def test_quantized_weights_match_transformers(arch: str, qtype: str, tmp_path: pathlib.Path) -> None:
    """Weights quantised by gguf's reference quantiser, the reference model given gguf's dequantisation of them:
    the same logits (to 1e-4) whether xgrad dequantises at load (float32 in memory) or inside the matmuls (packed,
    for MoE the experts of a 3-d tensor packed as one matrix). (gguf's quantiser has no K-quants; the real Gemma
    file's test covers Q4_K, Q5_0 and Q6_K.) The MoE router stays F32, as llama.cpp's quantizer keeps it."""
    spec = SPECS[arch]
    hf, path = tm.make(spec, tmp_path, getattr(gguf.GGMLQuantizationType, qtype))
    f = open_gguf(path)
    ref = tm.hf_logits(hf, IDS)
    dense = Transformer(f, cache_len=16).logits_all(IDS).numpy()[0]
    np.testing.assert_allclose(dense, ref, atol=1e-4, rtol=0)
    packed = Transformer(f, cache_len=16, quantized=True).logits_all(IDS).numpy()[0]
    np.testing.assert_allclose(packed, ref, atol=1e-4, rtol=0)


def test_gemma3_config_from_metadata(tmp_path: pathlib.Path) -> None:
    _, path = tm.make(SPECS["gemma3"], tmp_path)
    cfg = ModelConfig.from_metadata(open_gguf(path).metadata, len(tm.VOCAB))
    assert cfg.sliding_layers == (True, True, True, True, True, False)
    assert (cfg.rope_theta, cfg.rope_local_theta) == (10000.0, 10000.0)
    assert cfg.embed_scale == pytest.approx(8.0)
    assert cfg.attn_scale == pytest.approx(32**-0.5)


def bare_model_file(path: pathlib.Path, arch: str) -> pathlib.Path:
    """A GGUF of `arch` with one block and an embedding, and no other metadata."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", 1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_moe_config_from_metadata(tmp_path: pathlib.Path) -> None:
    _, path = tm.make(SPECS["qwen3moe"], tmp_path)
    cfg = ModelConfig.from_metadata(open_gguf(path).metadata, len(tm.VOCAB))
    assert (cfg.n_experts, cfg.n_experts_used, cfg.expert_norm) == (8, 2, True)
    olmoe = ModelConfig.from_metadata({**_metadata(tm.Spec("olmoe", clip_qkv=1.0), tmp_path)}, len(tm.VOCAB))
    assert (olmoe.expert_norm, olmoe.clamp_kqv) == (False, 1.0)


def _metadata(spec: tm.Spec, folder: pathlib.Path) -> dict[str, Any]:
    _, path = tm.make(spec, folder)
    return dict(open_gguf(path).metadata)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"qwen3moe.expert_used_count": 9}, "expert_used_count is 9"),
        ({"qwen3moe.rope.scaling.type": "longrope"}, "'longrope' is not supported"),
        ({"qwen3moe.rope.scaling.type": "yarn", "qwen3moe.rope.scaling.factor": 0.0}, "factor must be > 0"),
        (
            {
                "qwen3moe.rope.scaling.type": "yarn",
                "qwen3moe.rope.scaling.factor": 4.0,
                "qwen3moe.rope.scaling.yarn_log_multiplier": 0.1,
            },
            "yarn_log_multiplier",
        ),
    ],
)
def test_bad_moe_and_rope_metadata_is_named(change: dict[str, Any], message: str, tmp_path: pathlib.Path) -> None:
    md = _metadata(tm.Spec("qwen3moe", n_layers=1), tmp_path)
    with pytest.raises(ModelError, match=message):
        ModelConfig.from_metadata({**md, **change}, len(tm.VOCAB))


@pytest.mark.parametrize(
    ("count", "message"), [(4, "holds 8 experts; the metadata says 4"), (None, "routes to experts but the metadata")]
)
def test_expert_tensors_must_match_the_metadata(count: int | None, message: str, tmp_path: pathlib.Path) -> None:
    _, path = tm.make(tm.Spec("qwen3moe", n_layers=1), tmp_path)
    f = open_gguf(path)
    if count is None:
        del f.metadata["qwen3moe.expert_count"]
        del f.metadata["qwen3moe.expert_used_count"]
    else:
        f.metadata["qwen3moe.expert_count"] = count
    with pytest.raises(ModelError, match=message):
        Transformer(f, cache_len=8)


def test_unsupported_architecture_says_which(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ModelError, match="'mamba' is not supported.*gemma3"):
        Transformer(open_gguf(bare_model_file(tmp_path / "m.gguf", "mamba")), cache_len=8)


def test_missing_metadata_key_is_named(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ModelError, match="llama.embedding_length"):
        Transformer(open_gguf(bare_model_file(tmp_path / "m.gguf", "llama")), cache_len=8)
