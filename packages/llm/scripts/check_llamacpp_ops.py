"""Recompute llama.cpp's ops one at a time from its own inputs (a dump_llamacpp.py .npz) and say which are bit-exact.

Each of llama.cpp's nodes is recomputed in numpy from llama.cpp's dumped inputs with a model of its x86 kernels
written from ggml's source (the facts: summation orders, lane layouts, FMA, the vector exp), for a given SIMD width,
and compared with llama.cpp's dumped output: "exact" when every float32 agrees bit for bit, else the count of
differing values and the largest difference in units of the last place. The models:

- quantised matrix products (Q5_0/Q8_0 weights with Q8_0 activations, Q4_K/Q6_K with Q8_K): integer sums in 8
  lanes (lane m holds the elements e with e % 32 // 4 == m), each block's lane sums multiplied by the block's float
  scale and accumulated with an FMA per block, then the 8 lanes summed as (l0+l4 + l2+l6) + (l1+l5 + l3+l7);
  Q4_K's minimums in 4 more lanes (pairs of sub-blocks), summed (m0+m2) + (m1+m3) and added last.
- float16 dot products (attention scores, attention-weighted values): 4 accumulators of `width` lanes, element i in
  accumulator i // width % 4, lane i % width; accumulators (a0+a2) + (a1+a3); lanes by ggml's reduction of that
  width (8: (l0+l4 + l1+l5) + (l2+l6 + l3+l7); 16: halves, then quarters, then (0+2) + (1+3)).
- softmax: ggml's vector expf (a degree-5 polynomial of the reduced argument, FMAs), summed in chunks of `width`
  (each chunk summed as a tree in float32, the chunk sums added in float64), scaled by float32(1 / sum).
- RMS norm: a float64 sum of float32 squares, mean rounded to float32, 1 / sqrtf(mean + eps).
- RoPE: angles p * theta_scale^i with theta_scale = powf(base, -2 / d) multiplied up in float32, cosf/sinf.

    .venv/bin/python packages/llm/scripts/check_llamacpp_ops.py /tmp/lc.npz --steps 1 2 --width 8
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

import numpy as np

F32, F64 = np.float32, np.float64


def hexf(text: str) -> np.float32:
    """A float32 constant written in C's hexadecimal notation."""
    return F32(float.fromhex(text))


def fma(a: Any, b: Any, c: Any) -> np.ndarray:
    """float32 fused multiply-add (the product is exact in float64; one rounding to float64, then to float32)."""
    return (np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F32)


def hsum8(x: np.ndarray) -> np.ndarray:
    """ggml's hsum_float_8 over the last axis (8 lanes): (l0+l4 + l2+l6) + (l1+l5 + l3+l7)."""
    r = (x[..., 4:] + x[..., :4]).astype(F32)
    r = (r[..., :2] + r[..., 2:]).astype(F32)
    return (r[..., 0] + r[..., 1]).astype(F32)


def reduce_lanes(x: np.ndarray, width: int) -> np.ndarray:
    """ggml's GGML_F32x8_REDUCE / _mm512_reduce_add_ps of one vector (last axis, `width` lanes) to a float32."""
    if width == 8:  # t = lo + hi, then hadd twice: (t0+t1) + (t2+t3)
        t = (x[..., :4] + x[..., 4:]).astype(F32)
        return ((t[..., 0] + t[..., 1]).astype(F32) + (t[..., 2] + t[..., 3]).astype(F32)).astype(F32)
    while x.shape[-1] > 2:  # halves: 16 -> 8 -> 4 -> 2, then the last two
        h = x.shape[-1] // 2
        x = (x[..., :h] + x[..., h:]).astype(F32)
    return (x[..., 0] + x[..., 1]).astype(F32)


