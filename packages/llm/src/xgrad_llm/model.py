"""One decoder-only Transformer for every supported GGUF architecture: a `GGUFFile` in, logits out.

The architectures differ only in data: `config.ARCHS` holds what the metadata does not say (the RoPE layout, the FFN
activation, whether embeddings are scaled, which layers use a sliding window), `ModelConfig.from_metadata` reads the
rest from the `{arch}.*` keys, and optional tensors (q/k norms, q/k/v biases, post-norms, an untied output head)
are used where the file has them. Supported: llama (1-3, and Mistral files, which say `llama`), qwen2, qwen3,
gemma3, and the mixture-of-experts qwen3moe, olmoe and qwen2moe (a layer whose file has `ffn_gate_inp` routes each
token to its top-k experts: `moe.py`).

Conventions of GGUF that this follows:
- A weight matrix is stored (out_features, in_features); the model keeps each as its transpose W.T (a lazy view),
  so a projection is `x @ wt`.
- llama files store the q and k projections permuted for llama.cpp's "normal" RoPE, which rotates adjacent pairs
  (x[2i], x[2i+1]); the other architectures keep the Hugging Face layout and rotate halves (x[i], x[i + d/2]).
- gemma's RMSNorm multiplies by (1 + w); the GGUF converter stores 1 + w, so every norm here multiplies by the
  stored weight.

The KV cache lives in the model: one key and one value tensor per layer, `cache_len` positions long. `forward`
writes the keys and values of its T positions at `start_pos` (an int, or a bound Variable so that one compiled
program serves every position) and attends over positions [0, start_pos + T).

`numerics="llama.cpp-avx2"` / `"llama.cpp-avx512"` / `"llama.cpp"` (this machine's width) computes as
llama.cpp's CPU backend built for that vector width does (`numerics.py`, `ggml_x86.py`): activations quantised to
8-bit blocks before each product with a quantised weight and its integer lane sums and FMAs, a float16 KV cache,
float16 queries and attention weights in its float16 dot products, its softmax, RMS norm, RoPE tables and GELU
table. The default, "xgrad", is float32 throughout.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from xgrad import Tensor, Variable
from xgrad.dtype import dtypes
from xgrad_llm import ggml_x86
from xgrad_llm.config import ModelConfig, ModelError
from xgrad_llm.ggml_x86 import EXACT_TYPES, BlockInts
from xgrad_llm.gguf import GGUFFile
from xgrad_llm.moe import moe_ffn
from xgrad_llm.numerics import ACTIVATION_TYPES, NUMERICS, activations, gelu_f16, lanes_of, round_f16
from xgrad_llm.packed import PackedMatrix, can_pack
from xgrad_llm.quants import GGMLType, dequantize

Size = Any  # an int, or a bound Variable (a UOp): a position in the sequence
GROUPED_ROWS = 8  # products with at most this many rows run group by group over a packed matrix (see `_product`)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": lambda x: x.silu(),
    "gelu_tanh": lambda x: x.gelu("tanh"),
}


class LayerWeights(dict[str, Tensor]):
    """One layer's tensors by short name ("attn_q", "ffn_norm", ...), in `types` the GGML type each matrix has in
    the file (llama.cpp's numerics quantise a matrix's input by it), and in `packed` the matrices kept packed (their
    products with a few rows run group by group: `PackedMatrix.product`)."""

    def __init__(self) -> None:
        super().__init__()
        self.types: dict[str, int] = {}
        self.packed: dict[str, PackedMatrix] = {}
        self.ints: dict[str, BlockInts] = {}  # llama.cpp numerics: the matrices whose products it reproduces exactly

    def input_for(self, prep: Callable[[Tensor, int | None], Tensor]) -> Callable[[Tensor, str], Tensor]:
        """`prep(x, type)` keyed by matrix name instead of type."""
        return lambda x, name: prep(x, self.types.get(name))


def _fuse(w: LayerWeights, parts: tuple[str, ...], name: str, same_types: bool = False) -> None:
    """Replace the matrices `parts` of layer weights `w` (transposed, and their biases, when all have one) by their
    rows stacked into one matrix `name` (transposed); with `same_types`, only where llama.cpp would quantise all the
    parts' inputs alike."""
    biases = [f"{p}.bias" for p in parts]
    if not all(p in w for p in parts):  # e.g. an MoE layer: no dense gate/up
        return
    if any(b in w for b in biases) and not all(b in w for b in biases):
        return
    if same_types and len({ACTIVATION_TYPES.get(GGMLType(w.types[p])) for p in parts}) != 1:
        return  # llama.cpp numerics quantise the parts' inputs differently
    w.types[name] = w.types[parts[0]]
    w[name] = Tensor.cat(*(w.pop(p).T for p in parts)).contiguous().realize().T
    if biases[0] in w:
        w[f"{name}.bias"] = Tensor.cat(*(w.pop(b) for b in biases)).contiguous().realize()


