"""Greedy-decode Gemma 3 270M in numpy with llama.cpp's x86 arithmetic (check_llamacpp_ops.py's op models), per SIMD
build, and compare the ids with the llama.cpp fixtures: does the model of its kernels predict its tokens?

Builds ("--isa"):
- avx2: 8-lane float32 vectors (float16 dots in 4 x 8 accumulators, softmax chunks of 8, the 256-bit vector expf);
- avx512: 16 lanes (4 x 16 accumulators, chunks of 16, the 512-bit expf: 1 + b + ... as one polynomial, scalef);
- avx512fp16: as avx512, but the decode step's float16 dots accumulate in float16 (AVX512-FP16: 4 x 32 lanes,
  _mm512_fmadd_ph, reduced in float16), as ggml builds them on CPUs with AVX512-FP16 (Sapphire Rapids on).
The quantised matrix products are the AVX2 kernels in every build (ggml has no 512-bit ones for these types).

    .venv/bin/python packages/llm/scripts/emulate_llamacpp.py --isa avx2 [--chat] [--n 32]

Measured (about 6 s a token): avx2 gives the AVX2 fixture's 32 raw-prompt ids (ties down to 0.0015 apart), avx512
the AVX-512 fixture's 32, avx512fp16 only the first 11 of either: the AVX-512 recording's float16 dots summed in
float32.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from check_llamacpp_ops import (  # noqa: E402
    F32,
    F64,
    Weights,
    expf_terms,
    fma,
    geglu,
    hexf,
    hsum8,
    matvec,
    reduce_lanes,
    rms_norm,
    rope_neox,
    v_expf,
)

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
N_KV = 256  # llama.cpp's cache view (n_ctx = 256); positions past the current one are masked (exact zeros)


def v_expf_512(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf's AVX-512 form: j = fma(poly, u, fma(c1, b, 1)), result scalef(j, n) (j * 2^n, rounded once)."""
    _, n, b, u, hi = expf_terms(x)
    j = fma(hi, u, fma(hexf("0x1.FFFFECp-1"), b, F32(1)))
    with np.errstate(over="ignore", invalid="ignore"):
        nn = np.where(np.isfinite(n), n, 0).astype(np.int64)
        res = np.ldexp(j.astype(F64), nn).astype(F32)
        big = np.abs(n) > 192
        return np.where(big, np.where(n <= 0, F32(0), F32(np.inf)), res).astype(F32)


def soft_max(x: np.ndarray, isa: str) -> np.ndarray:
    width = 8 if isa == "avx2" else 16
    mx = x.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        y = (v_expf if isa == "avx2" else v_expf_512)((x - mx).astype(F32))
    chunks = y.reshape(*y.shape[:-1], -1, width)
    part = hsum8(chunks) if width == 8 else reduce_lanes(chunks, width)
    total = np.zeros(x.shape[:-1], F64)
    for c in range(part.shape[-1]):
        total = total + part[..., c].astype(F64)
    return (y * (1.0 / total).astype(F32)[..., None]).astype(F32)


def f16_dot(x: np.ndarray, y: np.ndarray, isa: str) -> np.ndarray:
    """ggml_vec_dot_f16 (decode)."""
    x, y = np.broadcast_arrays(x.astype(F32), y.astype(F32))
    if isa == "avx512fp16":  # float16 arithmetic, 4 x 32 lanes, one rounding per FMA and per add
        p = (x * y).astype(F64).reshape(*x.shape[:-1], -1, 4, 32)
        acc = np.zeros(p.shape[:-3] + (4, 32), np.float16)
        for j in range(p.shape[-3]):
            acc = (acc.astype(F64) + p[..., j, :, :]).astype(np.float16)
        a = ((acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])).astype(np.float16)
        while a.shape[-1] > 1:
            h = a.shape[-1] // 2
            a = (a[..., :h] + a[..., h:]).astype(np.float16)
        return a[..., 0].astype(F32)
    width = 8 if isa == "avx2" else 16
    p = (x * y).astype(F32).reshape(*x.shape[:-1], -1, 4, width)
    acc = np.zeros(p.shape[:-3] + (4, width), F32)
    for j in range(p.shape[-3]):
        acc = (acc + p[..., j, :, :]).astype(F32)
    a = ((acc[..., 0, :] + acc[..., 2, :]).astype(F32) + (acc[..., 1, :] + acc[..., 3, :]).astype(F32)).astype(F32)
    return reduce_lanes(a, width)


def tiny_dot(x: np.ndarray, y: np.ndarray, isa: str) -> np.ndarray:
    """llamafile tinyBLAS float16 dot (prompt steps): one accumulator of 8 or 16 float32 lanes."""
    width = 8 if isa == "avx2" else 16
    x, y = np.broadcast_arrays(x.astype(F32), y.astype(F32))
    p = (x * y).astype(F32).reshape(*x.shape[:-1], -1, width)
    acc = np.zeros(p.shape[:-2] + (width,), F32)
    for j in range(p.shape[-2]):
        acc = (acc + p[..., j, :]).astype(F32)
    return hsum8(acc) if width == 8 else reduce_lanes(acc, width)


