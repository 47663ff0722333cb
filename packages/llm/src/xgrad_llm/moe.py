"""Mixture-of-experts feed-forward layers (qwen3moe, olmoe, qwen2moe): normed activations in, the layer's output out.

A router (`ffn_gate_inp`, a (dim, n_expert) matrix) scores the experts for each token; the softmax of the scores
is kept for the top k experts and zeroed for the others (optionally renormalised to sum 1), and the output is the
sum of the k experts' gated FFNs, each weighted by its probability. qwen2moe adds a shared expert that every token
uses, scaled by sigmoid(x . ffn_gate_inp_shexp).

The experts' weights come from `Transformer._experts` as (K, n_expert, N) tensors (each expert's W.T side by side),
so each of the gate, up and down projections of all experts is one matrix product over the concatenated experts,
and the routing weights (zero for the experts a token does not use) are folded in before the down projection. This
computes every expert for every token, n_expert / k times the arithmetic of the chosen ones; with packed quantised
weights it dequantises them inside the matmul kernels like any other matrix.
"""

from __future__ import annotations

from collections.abc import Callable

from xgrad import Tensor
from xgrad.dtype import dtypes


def route(scores: Tensor, k: int, normalize: bool) -> Tensor:
    """The weight (..., n_expert) of each expert for each token from the router's scores (..., n_expert): the
    softmax probability for the k most probable experts (the lower index first among equal ones), 0 for the rest;
    divided by their sum when `normalize`.

    >>> [round(p, 3) for p in route(Tensor([0.0, 2.0, 1.0]), 2, True).tolist()]
    [0.0, 0.731, 0.269]
    """
    # realized first, so both sides of each comparison read the same stored value: fused into the comparing kernel,
    # the CPU backend recomputes the softmax on one side with its vectorised exp2 polynomial and on the other with
    # scalar exp2f, which differ in the last bits, so an expert could rank above itself
    probs = scores.cast(dtypes.float32).softmax(-1).contiguous()
    e = probs.shape[-1]
    mine = probs.unsqueeze(-1)  # (..., E, 1): the expert being ranked
    other = probs.unsqueeze(-2)  # (..., 1, E): every expert it is compared with
    idx = Tensor.arange(e, device=probs.device)
    before = idx.reshape(1, e) < idx.reshape(e, 1)  # [mine, other]: other has the lower index
    ahead = (other > mine) | ((other == mine) & before)
    rank = ahead.cast(dtypes.int32).sum(-1)  # how many experts rank above each one
    weights = (rank < k).where(probs, 0.0)
    return weights / weights.sum(-1, keepdim=True) if normalize else weights


def _as_is(x: Tensor, name: str) -> Tensor:
    return x


def moe_ffn(
    x: Tensor,
    w: dict[str, Tensor],
    act: Callable[[Tensor], Tensor],
    k: int,
    normalize: bool,
    prep: Callable[[Tensor, str], Tensor] = _as_is,
) -> Tensor:
    """The MoE feed-forward output (..., dim) of normed activations x (..., dim) with layer weights `w`:
    `ffn_gate_inp` (dim, E), `ffn_gate_exps`/`ffn_up_exps` (dim, E, F), `ffn_down_exps` (F, E, dim), and the
    optional shared expert `ffn_{gate,up,down}_shexp` (transposed matrices) with its gate `ffn_gate_inp_shexp`
    (dim, 1). `prep(x, name)` is the input of a product with matrix `name` (the model's numerics may quantise it);
    the routing weights multiply each expert's down-projection input after that, as llama.cpp weighs the experts'
    outputs (the same up to float rounding)."""
    lead = x.shape[:-1]
    weights = route(prep(x, "ffn_gate_inp") @ w["ffn_gate_inp"], k, normalize)  # (..., E)
    dim, e, f = w["ffn_gate_exps"].shape
    gate = (prep(x, "ffn_gate_exps") @ w["ffn_gate_exps"].reshape(dim, e * f)).reshape(*lead, e, f)
    up = (prep(x, "ffn_up_exps") @ w["ffn_up_exps"].reshape(dim, e * f)).reshape(*lead, e, f)
    h = prep(act(gate) * up, "ffn_down_exps")  # quantised per expert: F is a multiple of the blocks
    h = (h * weights.unsqueeze(-1)).reshape(*lead, e * f)
    out = h @ w["ffn_down_exps"].permute(1, 0, 2).reshape(e * f, dim)
    if "ffn_up_shexp" in w:
        gated = act(prep(x, "ffn_gate_shexp") @ w["ffn_gate_shexp"]) * (prep(x, "ffn_up_shexp") @ w["ffn_up_shexp"])
        shared = prep(gated, "ffn_down_shexp") @ w["ffn_down_shexp"]
        if "ffn_gate_inp_shexp" in w:
            shared = shared * (prep(x, "ffn_gate_inp_shexp") @ w["ffn_gate_inp_shexp"]).sigmoid()
        out = out + shared
    return out
