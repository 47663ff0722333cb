"""Tiny random-weight models for the llm tests: a Hugging Face `transformers` model (the reference) and the same
weights written as a GGUF file the way llama.cpp's converter lays them out (tensor names, llama's q/k permutation
for its pair-wise RoPE, gemma's norms stored as 1 + w), plus a small SentencePiece-style vocabulary so the files also
load with a tokenizer.

Imported by the llm test modules (`sys.path` gets this folder); not a test module itself.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# vocabulary: 4 specials, the 256 byte tokens, then whole pieces (SentencePiece's "▁" marks a leading space)
PIECES = ["▁the", "▁capital", "▁of", "▁France", "▁is", "▁Paris", "▁a", "▁city", ".", "▁hello", "▁world", "!"]
VOCAB = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + PIECES


@dataclass
class Spec:
    """One tiny model: its architecture and the knobs a test varies."""

    arch: str  # llama, qwen2, qwen3, gemma3; MoE: qwen3moe, olmoe, qwen2moe
    n_layers: int = 2
    dim: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    ffn_dim: int = 128
    tied: bool = False
    rope_theta: float = 10000.0
    rope_linear: float = 0.0  # linear RoPE scaling factor (0: none)
    rope_yarn: float = 0.0  # YaRN scaling factor (0: none)
    rope_orig_ctx: int = 64  # YaRN: the pretrained context
    n_experts: int = 8  # MoE archs: experts per layer
    n_experts_used: int = 2  # MoE archs: top-k
    expert_ffn_dim: int = 32  # MoE archs: each expert's FFN width
    shared_ffn_dim: int = 64  # qwen2moe: the shared expert's FFN width
    norm_topk: bool = True  # qwen3moe: transformers' norm_topk_prob (olmoe and qwen2moe keep their default, False)
    clip_qkv: float = 0.0  # olmoe: clip q, k, v to [-clip, clip] (0: none)
    sliding_window: int = 0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return len(VOCAB)


def hf_model(spec: Spec) -> Any:
    """The transformers model of `spec` with random weights (seeded), float32, eval mode, eager attention."""
    import torch
    import transformers as tf

    common: dict[str, Any] = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.dim,
        intermediate_size=spec.ffn_dim,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=spec.tied,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if spec.rope_linear:
        rope = {"rope_type": "linear", "factor": spec.rope_linear, "rope_theta": spec.rope_theta}
    if spec.rope_yarn:
        rope = {
            "rope_type": "yarn",
            "factor": spec.rope_yarn,
            "original_max_position_embeddings": spec.rope_orig_ctx,
            "rope_theta": spec.rope_theta,
        }
    moe: dict[str, Any] = dict(
        num_experts=spec.n_experts, num_experts_per_tok=spec.n_experts_used, moe_intermediate_size=spec.expert_ffn_dim
    )
    if spec.arch == "llama":
        cfg: Any = tf.LlamaConfig(**common, rope_parameters=rope)
        cls: Any = tf.LlamaForCausalLM
    elif spec.arch == "qwen2":
        cfg = tf.Qwen2Config(**common, rope_parameters=rope)
        cls = tf.Qwen2ForCausalLM
    elif spec.arch == "qwen3":
        cfg = tf.Qwen3Config(**common, rope_parameters=rope)
        cls = tf.Qwen3ForCausalLM
    elif spec.arch == "qwen3moe":
        cfg = tf.Qwen3MoeConfig(**common, **moe, norm_topk_prob=spec.norm_topk, rope_parameters=rope)
        cls = tf.Qwen3MoeForCausalLM
    elif spec.arch == "qwen2moe":
        cfg = tf.Qwen2MoeConfig(
            **common, **moe, shared_expert_intermediate_size=spec.shared_ffn_dim, rope_parameters=rope
        )
        cls = tf.Qwen2MoeForCausalLM
    elif spec.arch == "olmoe":  # its "intermediate_size" is each expert's; q/k norms span all heads
        olmoe = {k: v for k, v in common.items() if k not in ("intermediate_size", "head_dim")}
        cfg = tf.OlmoeConfig(
            **olmoe,
            intermediate_size=spec.expert_ffn_dim,
            num_experts=spec.n_experts,
            num_experts_per_tok=spec.n_experts_used,
            clip_qkv=spec.clip_qkv or None,
            rope_parameters=rope,
        )
        cls = tf.OlmoeForCausalLM
    elif spec.arch == "gemma3":
        cfg = tf.Gemma3TextConfig(
            **common,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=spec.head_dim,
            sliding_window=spec.sliding_window,
            final_logit_softcapping=spec.final_softcap or None,
            attn_logit_softcapping=spec.attn_softcap or None,
            rope_parameters={
                "full_attention": rope,
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        )
        cls = tf.Gemma3ForCausalLM
    else:
        raise ValueError(spec.arch)
    cfg._attn_implementation = "eager"
    torch.manual_seed(spec.seed)
    model = cls(cfg).float().eval()
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # around the model's identity (gemma's is 1 + w around w = 0)
                centre = 0.0 if spec.arch == "gemma3" else 1.0
                p.copy_(centre + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(p.shape[-1]))
    return model


def _permute_for_pairs(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama's converter reorders each head's rows from (first half, second half) to interleaved pairs, so that
    rotating adjacent pairs (llama.cpp's RoPE) equals Hugging Face's rotate-half."""
    rows = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, rows // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.experts": "",  # gate_up_proj / down_proj: see EXPERT_NAMES
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def gguf_name(arch: str, hf: str) -> str | None:
    """The GGUF name of a Hugging Face parameter name (None: not written)."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    if parts[:2] != ["model", "layers"]:
        return None
    i, rest, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
    if rest == "post_attention_layernorm":  # gemma: a post-norm; llama/qwen: the FFN's pre-norm
        short = "post_attention_norm" if arch == "gemma3" else "ffn_norm"
    elif rest == "mlp.experts":  # transformers' (E, 2F, D) gate_up_proj is split into gate and up by the writer
        return f"blk.{i}.ffn_{'gate_up' if kind == 'gate_up_proj' else 'down'}_exps.weight"
    else:
        short = LAYER_NAMES[rest]
    return f"blk.{i}.{short}.{kind}"


def write_gguf(spec: Spec, model: Any, path: pathlib.Path, qtype: Any = None) -> pathlib.Path:
    """Write `model`'s weights and `spec`'s metadata as a GGUF file at `path`. `qtype` (a GGMLQuantizationType)
    quantises the 2-d weights with gguf's reference quantiser (norms and biases stay F32) and puts the dequantised
    values back into `model`, so that it stays the exact reference of the file."""
    import gguf

    arch = spec.arch
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.context_length", 256)
    w.add_uint32(f"{arch}.embedding_length", spec.dim)
    w.add_uint32(f"{arch}.block_count", spec.n_layers)
    w.add_uint32(f"{arch}.feed_forward_length", spec.ffn_dim)
    w.add_uint32(f"{arch}.attention.head_count", spec.n_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", spec.n_kv_heads)
    w.add_uint32(f"{arch}.attention.key_length", spec.head_dim)
    w.add_uint32(f"{arch}.attention.value_length", spec.head_dim)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{arch}.rope.freq_base", spec.rope_theta)
    if arch == "llama":
        w.add_uint32(f"{arch}.rope.dimension_count", spec.head_dim)
    if spec.rope_linear:
        w.add_string(f"{arch}.rope.scaling.type", "linear")
        w.add_float32(f"{arch}.rope.scaling.factor", spec.rope_linear)
    if spec.sliding_window:
        w.add_uint32(f"{arch}.attention.sliding_window", spec.sliding_window)
    if spec.attn_softcap:
        w.add_float32(f"{arch}.attn_logit_softcapping", spec.attn_softcap)
    if spec.final_softcap:
        w.add_float32(f"{arch}.final_logit_softcapping", spec.final_softcap)
    if spec.rope_yarn:
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", spec.rope_yarn)
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", spec.rope_orig_ctx)
    if arch in MOE_ARCHS:
        w.add_uint32(f"{arch}.expert_count", spec.n_experts)
        w.add_uint32(f"{arch}.expert_used_count", spec.n_experts_used)
        w.add_uint32(f"{arch}.expert_feed_forward_length", spec.expert_ffn_dim)
        if arch == "qwen2moe":
            w.add_uint32(f"{arch}.expert_shared_feed_forward_length", spec.shared_ffn_dim)
    if spec.clip_qkv:
        w.add_float32(f"{arch}.attention.clamp_kqv", spec.clip_qkv)
    for key, value in spec.extra.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    _add_vocab(w)
    for hf, p in model.state_dict().items():
        name = gguf_name(arch, hf)
        if name is None or (spec.tied and name == "output.weight"):
            continue
        x = p.detach().float().numpy().copy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            x = x + 1.0  # the converter stores gemma's (1 + w)
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            x = _permute_for_pairs(x, spec.n_heads if "attn_q" in name else spec.n_kv_heads)
        if name.endswith("ffn_gate_up_exps.weight"):  # (E, 2F, D): gate rows, then up rows
            f = x.shape[1] // 2
            parts = [(name.replace("gate_up", "gate"), x[:, :f]), (name.replace("gate_up", "up"), x[:, f:])]
        else:
            parts = [(name, x)]
        # llama.cpp's quantizer keeps routers F32 (ffn_gate_inp, ffn_gate_inp_shexp)
        quantize = qtype is not None and x.ndim >= 2 and "ffn_gate_inp" not in name
        back = []
        for part, y in parts:
            y = np.ascontiguousarray(y)
            if quantize:
                packed = gguf.quants.quantize(y, qtype)
                w.add_tensor(part, packed, raw_dtype=qtype)
                back.append(gguf.quants.dequantize(packed, qtype))
            else:
                w.add_tensor(part, y.astype(np.float32))
        if quantize:
            _set_dequantized(p, np.concatenate(back, axis=1) if len(back) > 1 else back[0], arch, name, spec)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


MOE_ARCHS = ("qwen3moe", "olmoe", "qwen2moe")


def _set_dequantized(p: Any, x: np.ndarray, arch: str, name: str, spec: Spec) -> None:
    """Give the reference model the weights the file really holds (quantised, then dequantised by gguf)."""
    import torch

    if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
        heads = spec.n_heads if "attn_q" in name else spec.n_kv_heads
        x = x.reshape(heads, x.shape[0] // heads // 2, 2, x.shape[1]).swapaxes(1, 2).reshape(x.shape)
    with torch.no_grad():
        p.copy_(torch.from_numpy(np.ascontiguousarray(x, np.float32)))


def _add_vocab(w: Any) -> None:
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", VOCAB)
    scores = [0.0] * 4 + [0.0] * 256 + [-float(i) for i in range(len(PIECES))]
    w.add_array("tokenizer.ggml.scores", scores)
    types = [3, 3, 3, 2] + [6] * 256 + [1] * len(PIECES)  # control, unknown, byte, normal
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_uint32("tokenizer.ggml.bos_token_id", 2)
    w.add_uint32("tokenizer.ggml.eos_token_id", 1)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 3)
    w.add_uint32("tokenizer.ggml.padding_token_id", 0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_bool("tokenizer.ggml.add_eos_token", False)


def make(spec: Spec, folder: pathlib.Path, qtype: Any = None) -> tuple[Any, pathlib.Path]:
    """(transformers model, GGUF path) of `spec` in `folder`."""
    model = hf_model(spec)
    suffix = "" if qtype is None else f"-{qtype.name}"
    return model, write_gguf(spec, model, folder / f"{spec.arch}{suffix}.gguf", qtype)


def hf_logits(model: Any, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    return np.asarray(out.logits[0].float().numpy())