# ---- activation quantisation (ggml's quantize_row_q8_0 / q8_K): integer quants and float scales ----
def q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = x.astype(F32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(-1)
    d = (amax / F32(127)).astype(np.float16).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    return np.rint((b * inv[..., None]).astype(F32)).astype(np.int64), d


def q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = x.astype(F32).reshape(*x.shape[:-1], -1, 256)
    j = np.abs(b).argmax(-1)
    big = np.take_along_axis(b, j[..., None], -1)[..., 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(big != 0, F32(-127) / big, F32(0)).astype(F32)
    q = np.minimum(np.rint((iscale[..., None] * b).astype(F32)), 127).astype(np.int64)
    with np.errstate(divide="ignore"):
        d = np.where(iscale != 0, F32(1) / iscale, F32(0)).astype(F32)
    return q, d


# ---- weights as integers and scales (from xgrad_llm's affine decoders) ----
class Weights:
    def __init__(self, path: str) -> None:
        from xgrad_llm.gguf import open_gguf

        self.file = open_gguf(path)
        self.cache: dict[str, dict[str, np.ndarray]] = {}

    def get(self, name: str) -> dict[str, np.ndarray]:
        if name not in self.cache:
            self.cache[name] = self._load(name)
        return self.cache[name]

    def _load(self, name: str) -> dict[str, np.ndarray]:
        from xgrad_llm.quants import AFFINE, BLOCK_SIZES, GGMLType

        info = self.file.tensors[name]
        kind = GGMLType(info.type)
        if kind == GGMLType.F32:
            return {"type": np.array(0), "w": self.file.tensor(name, "CPU").numpy()}
        rows, cols = info.shape
        block, size = BLOCK_SIZES[kind]
        raw = self.file.raw(name).to("CPU").reshape(-1, size)
        aff = AFFINE[kind](raw)
        q = aff.q.numpy().astype(np.int16).reshape(rows, cols // block, block)
        scale = aff.scale.numpy().reshape(rows, cols // block, -1)
        d = raw[:, _d_at(kind) : _d_at(kind) + 2].contiguous().numpy().view(np.float16).astype(F32)
        d = d.reshape(rows, cols // block)
        out = {"type": np.array(int(kind)), "q": q, "d": d}
        with np.errstate(divide="ignore", invalid="ignore"):
            out["sc"] = np.where(d[..., None] != 0, scale / d[..., None], 0).round().astype(np.int16)
        if kind == GGMLType.Q4_K:
            dmin = raw[:, 2:4].contiguous().numpy().view(np.float16).astype(F32).reshape(rows, cols // block)
            off = -aff.offset.numpy().reshape(rows, cols // block, -1)  # type: ignore[union-attr]
            with np.errstate(divide="ignore", invalid="ignore"):
                out["m"] = np.where(dmin[..., None] != 0, off / dmin[..., None], 0).round().astype(np.int16)
            out["dmin"] = dmin
        return out


def _d_at(kind: int) -> int:
    from xgrad_llm.quants import GGMLType

    return {GGMLType.Q6_K: 208}.get(GGMLType(kind), 0)


def lanes_of(block: int) -> np.ndarray:
    """Lane (0-7) of each element of a block: e % 32 // 4."""
    return (np.arange(block) % 32) // 4


def lane_sums(p: np.ndarray) -> np.ndarray:
    """Integer products p (..., block) summed per lane: (..., 8)."""
    block = p.shape[-1]
    return p.reshape(*p.shape[:-1], block // 32, 8, 4).sum((-3, -1))


def matvec(w: dict[str, np.ndarray], x: np.ndarray, rows: int = 8192) -> np.ndarray:
    """llama.cpp's vec_dot of every row of quantised weight w with activation x (K,): (N,) float32, `rows` at a
    time."""
    n = w["q"].shape[0]
    parts = []
    for r in range(0, n, rows):
        parts.append(_matvec({k: v if v.ndim == 0 else v[r : r + rows] for k, v in w.items()}, x))
    return np.concatenate(parts)


def _matvec(w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    from xgrad_llm.quants import GGMLType

    kind = GGMLType(int(w["type"]))
    if kind == GGMLType.F32:
        raise NotImplementedError("F32 matrices")
    if kind in (GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0):
        qx, dx = q8_0(x)  # (nb, 32), (nb,)
        isum = lane_sums(w["q"].astype(np.int32) * qx[None]).astype(F32)  # (N, nb, 8), exact
        d = (w["d"] * dx[None]).astype(F32)  # (N, nb), exact
        acc = np.zeros((w["q"].shape[0], 8), F32)
        for b in range(isum.shape[1]):
            acc = fma(d[:, b, None], isum[:, b], acc)
        return hsum8(acc)
    qx, dx = q8_k(x)  # (nb, 256), (nb,)
    n, nb, _ = w["q"].shape
    sc = np.repeat(w["sc"].astype(np.int32), 256 // w["sc"].shape[-1], -1)  # per element
    if kind == GGMLType.Q6_K:  # ggml sums sc * q6 * q8 (q6 unsigned, q + 32) in the lanes, and subtracts 32 * sc * q8
        # summed over elements 32m..32m+31 from lane m (its block sums of 16, two per lane)
        scq8 = (sc * qx[None]).reshape(n, nb, 8, 32).sum(-1)
        isum = lane_sums(sc * (w["q"].astype(np.int32) + 32) * qx[None]) - 32 * scq8
    else:
        isum = lane_sums(sc * w["q"].astype(np.int32) * qx[None])  # (N, nb, 8)
    isum = isum.astype(F32)  # cvtepi32_ps (values < 2^24 here)
    d = (dx[None] * w["d"]).astype(F32)
    acc = np.zeros((n, 8), F32)
    for b in range(nb):
        acc = fma(d[:, b, None], isum[:, b], acc)
    out = hsum8(acc)
    if kind == GGMLType.Q4_K:
        dmin = (-dx[None] * w["dmin"]).astype(F32)
        bs = qx.reshape(nb, 8, 32).sum(-1)  # (nb, 8) q8 sums per sub-block
        prod = (w["m"].astype(np.int64) * bs[None]).reshape(n, nb, 4, 2).sum(-1).astype(F32)  # (N, nb, 4)
        accm = np.zeros((n, 4), F32)
        for b in range(nb):
            accm = fma(dmin[:, b, None], prod[:, b], accm)
        r = (accm[:, :2] + accm[:, 2:]).astype(F32)
        out = (out + (r[:, 0] + r[:, 1]).astype(F32)).astype(F32)
    elif kind != GGMLType.Q6_K:
        raise NotImplementedError(kind.name)
    return out


def f16_dot(x: np.ndarray, y: np.ndarray, width: int) -> np.ndarray:
    """ggml_vec_dot_f16 over the last axis of float16 x and y (broadcast), `width` lanes, 4 accumulators."""
    x, y = np.broadcast_arrays(x.astype(F32), y.astype(F32))
    n = x.shape[-1]
    step = 4 * width
    assert n % step == 0
    p = (x * y).astype(F32).reshape(*x.shape[:-1], n // step, 4, width)  # exact products
    acc = np.zeros(p.shape[:-3] + (4, width), F32)
    for j in range(p.shape[-3]):
        acc = (acc + p[..., j, :, :]).astype(F32)
    a = ((acc[..., 0, :] + acc[..., 2, :]).astype(F32) + (acc[..., 1, :] + acc[..., 3, :]).astype(F32)).astype(F32)
    return reduce_lanes(a, width)


def expf_terms(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What both x86 forms of ggml_v_expf share, in float32: z = x / ln 2 + 1.5 * 2^23 (its low bits hold n), n the
    nearest integer to x / ln 2, b = x - n ln 2 (two FMAs), u = b * b and the polynomial's high part."""
    x = x.astype(F32)
    r = hexf("0x1.8p23")
    z = fma(x, hexf("0x1.715476p0"), r)
    n = (z - r).astype(F32)
    b = fma(-n, hexf("0x1.7F7D1Cp-20"), fma(-n, hexf("0x1.62E4p-1"), x))
    u = (b * b).astype(F32)
    odd = fma(hexf("0x1.0E4020p-7"), b, hexf("0x1.573E2Ep-5"))
    hi = fma(odd, u, fma(hexf("0x1.555E66p-3"), b, hexf("0x1.FFFDB6p-2")))
    return z, n, b, u, hi


def v_expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf (x86), elementwise in float32."""
    z, n, b, u, hi = expf_terms(x)
    e = (z.view(np.uint32) << np.uint32(23)).astype(np.uint32)
    k = (e + np.float32(1).view(np.uint32)).astype(np.uint32).view(F32)
    c = np.abs(n) > 126
    j = fma(hi, u, (hexf("0x1.FFFFECp-1") * b).astype(F32))
    plain = fma(j, k, k)
    if not c.any():
        return plain
    g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0)).astype(np.uint32)
    s1 = (g + np.uint32(0x7F000000)).astype(np.uint32).view(F32)
    s2 = (e - g).astype(np.uint32).view(F32)
    dd = np.abs(n) > 192
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        big = (fma(s2, j, s2) * s1).astype(F32)
        return np.where(dd, (s1 * s1).astype(F32), np.where(c, big, plain))


def soft_max(x: np.ndarray, width: int) -> np.ndarray:
    """ggml's soft_max_f32 of rows x (..., n) (the mask already added), `width`-lane exp chunks."""
    mx = x.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        y = v_expf((x - mx).astype(F32))
    n = x.shape[-1]
    chunks = y.reshape(*y.shape[:-1], n // width, width)
    part = hsum8(chunks) if width == 8 else reduce_lanes(chunks, width)
    total = np.zeros(x.shape[:-1], F64)
    for c in range(part.shape[-1]):
        total = total + part[..., c].astype(F64)
    scale = (1.0 / total).astype(F32)
    return (y * scale[..., None]).astype(F32)


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    s = np.zeros(x.shape[:-1], F64)
    sq = (x * x).astype(F32)
    for i in range(x.shape[-1]):
        s = s + sq[..., i].astype(F64)
    mean = (s / x.shape[-1]).astype(F32)
    scale = (F32(1) / np.sqrt((mean + F32(eps)).astype(F32)).astype(F32)).astype(F32)
    return (x * scale[..., None]).astype(F32)


def _libm() -> Any:
    import ctypes
    import ctypes.util

    lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    for fn, args in (("cosf", 1), ("sinf", 1), ("powf", 2)):
        getattr(lib, fn).restype = ctypes.c_float
        getattr(lib, fn).argtypes = [ctypes.c_float] * args
    return lib


def rope_neox(x: np.ndarray, pos: int, base: float) -> np.ndarray:
    """x (..., heads, d) rotated for position pos, halves, as ggml's rope: the angle p * theta_scale^i multiplied up
    in float32 from theta_scale = powf(base, -2 / d), the C library's cosf/sinf of it, and the rotation
    x0 * cos - x1 * sin as fma(x0, cos, -(x1 * sin)) (the compiler's contraction), x0 * sin + x1 * cos likewise."""
    libm = _libm()
    d = x.shape[-1]
    theta_scale = F32(libm.powf(F32(base), F32(-2.0) / F32(d)))
    theta = F32(pos)
    cos, sin = np.empty(d // 2, F32), np.empty(d // 2, F32)
    for i in range(d // 2):
        cos[i] = libm.cosf(theta)
        sin[i] = libm.sinf(theta)
        theta = F32(theta * theta_scale)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([fma(a, cos, -(b * sin).astype(F32)), fma(a, sin, (b * cos).astype(F32))], -1)


def gelu_table() -> np.ndarray:
    """ggml's float16 GELU table, indexed by the bits of a float16 (xgrad_llm.numerics.gelu_f16 reproduces it; the
    tests check it against libggml-cpu's)."""
    from xgrad import Tensor
    from xgrad_llm.numerics import gelu_f16

    xs = np.arange(65536, dtype=np.uint16).view(np.float16).astype(F32)
    xs = np.where(np.isfinite(xs), xs, F32(0))
    return gelu_f16(Tensor(xs)).numpy().astype(np.float16)


_GELU: list[np.ndarray] = []


def geglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml's GEGLU with the float16 table: gelu(g) * u, gelu(g) = 0 for g <= -10, g for g >= 10."""
    if not _GELU:
        _GELU.append(gelu_table())
    t = _GELU[0][g.astype(np.float16).view(np.uint16)].astype(F32)
    act = np.where(g <= -10, F32(0), np.where(g >= 10, g, t))
    return (act * u).astype(F32)


def tiny_dot(x: np.ndarray, y: np.ndarray, width: int) -> np.ndarray:
    """llamafile's tinyBLAS dot of float16 rows (prompt processing): one accumulator of `width` lanes over the row in
    chunks of `width`, then summed as hsum_float_8 (8 lanes) or _mm512_reduce_add_ps (16)."""
    x, y = np.broadcast_arrays(x.astype(F32), y.astype(F32))
    n = x.shape[-1]
    p = (x * y).astype(F32).reshape(*x.shape[:-1], n // width, width)
    acc = np.zeros(p.shape[:-2] + (width,), F32)
    for j in range(p.shape[-2]):
        acc = (acc + p[..., j, :]).astype(F32)
    return hsum8(acc) if width == 8 else reduce_lanes(acc, width)


def report(what: str, ours: np.ndarray, theirs: np.ndarray, tally: dict[str, list[int]]) -> None:
    ours, theirs = ours.astype(F32).ravel(), theirs.astype(F32).ravel()
    bad = ours != theirs
    tally[what.split("-")[0]].append(int(bad.sum()))
    if bad.any():
        ulp = np.abs(ours.view(np.int32).astype(np.int64) - theirs.view(np.int32).astype(np.int64))
        print(f"  {what}: {bad.sum()}/{bad.size} differ, up to {ulp.max()} ulp")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dump", help=".npz from dump_llamacpp.py")
    p.add_argument("--steps", type=int, nargs="+", default=[1], help="decode steps to check (>= 1)")
    p.add_argument("--width", type=int, default=8, help="SIMD lanes of float32 (8: AVX2, 16: AVX-512)")
    p.add_argument("--prompt-len", type=int, default=6, help="tokens of the prompt (position of step 1)")
    p.add_argument("--model", default=None)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    from xgrad_llm.cli import default_model

    z = np.load(args.dump)
    meta = json.loads(bytes(z["meta"]))
    wts = Weights(str(args.model or default_model()))
    eps = 1e-6
    tally: dict[str, list[int]] = defaultdict(list)
    for step in args.steps:
        first = args.prompt_len + step - 1 if step else 0
        print(f"step {step} (position {first}{'' if step else f'..{args.prompt_len - 1}'}):")
        for key, m in meta.items():
            if not key.startswith(f"{step}/") or key not in z.files:
                continue
            name = key.split("/", 2)[2]
            src = m["src"]
            layer = int(name.rsplit("-", 1)[1]) if "-" in name and name.rsplit("-", 1)[1].isdigit() else -1
            if m["op"] == "MUL_MAT" and src[0].endswith(".weight"):
                x = z[src[1]].reshape(-1, z[src[1]].shape[-1])
                ours = np.stack([matvec(wts.get(src[0]), row) for row in x])
                report(f"{name}({src[0].split('.')[-2]})", ours, z[key], tally)
            elif m["op"] == "RMS_NORM":
                report(name, rms_norm(z[src[0]], eps), z[key], tally)
            elif m["op"] == "ROPE":
                base = 10000.0 if layer % 6 != 5 else 1e6
                x = z[src[0]].reshape(-1, *z[src[0]].shape[-2:])  # (tokens, heads, d)
                ours = np.stack([rope_neox(row, first + t, base) for t, row in enumerate(x)])
                report(name, ours, z[key], tally)
            elif m["op"] == "GLU":
                report(name, geglu(z[src[0]], z[src[1]]), z[key], tally)
            elif m["op"] == "MUL_MAT" and name.startswith(("kq-", "kqv-")):
                a = z[src[0]]  # (n, k) float16: keys (n_kv, hd) or values (vd, n_kv)
                b = z[src[1]]
                b = b.reshape(b.shape[-3], -1, b.shape[-1]).astype(np.float16)  # (heads, tokens, k)
                dot = f16_dot if b.shape[1] == 1 else tiny_dot
                ours = dot(a[None, None], b[:, :, None, :], args.width)
                report(name, ours, z[key].reshape(ours.shape), tally)
            elif m["op"] == "SOFT_MAX":
                x = z[src[0]].reshape(4, -1, z[src[0]].shape[-1])  # (heads, tokens, n_kv)
                rows = first + np.arange(x.shape[1])[:, None]
                mask = np.where(np.arange(x.shape[-1])[None] <= rows, F32(0), F32(-np.inf)).astype(F32)
                report(name, soft_max((x + mask).astype(F32), args.width), z[key].reshape(x.shape), tally)
            elif args.verbose:
                print(f"  (not checked: {name} {m['op']})")
    print(
        "ops with any difference, per kind: "
        + ", ".join(f"{k} {sum(1 for c in v if c)}/{len(v)}" for k, v in tally.items())
    )


if __name__ == "__main__":
    main()