class Gemma:
    def __init__(self, path: str, isa: str) -> None:
        self.w = Weights(path)
        self.isa = isa
        self.k = [np.zeros((N_KV, 256), np.float16) for _ in range(18)]
        self.v = [np.zeros((N_KV, 256), np.float16) for _ in range(18)]

    def vec(self, name: str) -> np.ndarray:
        return self.w.get(name)["w"]

    def embed(self, tok: int) -> np.ndarray:
        e = self.w.get("token_embd.weight")
        row = (e["d"][tok][:, None] * e["q"][tok].astype(F32)).astype(F32).reshape(-1)
        return (row * F32(math.sqrt(640))).astype(F32)

    def mm(self, name: str, x: np.ndarray) -> np.ndarray:
        return np.stack([matvec(self.w.get(name), row) for row in x])

    def forward(self, toks: list[int], start: int) -> np.ndarray:
        t = len(toks)
        h = np.stack([self.embed(tok) for tok in toks])  # (T, 640)
        pos = np.arange(start, start + t)
        for i in range(18):
            p = f"blk.{i}."
            x = (rms_norm(h, 1e-6) * self.vec(p + "attn_norm.weight")).astype(F32)
            base = 1e6 if i % 6 == 5 else 10000.0
            q = self.mm(p + "attn_q.weight", x).reshape(t, 4, 256)
            q = (rms_norm(q, 1e-6) * self.vec(p + "attn_q_norm.weight")).astype(F32)
            q = np.stack([rope_neox(q[j], int(pos[j]), base) for j in range(t)])
            q = (q * F32(0.0625)).astype(F32)
            k = self.mm(p + "attn_k.weight", x).reshape(t, 1, 256)
            k = (rms_norm(k, 1e-6) * self.vec(p + "attn_k_norm.weight")).astype(F32)
            k = np.stack([rope_neox(k[j], int(pos[j]), base) for j in range(t)])
            v = self.mm(p + "attn_v.weight", x)
            self.k[i][start : start + t] = k[:, 0].astype(np.float16)
            self.v[i][start : start + t] = v.astype(np.float16)
            qh = q.transpose(1, 0, 2).astype(np.float16)  # (heads, T, 256)
            dot = f16_dot if t == 1 else lambda a, b, isa: tiny_dot(a, b, isa)
            kq = dot(self.k[i][None, None], qh[:, :, None, :], self.isa)  # (heads, T, N_KV)
            mask = np.where(np.arange(N_KV)[None] <= pos[:, None], F32(0), F32(-np.inf)).astype(F32)
            probs = soft_max((kq + mask).astype(F32), self.isa).astype(np.float16)
            vt = self.v[i].T  # (256 vd, N_KV)
            kqv = dot(vt[None, None], probs[:, :, None, :], self.isa)  # (heads, T, 256)
            a = self.mm(p + "attn_output.weight", kqv.transpose(1, 0, 2).reshape(t, 1024))
            a = (rms_norm(a, 1e-6) * self.vec(p + "post_attention_norm.weight")).astype(F32)
            h = (a + h).astype(F32)
            x = (rms_norm(h, 1e-6) * self.vec(p + "ffn_norm.weight")).astype(F32)
            g = geglu(self.mm(p + "ffn_gate.weight", x), self.mm(p + "ffn_up.weight", x))
            m = self.mm(p + "ffn_down.weight", g)
            m = (rms_norm(m, 1e-6) * self.vec(p + "post_ffw_norm.weight")).astype(F32)
            h = (m + h).astype(F32)
        last = (rms_norm(h[-1:], 1e-6) * self.vec("output_norm.weight")).astype(F32)
        return self.mm("token_embd.weight", last)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--isa", choices=("avx2", "avx512", "avx512fp16"), default="avx2")
    p.add_argument("--chat", action="store_true", help="the chat-templated prompt")
    p.add_argument("--n", type=int, default=32, help="ids to generate")
    p.add_argument("--model", default=None)
    args = p.parse_args()
    from xgrad_llm.cli import default_model

    files = (("avx512", "gemma3_270m_greedy_llamacpp.json"), ("avx2", "gemma3_270m_greedy_llamacpp_avx2.json"))
    fixtures = {name: json.loads((FIXTURES / f).read_text()) for name, f in files}
    fx = fixtures["avx2"]
    prompt = fx["chat"]["prompt_ids"] if args.chat else fx["prompt_ids"]
    model = Gemma(str(args.model or default_model()), args.isa)
    t0 = time.time()
    logits = model.forward(prompt, 0)
    out: list[int] = []
    margins: list[float] = []
    while len(out) < args.n:
        top = np.argsort(logits)[::-1][:2]
        margins.append(float(logits[top[0]] - logits[top[1]]))
        out.append(int(top[0]))
        print(f"{len(out)}: {out[-1]} (margin {margins[-1]:.4f})", flush=True)
        if len(out) < args.n:
            logits = model.forward([out[-1]], len(prompt) + len(out) - 1)
    print(f"{args.isa}: {out} ({time.time() - t0:.0f} s)")
    for name, fx in fixtures.items():
        ref = fx["chat"]["greedy_ids"] if args.chat else fx["greedy_ids"]
        same = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), len(out))
        print(f"  llama.cpp {name} fixture: the first {same} ids agree")


if __name__ == "__main__":
    main()