def rope_tables(
    cfg: ModelConfig, theta: float, scale: float, length: int, factors: np.ndarray | None, yarn: bool = False
) -> Tensor:
    """cos and sin of every position < length and rotated pair: shape (2, length, rope_dim // 2), float32.
    `factors` (llama 3's `rope_freqs.weight`) divide the frequencies. Linear scaling divides the positions by
    `scale`; `yarn` instead mixes interpolated and original frequencies per dimension (`yarn_frequencies`)."""
    inv_freq = 1.0 / theta ** (np.arange(0, cfg.rope_dim, 2, dtype=np.float64) / cfg.rope_dim)
    if factors is not None:
        inv_freq = inv_freq / factors.astype(np.float64)
    positions = np.arange(length, dtype=np.float64)
    mscale = 1.0
    if yarn:
        inv_freq, mscale = yarn_frequencies(cfg, inv_freq, theta, scale)
    else:
        positions = positions / scale
    angles = np.outer(positions, inv_freq)
    return Tensor((np.stack([np.cos(angles), np.sin(angles)]) * mscale).astype(np.float32)).realize()


def yarn_frequencies(cfg: ModelConfig, inv_freq: np.ndarray, theta: float, scale: float) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension"): (frequencies, factor on cos and sin).

    Pair i turns r_i = orig_context * inv_freq[i] / 2pi times over the pretrained context. Pairs turning more than
    beta_fast times keep their frequency (extrapolation), pairs turning fewer than beta_slow times are divided by
    `scale` (interpolation), with a linear ramp between; the boundaries are rounded outwards to whole pairs. The
    attention is sharpened by (1 + 0.1 ln scale) on both q and k (times the file's yarn_attn_factor)."""
    dim = cfg.rope_dim

    def pair_of(rotations: float) -> float:  # the (fractional) pair index that turns `rotations` times
        return dim * math.log(cfg.rope_orig_context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(pair_of(cfg.yarn_beta_fast)), 0)
    high = min(math.ceil(pair_of(cfg.yarn_beta_slow)), dim - 1)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / max(high - low, 0.001), 0.0, 1.0)
    keep = (1.0 - ramp) * cfg.yarn_ext_factor  # weight of the original (extrapolated) frequency
    freqs = inv_freq / scale * (1.0 - keep) + inv_freq * keep
    mscale = cfg.yarn_attn_factor
    if cfg.yarn_ext_factor != 0 and scale > 1:
        mscale *= 1.0 + 0.1 * math.log(scale)
    return freqs, mscale


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * weight


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, style: str, ggml: bool = False) -> Tensor:
    """Rotate the first 2 * cos.shape[-1] dims of each head of x (B, T, heads, head_dim) by the angles of cos/sin
    (T, rot/2); `ggml`: rounding as ggml does (`ggml_x86.rotate`)."""
    half = cos.shape[-1]
    rot = 2 * half
    c = cos.reshape(1, cos.shape[0], 1, half)
    s = sin.reshape(1, sin.shape[0], 1, half)
    xr = x[..., :rot]
    if style == "neox":
        a, b = xr[..., :half], xr[..., half:]
        out = (
            Tensor.cat(*ggml_x86.rotate(a, b, c, s), dim=-1)
            if ggml
            else Tensor.cat(a * c - b * s, b * c + a * s, dim=-1)
        )
    else:
        pairs = xr.reshape(*x.shape[:-1], half, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        rotated = ggml_x86.rotate(a, b, c, s) if ggml else (a * c - b * s, a * s + b * c)
        out = Tensor.stack(*rotated, dim=-1).reshape(*x.shape[:-1], rot)
    return out if rot == x.shape[-1] else Tensor.cat(out, x[..., rot:], dim=-1)


DOT_LANES = 16  # partial sums a decode step's query-key products keep side by side (see `lane_dot`)


def dot_lanes_of(width: int) -> int:
    """How many partial sums `lane_dot` keeps for products over `width` (all of it: one sum, when 16 do not fit)."""
    return DOT_LANES if width % DOT_LANES == 0 and width >= 2 * DOT_LANES else width


def lane_dot(a: Tensor, b: Tensor) -> Tensor:
    """(a * b) (broadcasting) summed over its last two axes, (width / lanes, lanes): the `lanes` partial sums first,
    in a kernel whose lanes are those sums (vector FMAs, short chains), then those sums in a small second kernel. One
    sum over a head's width is a chain of dependent scalar FMAs per score (Gemma 3 270M, 4 rows at position 100:
    3.5 ms of a 44 ms round on one thread). Split the cache's last axis before shrinking it to a symbolic length:
    splitting it after makes every index a division by that length."""
    if a.shape[-2] == 1:  # one sum (a head too narrow for lanes)
        return (a * b).sum((-2, -1))
    return (a * b).sum(-2).contiguous().sum(-1)


def softcap(x: Tensor, cap: float) -> Tensor:
    return x if cap <= 0 else (x / cap).tanh() * cap


class Transformer:
    """The model of a GGUF file with its KV cache.

    `quantized=True` (default) keeps each quantised matrix packed (`packed.PackedMatrix`: its quants in 4 or 8 bits,
    laid out for matrix-vector products) and dequantises it inside the kernels that use it; `quantized=False`
    dequantises every weight once into float32 on `device` at load (four times the memory, and decoding reads four
    times as much). `cache_len` is how many positions the KV cache holds. `progress(what, done,
    total)` is called as layers load. `numerics` is "xgrad" (float32 throughout) or llama.cpp's arithmetic for a
    vector width ("llama.cpp-avx2", "llama.cpp-avx512", "llama.cpp": this machine's; see the module docstring); it
    does not depend on `quantized`.

    `forward(h, start_pos, last)` takes embeddings h (B, T, dim) from `embed`/`embed_token`, writes their keys and
    values at positions [start_pos, start_pos + T) and returns the logits (B, vocab) of position `last` of the T
    (or, with last=None, of all of them: (B, T, vocab)).
    """

    def __init__(
        self,
        f: GGUFFile,
        cache_len: int,
        quantized: bool = True,
        device: str = "CPU",
        batch: int = 1,
        progress: Callable[[str, int, int], None] | None = None,
        numerics: str = "xgrad",
    ) -> None:
        if numerics not in NUMERICS:
            raise ModelError(f"numerics={numerics!r} is not known; use one of {', '.join(NUMERICS)}")
        self.numerics = numerics
        self.llama_numerics = numerics != "xgrad"
        self.lanes = lanes_of(numerics)  # llama.cpp numerics: the float32 lanes of its build's vectors
        self.kv_dtype = dtypes.float16 if self.llama_numerics else dtypes.float32  # llama.cpp's cache is float16
        self.block_ints: dict[str, BlockInts] = {}  # by tensor name (llama.cpp numerics, `EXACT_TYPES`)
        embd = f.tensors.get("token_embd.weight")
        if embd is None:
            raise ModelError(f"{f.paths[0]}: no tensor token_embd.weight; is this a language model?")
        self.cfg = cfg = ModelConfig.from_metadata(f.metadata, embd.shape[0])
        self.file, self.quantized, self.device, self.batch = f, quantized, device, batch
        self.cache_len = cache_len
        self.weight_nbytes = 0  # of the weight matrices as held in memory (what a decode step reads)
        self.packed: dict[str, PackedMatrix] = {}  # by tensor name: the matrices `_matrix` packed
        self.tok_embd_t = self._matrix("token_embd.weight")  # (dim, vocab): a token's embedding is a column
        head = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"  # (tied embeddings)
        self.output = self._matrix(head) if head == "output.weight" else self.tok_embd_t
        # the packed output head (its products with a few rows run group by group); None: `output` as it is
        self.output_packed = self.packed.get(head)
        # llama.cpp numerics: the output head's blocks (its products are llama.cpp's); None: `output` as it is
        self.output_ints = self.block_ints.get(head)
        self.output_type: int | None = f.tensors[head].type
        self.output_norm = self._vector("output_norm.weight")
        self.layers: list[LayerWeights] = []
        for i in range(cfg.n_layers):
            self.layers.append(self._layer(i))
            if progress is not None:
                progress("layers", i + 1, cfg.n_layers)
        factors = f.tensor("rope_freqs.weight", "CPU").numpy() if "rope_freqs.weight" in f.tensors else None
        yarn = cfg.rope_scaling == "yarn"
        # llama.cpp numerics: ggml's own tables (float32 angles, the C library's cosf/sinf); YaRN keeps these
        self.ggml_rope = self.llama_numerics and not yarn
        if self.ggml_rope:
            glob = ggml_x86.rope_tables(cfg.rope_dim, cfg.rope_theta, 1.0 / cfg.rope_scale, cache_len, factors)
            self.rope_global = Tensor(glob, device=device).realize()
            local = ggml_x86.rope_tables(cfg.rope_dim, cfg.rope_local_theta, 1.0, cache_len, None)
            self.rope_local = Tensor(local, device=device).realize()
        else:
            self.rope_global = rope_tables(cfg, cfg.rope_theta, cfg.rope_scale, cache_len, factors, yarn)
            self.rope_local = rope_tables(cfg, cfg.rope_local_theta, 1.0, cache_len, None)
        kv = self.kv_dtype
        # llama.cpp numerics attend over the whole cache (masked), a multiple of its dot products' 4 x 16 lanes
        slots = -(-cache_len // 64) * 64 if self.llama_numerics else cache_len
        self.cache_k = [
            Tensor.zeros(batch, cfg.n_kv_heads, slots, cfg.head_dim, dtype=kv, device=device).contiguous().realize()
            for _ in range(cfg.n_layers)
        ]
        self.cache_v = [
            Tensor.zeros(batch, cfg.n_kv_heads, slots, cfg.value_dim, dtype=kv, device=device).contiguous().realize()
            for _ in range(cfg.n_layers)
        ]

    # ---- weights ----
    def _matrix(self, name: str, exact: bool = True) -> Tensor:
        """W.T of matrix `name`: a view of float32 W, or lazy ops over its packed (or raw) quantised bytes that fuse
        into the matmul that uses them.

        Under llama.cpp numerics a matrix of a type in `EXACT_TYPES` whose products read `block_ints` (`exact`: the
        caller's products go through `ggml_x86.product`) is held once, as the file's bytes: its `BlockInts` and the
        W.T returned (read only by token-embedding lookups, a gather that no sum order changes) are lazy ops over
        that one buffer. Packing it as well took a second copy that nothing read (Gemma 3 270M Q4_K_M loaded: peak
        RSS 813 -> 429 MiB with the single copy below, llm README). Matrices whose products read W.T
        (`exact=False`: MoE routers, qwen2moe's shared expert) are packed as under float32 numerics and get no
        `BlockInts`."""
        info = self.file.tensors[name]
        if exact and self.llama_numerics and info.type in EXACT_TYPES and len(info.shape) == 2:
            # the copy itself is the buffer: `.contiguous()` would copy it again and leave the first in the
            # allocator's cache of freed blocks (Gemma 3 270M's 170 MiB embedding: 170 MiB more resident)
            raw = self.file.raw(name).to(self.device).realize()
            self.weight_nbytes += raw.nbytes()
            self.block_ints[name] = BlockInts.from_raw(raw, info.type, (info.shape[0], info.shape[1]))
            return dequantize(raw, info.type, info.shape).T
        if not self.quantized or info.type == GGMLType.F32:
            w = self.file.tensor(name, self.device).contiguous().realize()
            self.weight_nbytes += w.nbytes()
            return w.T
        if can_pack(info.type) and len(info.shape) == 2:  # packed from the file a few MB at a time
            m = PackedMatrix(self.file.raw(name), info.type, (info.shape[0], info.shape[1]), device=self.device)
            self.weight_nbytes += m.nbytes
            self.packed[name] = m
            return m.t()
        raw = self.file.raw(name).to(self.device).contiguous().realize()
        self.weight_nbytes += raw.nbytes()
        return dequantize(raw, info.type, info.shape).T

    def _experts(self, name: str) -> Tensor:
        """The experts' matrices of 3-d tensor `name`, (n_expert, N, K) in the file, as (K, n_expert, N): each expert's
        W.T side by side, so that x @ w.reshape(K, -1) runs every expert in one matmul. Quantised bytes are packed
        as one (n_expert * N, K) matrix (the file's rows, expert after expert)."""
        info = self.file.tensors[name]
        if len(info.shape) != 3:
            raise ModelError(f"{self.file.paths[0]}: {name} has shape {info.shape}; expected (experts, rows, cols)")
        e, n, k = info.shape
        if e != self.cfg.n_experts:
            raise ModelError(f"{self.file.paths[0]}: {name} holds {e} experts; the metadata says {self.cfg.n_experts}")
        if not self.quantized or info.type == GGMLType.F32:
            w = self.file.tensor(name, self.device).contiguous().realize()
            self.weight_nbytes += w.nbytes()
            return w.permute(2, 0, 1)
        if can_pack(info.type):  # packed from the file's bytes a few MB at a time: no whole copy of them in memory
            m = PackedMatrix(self.file.raw(name), info.type, (e * n, k), device=self.device)
            self.weight_nbytes += m.nbytes
            return m.t().reshape(k, e, n)
        raw = self.file.raw(name).to(self.device).contiguous().realize()
        self.weight_nbytes += raw.nbytes()
        return dequantize(raw, info.type, (e * n, k)).T.reshape(k, e, n)

    def _vector(self, name: str) -> Tensor:
        return self.file.tensor(name, self.device).contiguous().realize()

    def _layer(self, i: int) -> LayerWeights:
        w = LayerWeights()
        moe = f"blk.{i}.ffn_gate_inp.weight" in self.file.tensors
        if moe and not self.cfg.n_experts:
            raise ModelError(f"{self.file.paths[0]}: layer {i} routes to experts but the metadata has no expert_count")
        ffn = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") if moe else ("ffn_gate", "ffn_up")
        required = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", *ffn)
        for short in required if moe else (*required, "ffn_down"):
            name = f"blk.{i}.{short}.weight"
            if name not in self.file.tensors:
                raise ModelError(f"{self.file.paths[0]}: tensor {name} is missing; is the GGUF file complete?")
            if short.endswith("norm"):
                w[short] = self._vector(name)
            else:
                # the router's product reads W.T (moe_ffn), not llama.cpp's sums: packed as under float32 numerics
                w[short] = (
                    self._experts(name) if short.endswith("_exps") else self._matrix(name, short != "ffn_gate_inp")
                )
                w.types[short] = self.file.tensors[name].type
                if name in self.packed:
                    w.packed[short] = self.packed[name]
                if name in self.block_ints:
                    w.ints[short] = self.block_ints[name]
        for short in ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"):  # qwen2moe's shared expert
            if (name := f"blk.{i}.{short}.weight") in self.file.tensors:
                w[short] = self._matrix(name, exact=False)  # moe_ffn multiplies by its W.T
                w.types[short] = self.file.tensors[name].type
        if (name := f"blk.{i}.ffn_gate_inp_shexp.weight") in self.file.tensors:  # its gate: (dim,) or (1, dim)
            w["ffn_gate_inp_shexp"] = self._vector(name).reshape(self.cfg.dim, 1)
            w.types["ffn_gate_inp_shexp"] = self.file.tensors[name].type
        optional = ("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm")
        for short in optional:
            if (name := f"blk.{i}.{short}.weight") in self.file.tensors:
                w[short] = self._vector(name)
        for short in ("attn_q", "attn_k", "attn_v", "attn_output"):
            if (name := f"blk.{i}.{short}.bias") in self.file.tensors:
                w[f"{short}.bias"] = self._vector(name)
        if not self.quantized and not w.ints:  # one matvec instead of three (two): fewer, larger kernels
            _fuse(w, ("attn_q", "attn_k", "attn_v"), "attn_qkv", self.llama_numerics)
            _fuse(w, ("ffn_gate", "ffn_up"), "ffn_gate_up", self.llama_numerics)
        return w

    # ---- embeddings ----
    def embed_token(self, tok: Size) -> Tensor:
        """The (scaled) embedding of token id `tok` (an int or a bound Variable): shape (1, dim). A slice of the
        table, so one compiled program serves every id."""
        row = self.tok_embd_t.shrink((None, (tok, tok + 1))).reshape(1, self.cfg.dim)
        return row * self.cfg.embed_scale if self.cfg.embed_scale != 1.0 else row

    def embed(self, ids: list[int]) -> Tensor:
        """Embeddings (1, len(ids), dim) of a list of token ids, realized."""
        out = Tensor.empty(len(ids), self.cfg.dim, device=self.device).contiguous().realize()
        tok, row = Variable("tok", 0, self.cfg.vocab_size - 1), Variable("row", 0, max(len(ids) - 1, 0))
        for r, i in enumerate(ids):
            at = row.bind(r)
            out.shrink(((at, at + 1), None)).assign(self.embed_token(tok.bind(i))).realize()
        return out.reshape(1, len(ids), self.cfg.dim)

    # ---- the network ----
    def forward(self, h: Tensor, start_pos: Size, last: Size | None = None) -> Tensor:
        cfg = self.cfg
        for i, w in enumerate(self.layers):
            # realized per layer: the next layer's cache writes realize their inputs, and a lazy residual stream
            # would make each of them recompute every layer before it
            h = self._block(i, w, h, start_pos).realize()
        if last is not None:
            h = h.shrink((None, (last, last + 1), None))
        if self.output_ints is not None:
            logits = ggml_x86.product(self._norm(h, self.output_norm), self.output_ints)
        else:
            logits = self._product(
                self._input(self._norm(h, self.output_norm), self.output_type), self.output, self.output_packed
            )
        logits = softcap(logits, cfg.final_softcap)
        return logits[:, 0] if last is not None else logits

    __call__ = forward

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        """RMS norm times weight; under llama.cpp numerics as ggml rounds it."""
        if self.llama_numerics:
            return ggml_x86.rms_norm(x, weight, self.cfg.norm_eps)
        return rms_norm(x, weight, self.cfg.norm_eps)

    def _add(self, a: Tensor, b: Tensor) -> Tensor:
        """a + b (the residual stream); under llama.cpp numerics never fused with the product before it."""
        return ggml_x86.add32(a, b) if self.llama_numerics else a + b

    def _block(self, i: int, w: LayerWeights, h: Tensor, start_pos: Size) -> Tensor:
        a = self._attention(i, w, self._norm(h, w["attn_norm"]), start_pos)
        if "post_attention_norm" in w:
            a = self._norm(a, w["post_attention_norm"])
        h = self._add(h, a)
        x = self._norm(h, w["ffn_norm"])
        act = ACTIVATIONS[self.cfg.activation]
        if self.llama_numerics and self.cfg.activation == "gelu_tanh":
            act = gelu_f16
        if "ffn_gate_inp" in w:
            m = moe_ffn(x, w, act, self.cfg.n_experts_used, self.cfg.expert_norm, w.input_for(self._input))
        elif "ffn_gate_up" in w:
            gate_up = self._matmul(x, w, "ffn_gate_up")
            m = self._matmul(act(gate_up[..., : self.cfg.ffn_dim]) * gate_up[..., self.cfg.ffn_dim :], w, "ffn_down")
        else:
            m = self._matmul(act(self._matmul(x, w, "ffn_gate")) * self._matmul(x, w, "ffn_up"), w, "ffn_down")
        if "post_ffw_norm" in w:
            m = self._norm(m, w["post_ffw_norm"])
        return self._add(h, m)

    def _input(self, x: Tensor, type_id: int | None) -> Tensor:
        """x as the input of a product with a matrix of GGML type `type_id`: quantised as llama.cpp quantises it
        under llama.cpp numerics, else as is."""
        return activations(x, type_id) if self.llama_numerics and type_id is not None else x

    def _matmul(self, x: Tensor, w: LayerWeights, name: str) -> Tensor:
        """x @ W.T of layer matrix `name`, its input quantised as the numerics say (llama.cpp's own sums where
        `ggml_x86` reproduces them)."""
        if name in w.ints:
            return ggml_x86.product(x, w.ints[name])
        return self._product(self._input(x, w.types.get(name)), w[name], w.packed.get(name))

    def _product(self, x: Tensor, wt: Tensor, packed: PackedMatrix | None) -> Tensor:
        """x @ wt; for at most GROUPED_ROWS rows of x and a packed matrix, group by group (`PackedMatrix.product`:
        one conversion per weight for all rows; a 4-row round of Gemma 3 270M's output head on one thread 26.5 ->
        20.3 ms, one row unchanged). Longer inputs (a prompt's chunk) keep the tiled matmul, and so does llama.cpp
        numerics: its greedy ids against llama.cpp's (test_generate) were measured with that order of sums."""
        if packed is not None and not self.llama_numerics and math.prod(x.shape[:-1]) <= GROUPED_ROWS:
            return packed.product(x)
        return x @ wt

    def _project(self, w: LayerWeights, name: str, x: Tensor) -> Tensor:
        y = self._matmul(x, w, name)
        return y + w[f"{name}.bias"] if f"{name}.bias" in w else y

    def _f16(self, x: Tensor) -> Tensor:
        """x rounded to float16 under llama.cpp numerics (its attention products round their float32 operand)."""
        return round_f16(x) if self.llama_numerics else x

    def _qkv(self, w: LayerWeights, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, T, heads, hd), keys (B, T, kv_heads, hd) and values (B, T, kv_heads, vd) of x (B, T, dim),
        clipped and normed as the model says, before RoPE. The q/k norm is per head (qwen3, gemma3: a weight of
        head_dim) or over all heads at once (olmoe: a weight of heads * head_dim)."""
        cfg = self.cfg
        b, t, _ = x.shape
        hd, vd, kv = cfg.head_dim, cfg.value_dim, cfg.n_kv_heads
        if "attn_qkv" in w:
            qkv = self._project(w, "attn_qkv", x)
            nq, nk = cfg.n_heads * hd, kv * hd
            q, k, v = qkv[..., :nq], qkv[..., nq : nq + nk], qkv[..., nq + nk :]
        else:
            q, k, v = (self._project(w, name, x) for name in ("attn_q", "attn_k", "attn_v"))
        per_head = {name: name in w and w[name].shape[-1] == hd for name in ("attn_q_norm", "attn_k_norm")}
        if "attn_q_norm" in w and not per_head["attn_q_norm"]:  # over all heads at once
            q = self._norm(q, w["attn_q_norm"])
        if "attn_k_norm" in w and not per_head["attn_k_norm"]:
            k = self._norm(k, w["attn_k_norm"])
        if cfg.clamp_kqv > 0:  # after those norms, as transformers' OLMoE
            q, k, v = (y.clip(-cfg.clamp_kqv, cfg.clamp_kqv) for y in (q, k, v))
        q = q.reshape(b, t, cfg.n_heads, hd)
        k = k.reshape(b, t, kv, hd)
        v = v.reshape(b, t, kv, vd)
        if per_head["attn_q_norm"]:
            q = self._norm(q, w["attn_q_norm"])
        if per_head["attn_k_norm"]:
            k = self._norm(k, w["attn_k_norm"])
        return q, k, v

    def _attention(self, i: int, w: LayerWeights, x: Tensor, start_pos: Size) -> Tensor:
        cfg = self.cfg
        b, t, _ = x.shape
        kv, vd = cfg.n_kv_heads, cfg.value_dim
        group = cfg.n_heads // kv
        q, k, v = self._qkv(w, x)
        sliding = cfg.sliding_layers[i]
        table = (self.rope_local if sliding else self.rope_global).shrink((None, (start_pos, start_pos + t), None))
        q = apply_rope(q, table[0], table[1], cfg.rope_style, self.ggml_rope)
        k = apply_rope(k, table[0], table[1], cfg.rope_style, self.ggml_rope)

        end = start_pos + t
        ck, cv = self.cache_k[i], self.cache_v[i]
        Tensor.realize(  # the assigns themselves are realized: realizing the cache would not run them
            ck.shrink((None, None, (start_pos, end), None)).assign(k.transpose(1, 2).cast(ck.dtype)),
            cv.shrink((None, None, (start_pos, end), None)).assign(v.transpose(1, 2).cast(cv.dtype)),
        )
        if self.llama_numerics:
            return self._project(w, "attn_output", self._attend_ggml(q, ck, cv, start_pos, sliding))
        keys = ck.shrink((None, None, (0, end), None)).unsqueeze(2).cast(dtypes.float32)  # (B, KV, 1, S, hd)
        values = cv.shrink((None, None, (0, end), None)).unsqueeze(2).cast(dtypes.float32)

        qg = self._f16(q).reshape(b, t, kv, group, cfg.head_dim).permute(0, 2, 3, 1, 4)  # (B, KV, G, T, hd)
        # products and sums over broadcast views rather than `@`: a matmul reshapes the symbolic cache length S into
        # its own layout, and the kernel then divides indices by start_pos + 1 for every element it loads
        if t == 1 and (lanes := dot_lanes_of(cfg.head_dim)) < cfg.head_dim:  # a decode step: 16 partial sums
            split = (cfg.head_dim // lanes, lanes)  # the cache split before its shrink (see lane_dot)
            keys16 = ck.reshape(*ck.shape[:3], *split).shrink((None, None, (0, end), None, None)).unsqueeze(2)
            qk = lane_dot(qg.reshape(*qg.shape[:-1], 1, *split), keys16.unsqueeze(-4).cast(dtypes.float32))
        else:
            qk = (qg.unsqueeze(-2) * keys.unsqueeze(-3)).sum(-1)  # (B, KV, G, T, S)
        scores = softcap(qk * cfg.attn_scale, cfg.attn_softcap)
        if t > 1 or (sliding and cfg.sliding_window):
            scores = self._visible(start_pos, t, end, sliding).where(scores, -math.inf)
        probs = self._f16(scores.softmax(-1))
        if t == 1:  # realized: else each output lane of the product below recomputes its row's exponentials
            probs = probs.contiguous()
        out = (probs.unsqueeze(-1) * values.unsqueeze(-3)).sum(-2)  # (B, KV, G, T, vd)
        out = out.permute(0, 3, 1, 2, 4).reshape(b, t, cfg.n_heads * vd)
        return self._project(w, "attn_output", out)

    def _visible(self, start_pos: Size, t: int, length: int | Size, sliding: bool) -> Tensor:
        """(T, length) bool: the cache positions query t' (at position start_pos + t') attends to: those up to its own,
        and on a sliding layer only the last `sliding_window` of them."""
        rows = Tensor.arange(start_pos, start_pos + t, device=self.device).reshape(t, 1)
        cols = Tensor.arange(length, device=self.device).reshape(1, -1)
        keep = cols <= rows
        window = self.cfg.sliding_window if sliding else 0
        return keep & (cols > rows - window) if window else keep

    def _attend_ggml(self, q: Tensor, ck: Tensor, cv: Tensor, start_pos: Size, sliding: bool) -> Tensor:
        """Attention of queries q (B, T, heads, hd) over the whole float16 cache (masked past the current positions)
        as llama.cpp computes it: float16 queries and weights, its float16 dot products and softmax
        (`ggml_x86`). (B, T, heads * vd)."""
        cfg = self.cfg
        b, t = q.shape[0], q.shape[1]
        kv, group, slots = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, ck.shape[2]
        qg = round_f16(q).reshape(b, t, kv, group, cfg.head_dim).permute(0, 2, 3, 1, 4)  # (B, KV, G, T, hd)
        keys = ck.cast(dtypes.float32).reshape(b, kv, 1, 1, slots, cfg.head_dim)
        qk = ggml_x86.dot_f16(qg.unsqueeze(-2), keys, self.lanes, t)  # (B, KV, G, T, S)
        scores = softcap(qk * cfg.attn_scale, cfg.attn_softcap)
        probs = round_f16(
            ggml_x86.softmax(self._visible(start_pos, t, slots, sliding).where(scores, -math.inf), self.lanes)
        )
        values = cv.cast(dtypes.float32).transpose(2, 3).reshape(b, kv, 1, 1, cfg.value_dim, slots)
        out = ggml_x86.dot_f16(probs.unsqueeze(-2), values, self.lanes, t)  # (B, KV, G, T, vd)
        return out.permute(0, 3, 1, 2, 4).reshape(b, t, cfg.n_heads * cfg.value_dim)

    def with_identity_head(self) -> Transformer:
        """A shallow copy that shares these weights, has a KV cache of its own (same dtype) and the identity as its
        output head (no final softcap, its input not quantised): its `forward` returns the final normed hidden
        states, (B, dim), instead of logits (what /v1/embeddings runs)."""
        m = copy.copy(self)
        m.cfg = dataclasses.replace(self.cfg, final_softcap=0.0)
        m.output = Tensor.eye(self.cfg.dim, device=self.device).contiguous().realize()
        m.output_packed, m.output_ints, m.output_type = None, None, None
        m.cache_k, m.cache_v = (
            [c.zeros_like().contiguous().realize() for c in cs] for cs in (self.cache_k, self.cache_v)
        )
        return m

    def logits_all(self, ids: list[int]) -> Tensor:
        """Logits (1, len(ids), vocab) of every position of `ids` from position 0: one full pass (for tests)."""
        return self.forward(self.embed(ids), 0).realize()
