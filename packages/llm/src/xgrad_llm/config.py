"""A model's configuration from its GGUF metadata: the architecture traits the metadata does not say (`ARCHS`) and
`ModelConfig.from_metadata`, which reads the rest from the `{arch}.*` keys and refuses what this package cannot run
(`ModelError`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from xgrad.errors import XgradError


class ModelError(XgradError, ValueError):
    """A GGUF file holds a model this code cannot run: an unsupported architecture, a missing key or tensor."""


@dataclass(frozen=True)
class ArchTraits:
    """What an architecture does that its GGUF metadata does not say."""

    rope_style: str  # "norm": rotate adjacent pairs (llama's permuted q/k); "neox": rotate the two halves
    activation: str  # of the gate in the gated FFN: "silu" or "gelu_tanh"
    scale_embeddings: bool  # multiply the token embeddings by sqrt(dim) (gemma)
    swa_pattern: int = 0  # with a sliding window: every n-th layer is global, the others slide (0: all slide)
    local_rope_theta: float = 0.0  # RoPE base of the sliding-window layers when the file does not say (0: global's)
    moe_norm_topk: bool = False  # MoE: renormalise the top-k router probabilities to sum 1 (unless the file says)


ARCHS: dict[str, ArchTraits] = {
    "llama": ArchTraits("norm", "silu", False),
    "qwen2": ArchTraits("neox", "silu", False),
    "qwen3": ArchTraits("neox", "silu", False),
    "gemma3": ArchTraits("neox", "gelu_tanh", True, swa_pattern=6, local_rope_theta=10000.0),
    # transformers' norm_topk_prob: true in Qwen3-MoE's configs (llama.cpp hard-codes it), false for OLMoE/Qwen2-MoE
    "qwen3moe": ArchTraits("neox", "silu", False, moe_norm_topk=True),
    "olmoe": ArchTraits("neox", "silu", False),
    "qwen2moe": ArchTraits("neox", "silu", False),
}


@dataclass(frozen=True)
class ModelConfig:
    """The shape and arithmetic of one model, from its GGUF metadata."""

    arch: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # of queries and keys
    value_dim: int  # of values (per head)
    ffn_dim: int
    vocab_size: int
    norm_eps: float
    context_length: int  # what the model was trained for
    rope_dim: int  # leading dims of each head that RoPE rotates
    rope_theta: float
    rope_local_theta: float  # base of the sliding-window layers
    rope_scale: float  # linear scaling: global layers divide positions by this
    rope_style: str
    activation: str
    embed_scale: float
    attn_scale: float  # scores are q.k * attn_scale
    sliding_window: int  # 0: none
    sliding_layers: tuple[bool, ...]  # per layer: does it use the sliding window
    attn_softcap: float  # 0: none; else scores = cap * tanh(scores / cap)
    final_softcap: float  # 0: none; likewise for the logits
    n_experts: int = 0  # MoE: experts per MoE layer (0: a dense model)
    n_experts_used: int = 0  # MoE: experts each token is routed to (top-k)
    expert_norm: bool = False  # MoE: the top-k router probabilities are renormalised to sum 1
    clamp_kqv: float = 0.0  # 0: none; else q, k and v are clipped to [-clamp, clamp] (olmoe's clip_qkv)
    rope_scaling: str = "none"  # "none", "linear" (positions / rope_scale) or "yarn"
    rope_orig_context: int = 0  # yarn: the context the model was pretrained for
    yarn_ext_factor: float = 1.0  # yarn: weight of the extrapolated frequencies in the ramp (0: plain interpolation)
    yarn_attn_factor: float = 1.0  # yarn: extra factor on cos/sin, besides 1 + 0.1 ln(rope_scale)
    yarn_beta_fast: float = 32.0  # yarn: rotations below which a dimension is only extrapolated
    yarn_beta_slow: float = 1.0  # yarn: rotations above which a dimension is only interpolated

    @classmethod
    def from_metadata(cls, md: dict[str, Any], vocab_size: int) -> ModelConfig:
        """The config of the model described by GGUF metadata `md` whose embedding has `vocab_size` rows. Raises
        `ModelError` for an unsupported architecture or a missing key."""
        arch = md.get("general.architecture")
        if arch not in ARCHS:
            raise ModelError(f"architecture {arch!r} is not supported; xgrad_llm runs {', '.join(sorted(ARCHS))}")
        traits = ARCHS[arch]

        def get(key: str, default: Any = None) -> Any:
            value = md.get(f"{arch}.{key}", default)
            if value is None:
                raise ModelError(f"the model's metadata has no {arch}.{key}; is the GGUF file complete?")
            if isinstance(value, list):  # per-layer values (some files): only uniform ones are supported
                if len(set(value)) != 1:
                    raise ModelError(f"{arch}.{key} differs between layers ({value}); that is not supported yet")
                value = value[0]
            return value

        dim = int(get("embedding_length"))
        n_layers = int(get("block_count"))
        n_heads = int(get("attention.head_count"))
        n_kv_heads = int(get("attention.head_count_kv", n_heads))
        head_dim = int(get("attention.key_length", dim // n_heads))
        value_dim = int(get("attention.value_length", head_dim))
        if n_heads % n_kv_heads:
            raise ModelError(f"{arch}.attention.head_count {n_heads} is not a multiple of head_count_kv {n_kv_heads}")
        window = int(get("attention.sliding_window", 0))
        sliding = tuple(_sliding_layers(md, arch, traits, n_layers, window))
        scaling = str(get("rope.scaling.type", "none")) or "none"
        rope_scale = 1.0
        if scaling in ("linear", "yarn"):
            rope_scale = float(get("rope.scaling.factor"))
            if not rope_scale > 0:
                raise ModelError(f"{arch}.rope.scaling.factor must be > 0, got {rope_scale}")
        elif scaling != "none":
            raise ModelError(f"{arch}.rope.scaling.type {scaling!r} is not supported (supported: none, linear, yarn)")
        if scaling == "yarn" and float(get("rope.scaling.yarn_log_multiplier", 0.0)):
            raise ModelError(f"{arch}.rope.scaling.yarn_log_multiplier (DeepSeek's YaRN variant) is not supported yet")
        theta = float(get("rope.freq_base", 10000.0))
        n_experts = int(get("expert_count", 0))
        n_used = int(get("expert_used_count", 0))
        if n_experts and not 0 < n_used <= n_experts:
            raise ModelError(f"{arch}.expert_used_count is {n_used}; it must be in [1, expert_count = {n_experts}]")
        return cls(
            arch=arch,
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            value_dim=value_dim,
            ffn_dim=int(get("feed_forward_length", 0 if n_experts else None)),
            vocab_size=vocab_size,
            norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            context_length=int(get("context_length", 2048)),
            rope_dim=int(get("rope.dimension_count", head_dim)),
            rope_theta=theta,
            rope_local_theta=float(get("rope.freq_base_swa", traits.local_rope_theta or theta)),
            rope_scale=rope_scale,
            rope_style=traits.rope_style,
            activation=traits.activation,
            embed_scale=math.sqrt(dim) if traits.scale_embeddings else 1.0,
            attn_scale=1.0 / math.sqrt(head_dim),
            sliding_window=window,
            sliding_layers=sliding,
            attn_softcap=float(get("attn_logit_softcapping", 0.0)),
            final_softcap=float(get("final_logit_softcapping", 0.0)),
            n_experts=n_experts,
            n_experts_used=n_used,
            expert_norm=bool(get("expert_weights_norm", traits.moe_norm_topk)),
            clamp_kqv=float(get("attention.clamp_kqv", 0.0)),
            rope_scaling=scaling,
            rope_orig_context=int(get("rope.scaling.original_context_length", get("context_length", 2048))),
            yarn_ext_factor=float(get("rope.scaling.yarn_ext_factor", 1.0)),
            yarn_attn_factor=float(get("rope.scaling.yarn_attn_factor", 1.0)),
            yarn_beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0)),
            yarn_beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0)),
        )


def _sliding_layers(md: dict[str, Any], arch: str, traits: ArchTraits, n_layers: int, window: int) -> list[bool]:
    """Which layers slide: an explicit per-layer `attention.sliding_window_pattern` array where the file has one,
    else every layer but each `swa_pattern`-th (gemma3: five sliding, then one global)."""
    if window <= 0:
        return [False] * n_layers
    pattern = md.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise ModelError(
                f"{arch}.attention.sliding_window_pattern has {len(pattern)} entries for {n_layers} layers"
            )
        return [bool(p) for p in pattern]
    every = int(pattern) if isinstance(pattern, int) else traits.swa_pattern
    return [every == 0 or (i + 1) % every != 0 for i in range(n_layers)]
