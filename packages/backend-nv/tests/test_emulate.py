"""The PTX interpreter, instruction class by instruction class, on hand-written PTX, against values worked out with
numpy (one thread per element: thread i reads a[i], b[i], c[i] and writes out[i])."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from xgrad_nv.emulate import DeviceMemory, EmulatorError, load_ptx

HEAD = """
.version 7.8
.target sm_80
.address_size 64
"""

ELEMENTWISE = (
    HEAD
    + """
.visible .entry k(.param .u64 po, .param .u64 pa, .param .u64 pb, .param .u64 pc)
{
  .reg .pred %p<8>;
  .reg .b16 %h<16>;
  .reg .b32 %r<16>;
  .reg .b64 %rd<16>;
  .reg .f32 %f<16>;
  .reg .f64 %fd<8>;
  ld.param.u64 %rd1, [po];
  ld.param.u64 %rd2, [pa];
  ld.param.u64 %rd3, [pb];
  ld.param.u64 %rd4, [pc];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mad.lo.u32 %r0, %r2, %r3, %r1;
  mul.wide.u32 %rd5, %r0, {sa};
  add.s64 %rd6, %rd2, %rd5;
  add.s64 %rd7, %rd3, %rd5;
  add.s64 %rd8, %rd4, %rd5;
  mul.wide.u32 %rd9, %r0, {so};
  add.s64 %rd10, %rd1, %rd9;
  ld.global.{ta} {A}, [%rd6];
  ld.global.{ta} {B}, [%rd7];
  ld.global.{ta} {C}, [%rd8];
  {body}
  st.global.{to} [%rd10], {D};
  ret;
}
"""
)
REG = {"u32": "%r", "s32": "%r", "b32": "%r", "f32": "%f", "u64": "%rd", "s64": "%rd", "f64": "%fd", "b16": "%h"}
REG.update({"u16": "%h", "s16": "%h", "f16": "%h"})


def run(body: str, ta: str, to: str, a: np.ndarray, b: np.ndarray, c: np.ndarray, out_dtype: Any) -> np.ndarray:
    """Run `body` (registers A, B, C in; D out) over the elements of a, b, c."""
    ra, ro = REG[ta], REG[to]
    regs = {"A": f"{ra}11", "B": f"{ra}12", "C": f"{ra}13", "D": f"{ro}14"}
    fields = {**regs, "sa": str(a.itemsize), "so": str(np.dtype(out_dtype).itemsize), "ta": ta, "to": to}
    text = ELEMENTWISE
    for k, v in fields.items():
        text = text.replace("{" + k + "}", v)
    text = text.replace("{body}", re.sub(r"\b([ABCD])\b", lambda m: regs[m.group(1)], body))
    mem = DeviceMemory()
    n = a.size
    threads = -(-n // 64) * 64  # whole blocks of 64: the inputs are padded with their first element
    bufs = []
    for arr in (a, b, c):
        padded = np.concatenate([arr, np.repeat(arr[:1], threads - n)])
        addr = mem.alloc(padded.nbytes)
        mem.write(addr, padded)
        bufs.append(addr)
    out = mem.alloc(threads * np.dtype(out_dtype).itemsize)
    load_ptx(text).launch("k", (threads // 64, 1, 1), (64, 1, 1), [out, *bufs], mem)
    return np.frombuffer(mem.read(out, n * np.dtype(out_dtype).itemsize), out_dtype)


RNG = np.random.default_rng(0)
S32 = np.concatenate([RNG.integers(-(2**31), 2**31, 120), [0, 1, -1, 2**31 - 1, -(2**31), 7, -7, 3]]).astype(np.int32)
S32B = np.concatenate([RNG.integers(-(2**31), 2**31, 120), [1, -1, 0, -1, 3, -2, 2, -3]]).astype(np.int32)
U32 = S32.view(np.uint32)
U32B = S32B.view(np.uint32)


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    safe = np.where(b64 == 0, 1, b64)
    q = np.abs(a64) // np.abs(safe) * np.sign(a64) * np.sign(safe)
    return q


INT_CASES: list[tuple[str, str, Callable[..., np.ndarray]]] = [
    ("add.s32 D, A, B;", "s32", lambda a, b, c: a.astype(np.int64) + b),
    ("sub.s32 D, A, B;", "s32", lambda a, b, c: a.astype(np.int64) - b),
    ("mul.lo.s32 D, A, B;", "s32", lambda a, b, c: a.astype(np.int64) * b),
    ("mul.hi.s32 D, A, B;", "s32", lambda a, b, c: (a.astype(np.int64) * b) >> 32),
    ("mul.hi.u32 D, A, B;", "u32", lambda a, b, c: (a.astype(np.uint64) * b) >> np.uint64(32)),
    ("mad.lo.s32 D, A, B, C;", "s32", lambda a, b, c: a.astype(np.int64) * b + c),
    ("min.s32 D, A, B;", "s32", lambda a, b, c: np.minimum(a, b)),
    ("max.u32 D, A, B;", "u32", lambda a, b, c: np.maximum(a, b)),
    ("abs.s32 D, A;", "s32", lambda a, b, c: np.abs(a.astype(np.int64))),
    ("neg.s32 D, A;", "s32", lambda a, b, c: -a.astype(np.int64)),
    ("and.b32 D, A, B;", "u32", lambda a, b, c: a & b),
    ("or.b32 D, A, B;", "u32", lambda a, b, c: a | b),
    ("xor.b32 D, A, B;", "u32", lambda a, b, c: a ^ b),
    ("not.b32 D, A;", "u32", lambda a, b, c: ~a),
    ("and.b32 %r5, B, 63;\n shl.b32 D, A, %r5;", "u32", lambda a, b, c: np.where(b % 64 >= 32, 0, a << (b % 64 % 32))),
    ("and.b32 %r5, B, 63;\n shr.u32 D, A, %r5;", "u32", lambda a, b, c: np.where(b % 64 >= 32, 0, a >> (b % 64 % 32))),
    (
        "and.b32 %r5, B, 63;\n shr.s32 D, A, %r5;",
        "s32",
        lambda a, b, c: a.astype(np.int64) >> np.minimum(b.view(np.uint32) % 64, 31),
    ),
    ("popc.b32 D, A;", "u32", lambda a, b, c: np.array([bin(int(x)).count("1") for x in a])),
    ("clz.b32 D, A;", "u32", lambda a, b, c: np.array([32 - int(x).bit_length() for x in a])),
    ("brev.b32 D, A;", "u32", lambda a, b, c: np.array([int(f"{int(x):032b}"[::-1], 2) for x in a])),
    ("bfe.u32 D, A, 5, 11;", "u32", lambda a, b, c: (a >> 5) & 0x7FF),
    ("bfe.s32 D, A, 4, 8;", "s32", lambda a, b, c: ((a.astype(np.int64) >> 4) & 0xFF) - (((a >> 11) & 1) << 8)),
    ("bfi.b32 D, A, B, 8, 12;", "u32", lambda a, b, c: (b & ~np.uint32(0xFFF00)) | ((a << 8) & np.uint32(0xFFF00))),
    ("lop3.b32 D, A, B, C, 0xE8;", "u32", lambda a, b, c: (a & b) | (b & c) | (a & c)),  # majority
    ("shf.l.wrap.b32 D, A, B, 7;", "u32", lambda a, b, c: ((b.astype(np.uint64) << 7) | (a >> 25)) & 0xFFFFFFFF),
    ("shf.r.clamp.b32 D, A, B, 9;", "u32", lambda a, b, c: ((a >> 9) | (b.astype(np.uint64) << 23)) & 0xFFFFFFFF),
    (
        "prmt.b32 D, A, B, 0x7531;",
        "u32",
        lambda a, b, c: np.array(
            [
                int.from_bytes(
                    bytes([(int(y) << 32 | int(x)).to_bytes(8, "little")[k] for k in (1, 3, 5, 7)]), "little"
                )
                for x, y in zip(a, b, strict=True)
            ]
        ),
    ),
]


def _s24(x: np.ndarray) -> np.ndarray:
    v = x.astype(np.int64) & 0xFFFFFF
    return v - ((v >> 23) << 24)


def _dot(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, width: int, signed_a: bool, signed_b: bool, hi: bool
) -> list[int]:
    out = []
    for x, y, z in zip(a.tolist(), b.tolist(), c.tolist(), strict=True):
        xs = (x & 0xFFFFFFFF).to_bytes(4, "little")
        ys = (y & 0xFFFFFFFF).to_bytes(4, "little")
        n = 4 // (width // 8)
        xa = [int.from_bytes(xs[k * width // 8 : (k + 1) * width // 8], "little", signed=signed_a) for k in range(n)]
        yb = [int.from_bytes(ys[k : k + 1], "little", signed=signed_b) for k in range(4)]
        yb = yb if width == 8 else yb[2:] if hi else yb[:2]
        out.append(z + sum(p * q for p, q in zip(xa, yb, strict=False)))
    return out


INT_CASES += [
    ("mul24.lo.s32 D, A, B;", "s32", lambda a, b, c: _s24(a) * _s24(b)),
    ("mul24.hi.u32 D, A, B;", "u32", lambda a, b, c: ((a.astype(np.int64) & 0xFFFFFF) * (b & 0xFFFFFF)) >> 16),
    ("mad24.lo.s32 D, A, B, C;", "s32", lambda a, b, c: _s24(a) * _s24(b) + c),
    ("dp4a.s32.u32 D, A, B, C;", "s32", lambda a, b, c: np.array(_dot(a, b, c, 8, True, False, False))),
    ("dp4a.u32.u32 D, A, B, C;", "u32", lambda a, b, c: np.array(_dot(a, b, c, 8, False, False, False))),
    ("dp2a.hi.s32.s32 D, A, B, C;", "s32", lambda a, b, c: np.array(_dot(a, b, c, 16, True, True, True))),
    ("dp2a.lo.u32.s32 D, A, B, C;", "s32", lambda a, b, c: np.array(_dot(a, b, c, 16, False, True, False))),
]


@pytest.mark.parametrize(("body", "t", "want"), INT_CASES, ids=[c[0].split()[0] + c[1] for c in INT_CASES])
def test_integer_instruction_matches_numpy(body: str, t: str, want: Callable[..., np.ndarray]) -> None:
    a, b, c = (S32, S32B, S32[::-1].copy()) if t == "s32" else (U32, U32B, U32[::-1].copy())
    got = run(body, t, t, a, b, c, np.uint32 if t == "u32" else np.int32)
    np.testing.assert_array_equal(got, np.asarray(want(a, b, c)).astype(np.int64).astype(got.dtype))


def test_integer_division_truncates_toward_zero() -> None:
    b = np.where(S32B == 0, 5, S32B).astype(np.int32)
    q = run("div.s32 D, A, B;", "s32", "s32", S32, b, b, np.int32)
    r = run("rem.s32 D, A, B;", "s32", "s32", S32, b, b, np.int32)
    want_q = _trunc_div(S32, b)
    np.testing.assert_array_equal(q, want_q.astype(np.int32))
    np.testing.assert_array_equal(r, (S32.astype(np.int64) - want_q * b).astype(np.int32))


def test_wide_and_64_bit_multiplies() -> None:
    got = run("mul.wide.s32 %rd14, A, B;", "s32", "s64", S32, S32B, S32B, np.int64)
    np.testing.assert_array_equal(got, S32.astype(np.int64) * S32B)
    a64 = RNG.integers(-(2**63), 2**63, 64, dtype=np.int64)
    b64 = RNG.integers(-(2**63), 2**63, 64, dtype=np.int64)
    hi = run("mul.hi.s64 D, A, B;", "s64", "s64", a64, b64, b64, np.int64)
    want = [(int(x) * int(y)) >> 64 for x, y in zip(a64, b64, strict=True)]
    np.testing.assert_array_equal(hi, np.array(want, np.int64))
    hu = run("mul.hi.u64 D, A, B;", "u64", "u64", a64.view(np.uint64), b64.view(np.uint64), b64, np.uint64)
    want_u = [(int(x) * int(y)) >> 64 for x, y in zip(a64.view(np.uint64), b64.view(np.uint64), strict=True)]
    np.testing.assert_array_equal(hu, np.array(want_u, np.uint64))


F = np.concatenate([RNG.standard_normal(100) * 10, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3.5, -2.5]]).astype(
    np.float32
)
FB = np.concatenate([RNG.standard_normal(100), [np.nan, 1.0, -np.inf, 2.0, 0.5, 1e30, -0.0, 7.0]]).astype(np.float32)

FLOAT_CASES: list[tuple[str, Callable[..., np.ndarray]]] = [
    ("add.rn.f32 D, A, B;", lambda a, b, c: a + b),
    ("sub.f32 D, A, B;", lambda a, b, c: a - b),
    ("mul.rn.f32 D, A, B;", lambda a, b, c: a * b),
    ("div.rn.f32 D, A, B;", lambda a, b, c: a / b),
    ("fma.rn.f32 D, A, B, C;", lambda a, b, c: (a.astype(np.float64) * b + c).astype(np.float32)),
    ("min.f32 D, A, B;", lambda a, b, c: np.fmin(a, b)),
    ("max.NaN.f32 D, A, B;", lambda a, b, c: np.maximum(a, b)),
    ("abs.f32 D, A;", lambda a, b, c: np.abs(a)),
    ("neg.f32 D, A;", lambda a, b, c: -a),
    ("sqrt.rn.f32 D, A;", lambda a, b, c: np.sqrt(a)),
    ("rcp.rn.f32 D, A;", lambda a, b, c: np.float32(1) / a),
    ("copysign.f32 D, A, B;", lambda a, b, c: np.copysign(b, a)),
    ("cvt.rni.f32.f32 D, A;", lambda a, b, c: np.rint(a)),
    ("cvt.rmi.f32.f32 D, A;", lambda a, b, c: np.floor(a)),
    ("cvt.sat.f32.f32 D, A;", lambda a, b, c: np.nan_to_num(np.clip(a, 0, 1), nan=0.0)),
]


@pytest.mark.parametrize(("body", "want"), FLOAT_CASES, ids=[c[0].split()[0] for c in FLOAT_CASES])
def test_float_instruction_matches_numpy_exactly(body: str, want: Callable[..., np.ndarray]) -> None:
    with np.errstate(all="ignore"):
        expect = np.asarray(want(F, FB, FB[::-1].copy()), np.float32)
    got = run(body, "f32", "f32", F, FB, FB[::-1].copy(), np.float32)
    np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize(
    ("body", "want", "rtol"),
    [
        ("ex2.approx.ftz.f32 D, A;", np.exp2, 2e-7),
        ("lg2.approx.f32 D, A;", np.log2, 2e-7),
        ("sin.approx.f32 D, A;", np.sin, 2e-6),
        ("cos.approx.f32 D, A;", np.cos, 2e-6),
        ("rsqrt.approx.f32 D, A;", lambda x: 1 / np.sqrt(x), 2e-7),
        ("tanh.approx.f32 D, A;", np.tanh, 2e-6),
    ],
)
def test_approximate_functions_within_float32_precision(body: str, want: Callable[..., Any], rtol: float) -> None:
    x = np.linspace(0.1, 6.0, 64).astype(np.float32)
    got = run(body, "f32", "f32", x, x, x, np.float32)
    np.testing.assert_allclose(got, want(x.astype(np.float64)), rtol=rtol, atol=1e-7)


SETP = ["eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"]


@pytest.mark.parametrize("cmp", SETP)
def test_setp_float_comparisons_order_nan_as_the_isa_says(cmp: str) -> None:
    got = run(f"setp.{cmp}.f32 %p1, A, B;\n selp.u32 D, 1, 0, %p1;", "f32", "u32", F, FB, FB, np.uint32)
    a, b = F.astype(np.float64), FB.astype(np.float64)
    unordered = np.isnan(a) | np.isnan(b)
    base = cmp.rstrip("u") if cmp not in ("num", "nan") else cmp
    ordered = {
        "eq": a == b,
        "ne": a != b,
        "lt": a < b,
        "le": a <= b,
        "gt": a > b,
        "ge": a >= b,
        "num": ~unordered,
        "nan": unordered,
    }[base]
    if cmp in ("num", "nan"):
        want = ordered
    elif cmp.endswith("u") and cmp != "ltu" or cmp in ("ltu",):
        want = ordered | unordered
    else:
        want = ordered & ~unordered
    np.testing.assert_array_equal(got, want.astype(np.uint32))


def test_setp_boolean_combination_and_both_destinations() -> None:
    body = "setp.lt.s32 %p2, C, 0;\n setp.lt.and.s32 %p1|%p3, A, B, %p2;\n selp.u32 %r5, 2, 0, %p3;\n"
    body += " selp.u32 %r6, 1, 0, %p1;\n or.b32 D, %r5, %r6;"
    got = run(body, "s32", "u32", S32, S32B, S32[::-1].copy(), np.uint32)
    c = S32[::-1] < 0
    want = ((S32 < S32B) & c).astype(np.uint32) | (((S32 >= S32B) & c).astype(np.uint32) << 1)
    np.testing.assert_array_equal(got, want)


def test_cvt_float_to_int_rounds_saturates_and_maps_nan_to_zero() -> None:
    x = np.array([1.5, 2.5, -1.5, -2.5, 3e9, -3e9, np.nan, np.inf, -0.7, 0.7], np.float32)
    for mode, fn in (("rni", np.rint), ("rzi", np.trunc), ("rmi", np.floor), ("rpi", np.ceil)):
        got = run(f"cvt.{mode}.s32.f32 D, A;", "f32", "s32", x, x, x, np.int32)
        want = np.clip(np.nan_to_num(fn(x.astype(np.float64)), nan=0), -(2**31), 2**31 - 1).astype(np.int32)
        np.testing.assert_array_equal(got, want, err_msg=mode)
    got = run("cvt.rzi.u32.f32 D, A;", "f32", "u32", x, x, x, np.uint32)
    want_u = np.clip(np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0), 0, 2**32 - 1).astype(np.uint32)
    np.testing.assert_array_equal(got, want_u)


def test_cvt_to_half_and_bfloat16_rounds_as_numpy() -> None:
    x = (RNG.standard_normal(128) * 1000).astype(np.float32)
    got = run("cvt.rn.f16.f32 %h1, A;\n cvt.u32.u16 D, %h1;", "f32", "u32", x, x, x, np.uint32)
    np.testing.assert_array_equal(got, x.astype(np.float16).view(np.uint16))
    rz = run("cvt.rz.f16.f32 %h1, A;\n cvt.f32.f16 D, %h1;", "f32", "f32", x, x, x, np.float32)
    nearest = x.astype(np.float16).astype(np.float32)
    toward = np.where(np.abs(nearest) > np.abs(x), np.nextafter(x.astype(np.float16), np.float16(0)), nearest)
    np.testing.assert_array_equal(rz, toward.astype(np.float32))
    bf = run("cvt.rn.bf16.f32 %h1, A;\n mov.b32 D, {0, %h1};", "f32", "u32", x, x, x, np.uint32)
    u = x.view(np.uint32).astype(np.uint64)
    want_bf = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    np.testing.assert_array_equal(bf, want_bf.astype(np.uint32))


def test_cvt_integer_widths_extend_and_saturate() -> None:
    got = run("cvt.s8.s32 %h1, A;\n cvt.s32.s16 D, %h1;", "s32", "s32", S32, S32, S32, np.int32)
    np.testing.assert_array_equal(got, S32.astype(np.int8).astype(np.int32))
    sat = run("cvt.sat.u8.s32 %h1, A;\n cvt.u32.u16 D, %h1;", "s32", "u32", S32, S32, S32, np.uint32)
    np.testing.assert_array_equal(sat, np.clip(S32, 0, 255).astype(np.uint32))
    wide = run("cvt.s64.s32 D, A;", "s32", "s64", S32, S32, S32, np.int64)
    np.testing.assert_array_equal(wide, S32.astype(np.int64))
    f = run("cvt.rn.f32.s32 D, A;", "s32", "f32", S32, S32, S32, np.float32)
    np.testing.assert_array_equal(f, S32.astype(np.float32))


def test_half_arithmetic_rounds_once() -> None:
    a = (RNG.standard_normal(128) * 10).astype(np.float16)
    b = (RNG.standard_normal(128) * 10).astype(np.float16)
    for body, fn in (
        ("add.rn.f16 D, A, B;", lambda: a + b),
        ("mul.rn.f16 D, A, B;", lambda: a * b),
        ("fma.rn.f16 D, A, B, C;", lambda: (a.astype(np.float64) * b + a).astype(np.float16)),
    ):
        got = run(body, "f16", "f16", a, b, a, np.float16)
        np.testing.assert_array_equal(got, fn(), err_msg=body)


SPECIAL = (
    HEAD
    + """
.visible .entry ids(.param .u64 po)
{
  .reg .b32 %r<12>;
  .reg .b64 %rd<6>;
  ld.param.u64 %rd1, [po];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u32 %r1, %tid.x;  mov.u32 %r2, %tid.y;  mov.u32 %r3, %ntid.x;  mov.u32 %r4, %ntid.y;
  mov.u32 %r5, %ctaid.x;  mov.u32 %r6, %ctaid.y;  mov.u32 %r7, %nctaid.x;  mov.u32 %r10, %laneid;
  mad.lo.u32 %r8, %r2, %r3, %r1;          // thread in block
  mad.lo.u32 %r9, %r6, %r7, %r5;          // block in grid
  mul.lo.u32 %r11, %r3, %r4;
  mad.lo.u32 %r9, %r9, %r11, %r8;         // global linear id
  mul.wide.u32 %rd2, %r9, 8;
  add.s64 %rd3, %rd1, %rd2;
  shl.b32 %r10, %r10, 16;
  or.b32 %r10, %r10, %r8;
  st.global.v2.u32 [%rd3], {%r9, %r10};
  ret;
}
"""
)


def test_special_registers_over_a_2d_grid_of_2d_blocks() -> None:
    mem = DeviceMemory()
    grid, block = (3, 2, 1), (8, 6, 1)
    n = 3 * 2 * 8 * 6
    out = mem.alloc(8 * n)
    load_ptx(SPECIAL).launch("ids", grid, block, [out], mem)
    got = np.frombuffer(mem.read(out, 8 * n), np.uint32).reshape(n, 2)
    np.testing.assert_array_equal(got[:, 0], np.arange(n))
    tid = np.arange(n) % 48
    np.testing.assert_array_equal(got[:, 1], ((tid % 32) << 16) | tid)


MEMORY = (
    HEAD
    + """
.visible .entry mem(.param .u64 po, .param .u64 pa, .param .u32 n)
{
  .shared .align 16 .b8 tile[1024];
  .local .align 8 .b8 scratch[16];
  .reg .pred %p<4>;
  .reg .b32 %r<20>;
  .reg .b64 %rd<20>;
  .reg .f32 %f<12>;
  ld.param.u64 %rd1, [po];
  ld.param.u64 %rd2, [pa];
  ld.param.u32 %r19, [n];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd3, %r1, 16;
  add.s64 %rd4, %rd2, %rd3;
  ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd4];      // four floats per thread
  shl.b32 %r2, %r1, 4;
  mov.u32 %r3, tile;
  add.u32 %r4, %r3, %r2;
  st.shared.v2.f32 [%r4], {%f4, %f3};                  // reversed pairs into shared memory
  st.shared.v2.f32 [%r4+8], {%f2, %f1};
  bar.sync 0;
  sub.u32 %r5, 63, %r1;                                // read the mirror thread's slot
  shl.b32 %r6, %r5, 4;
  add.u32 %r7, %r3, %r6;
  cvta.shared.u64 %rd5, %rd5;
  cvt.u64.u32 %rd6, %r7;
  cvta.shared.u64 %rd6, %rd6;                          // a generic address of shared memory
  ld.f32 %f5, [%rd6];
  ld.shared.f32 %f6, [%r7+12];
  mov.u64 %rd7, scratch;
  cvta.local.u64 %rd8, %rd7;
  st.local.f32 [%rd7+4], %f5;
  ld.f32 %f7, [%rd8+4];                                // through the generic window of local memory
  add.f32 %f8, %f7, %f6;
  cvt.rn.f32.u32 %f9, %r19;
  add.f32 %f8, %f8, %f9;
  mul.wide.u32 %rd9, %r1, 4;
  add.s64 %rd10, %rd1, %rd9;
  st.global.f32 [%rd10], %f8;
  ret;
}
"""
)


def test_vector_shared_local_generic_and_param_memory() -> None:
    mem = DeviceMemory()
    a = RNG.standard_normal((64, 4)).astype(np.float32)
    pa = mem.alloc(a.nbytes)
    mem.write(pa, a)
    out = mem.alloc(64 * 4)
    load_ptx(MEMORY).launch("mem", (1, 1, 1), (64, 1, 1), [out, pa, 5], mem)
    mirror = a[::-1]
    want = mirror[:, 3] + mirror[:, 0] + np.float32(5)
    np.testing.assert_array_equal(np.frombuffer(mem.read(out, 256), np.float32), want)


ATOMICS = (
    HEAD
    + """
.visible .entry atom(.param .u64 pcount, .param .u64 psum, .param .u64 pold)
{
  .shared .align 4 .b8 s[4];
  .reg .pred %p<2>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<12>;
  .reg .f32 %f<4>;
  ld.param.u64 %rd1, [pcount];
  ld.param.u64 %rd2, [psum];
  ld.param.u64 %rd3, [pold];
  mov.u32 %r1, %tid.x;
  setp.eq.u32 %p1, %r1, 0;
  @%p1 st.shared.u32 [s], 0;
  bar.sync 0;
  and.b32 %r2, %r1, 3;                  // four counters, each hit by a quarter of the threads
  mul.wide.u32 %rd4, %r2, 4;
  add.s64 %rd5, %rd1, %rd4;
  atom.global.add.u32 %r3, [%rd5], 1;
  atom.shared.max.s32 %r4, [s], %r1;
  cvt.rn.f32.u32 %f1, %r1;
  red.global.add.f32 [%rd2], %f1;
  mul.wide.u32 %rd6, %r1, 4;
  add.s64 %rd7, %rd3, %rd6;
  st.global.u32 [%rd7], %r3;
  bar.sync 0;
  @%p1 ld.shared.u32 %r5, [s];
  @%p1 atom.global.exch.b32 %r6, [%rd1+16], %r5;
  ret;
}
"""
)


def test_atomics_take_turns_on_one_address() -> None:
    mem = DeviceMemory()
    count = mem.alloc(20)
    total = mem.alloc(4)
    old = mem.alloc(4 * 128)
    load_ptx(ATOMICS).launch("atom", (1, 1, 1), (128, 1, 1), [count, total, old], mem)
    np.testing.assert_array_equal(np.frombuffer(mem.read(count, 20), np.uint32), [32, 32, 32, 32, 127])
    assert np.frombuffer(mem.read(total, 4), np.float32)[0] == sum(range(128))
    olds = np.frombuffer(mem.read(old, 512), np.uint32)
    for k in range(4):  # each counter's lanes saw 0, 1, ..., 31 in lane order
        np.testing.assert_array_equal(olds[k::4], np.arange(32))


WARP = (
    HEAD
    + """
.visible .entry warp(.param .u64 po)
{
  .reg .pred %p<4>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<6>;
  ld.param.u64 %rd1, [po];
  mov.u32 %r1, %tid.x;
  mul.lo.u32 %r2, %r1, %r1;
  shfl.sync.bfly.b32 %r3, %r2, 1, 31, -1;
  shfl.sync.down.b32 %r4|%p1, %r2, 3, 31, -1;
  selp.u32 %r5, 1000000, 0, %p1;
  add.u32 %r4, %r4, %r5;
  and.b32 %r6, %r1, 5;
  setp.eq.u32 %p2, %r6, 5;
  vote.sync.ballot.b32 %r7, %p2, -1;
  mul.wide.u32 %rd2, %r1, 12;
  add.s64 %rd3, %rd1, %rd2;
  st.global.v2.u32 [%rd3], {%r3, %r4};
  st.global.u32 [%rd3+8], %r7;
  ret;
}
"""
)


def test_shuffles_and_ballot_within_warps() -> None:
    mem = DeviceMemory()
    out = mem.alloc(12 * 64)
    load_ptx(WARP).launch("warp", (1, 1, 1), (64, 1, 1), [out], mem)
    got = np.frombuffer(mem.read(out, 12 * 64), np.uint32).reshape(64, 3)
    t = np.arange(64)
    lane = t % 32
    np.testing.assert_array_equal(got[:, 0], ((t ^ 1) ** 2))
    ok = lane + 3 <= 31
    np.testing.assert_array_equal(got[:, 1], np.where(ok, (t + 3) ** 2 + 1000000, t**2))
    ballot = sum(1 << k for k in range(32) if k & 5 == 5)
    np.testing.assert_array_equal(got[:, 2], np.full(64, ballot))


def test_unknown_instruction_names_the_opcode_and_line() -> None:
    text = HEAD + ".visible .entry bad()\n{\n  .reg .b32 %r<2>;\n  frobnicate.b32 %r1, %r0;\n  ret;\n}\n"
    with pytest.raises(EmulatorError, match=r"frobnicate\.b32.*line 8"):
        load_ptx(text)


def test_launch_checks_arguments_and_block_size() -> None:
    mod = load_ptx(SPECIAL)
    mem = DeviceMemory()
    assert mod.kernels["ids"].params == [("po", ".u64")]
    with pytest.raises(EmulatorError, match="takes 1 arguments"):  # too few; extra ones are ignored as by the driver
        mod.launch("ids", (1, 1, 1), (1, 1, 1), [], mem)
    with pytest.raises(EmulatorError, match="more than 1024"):
        mod.launch("ids", (1, 1, 1), (64, 32, 1), [mem.alloc(8)], mem)
    with pytest.raises(EmulatorError, match="no kernel 'nope'"):
        mod.launch("nope", (1, 1, 1), (1, 1, 1), [], mem)


BARRIER_AFTER_THE_WRITES = (
    HEAD
    + """
.visible .entry bar(.param .u64 po)
{
  .shared .align 4 .b8 s[64];
  .reg .pred %p<2>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [po];
  mov.u32 %r1, %tid.x;
  setp.lt.u32 %p1, %r1, 16;
  @%p1 bra $WRITE;                  // the writers' code comes after the barrier in program order
$SYNC:
  bar.sync 0;
  and.b32 %r2, %r1, 15;
  shl.b32 %r3, %r2, 2;
  mov.u32 %r4, s;
  add.u32 %r5, %r4, %r3;
  ld.shared.u32 %r6, [%r5];
  mov.u32 %r2, %ctaid.x;
  mad.lo.u32 %r2, %r2, 48, %r1;
  mul.wide.u32 %rd2, %r2, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r6;
  ret;
$WRITE:
  mul.lo.u32 %r7, %r1, 7;
  shl.b32 %r3, %r1, 2;
  mov.u32 %r4, s;
  add.u32 %r5, %r4, %r3;
  st.shared.u32 [%r5], %r7;
  bra $SYNC;
}
"""
)


def test_barrier_waits_for_threads_whose_code_lies_after_it() -> None:
    """Threads at bar.sync wait while others still run code placed later in the program (lowest-PC-first alone
    would release the barrier before the writes)."""
    mem = DeviceMemory()
    out = mem.alloc(4 * 96)
    load_ptx(BARRIER_AFTER_THE_WRITES).launch("bar", (2, 1, 1), (48, 1, 1), [out], mem)
    got = np.frombuffer(mem.read(out, 4 * 96), np.uint32)
    np.testing.assert_array_equal(got, (np.arange(96) % 48 % 16) * 7)


DYNAMIC_SHARED = (
    HEAD
    + """
.extern .shared .align 16 .b8 dyn[];
.visible .entry rev(.param .u64 po, .param .u64 pa)
{
  .shared .align 4 .b8 fixed[8];
  .reg .b32 %r<8>;
  .reg .b64 %rd<8>;
  .reg .f32 %f<2>;
  ld.param.u64 %rd1, [po];
  ld.param.u64 %rd2, [pa];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ntid.x;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd4, %rd2, %rd3;
  ld.global.f32 %f1, [%rd4];
  shl.b32 %r3, %r1, 2;
  mov.u32 %r4, dyn;
  add.u32 %r5, %r4, %r3;
  st.shared.f32 [%r5], %f1;            // the dynamic array lies after the static one
  st.shared.u32 [fixed+4], %r2;
  bar.sync 0;
  sub.u32 %r6, %r2, %r1;
  sub.u32 %r6, %r6, 1;
  shl.b32 %r6, %r6, 2;
  add.u32 %r6, %r4, %r6;
  ld.shared.f32 %f1, [%r6];
  add.s64 %rd5, %rd1, %rd3;
  st.global.f32 [%rd5], %f1;
  ret;
}
"""
)


def test_dynamic_shared_memory_is_sized_at_launch() -> None:
    mem = DeviceMemory()
    a = np.arange(64, dtype=np.float32)
    pa, out = mem.alloc(256), mem.alloc(256)
    mem.write(pa, a)
    mod = load_ptx(DYNAMIC_SHARED)
    mod.launch("rev", (1, 1, 1), (64, 1, 1), [out, pa], mem, dynamic_shared=256)
    np.testing.assert_array_equal(np.frombuffer(mem.read(out, 256), np.float32), a[::-1])
    with pytest.raises(EmulatorError, match="shared access"):
        mod.launch("rev", (1, 1, 1), (64, 1, 1), [out, pa], mem, dynamic_shared=128)


def test_cvt_rna_tf32_rounds_ties_away_from_zero() -> None:
    x = np.concatenate([RNG.standard_normal(100) * 50, [1 + 2**-11, -(1 + 2**-11), 1 + 3 * 2**-11, 3.0]])
    x = x.astype(np.float32)
    got = run("cvt.rna.tf32.f32 %r5, A;\n mov.b32 D, %r5;", "f32", "f32", x, x, x, np.float32)
    m, e = np.frexp(x.astype(np.float64))
    want = np.sign(m) * np.floor(np.abs(m) * 2**11 + 0.5) / 2**11 * np.exp2(e)
    np.testing.assert_array_equal(got, want.astype(np.float32))


WARP_REDUCE = (
    HEAD
    + """
.visible .entry red(.param .u64 po)
{
  .reg .pred %p<4>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<12>;
  ld.param.u64 %rd1, [po];
  mov.u32 %r1, %tid.x;
  mul.lo.u32 %r2, %r1, 37;
  and.b32 %r2, %r2, 255;
  sub.s32 %r2, %r2, 100;
  mov.u32 %r3, 0;
  mov.u32 %r4, 0;
  setp.ne.u32 %p1, %r1, 5;           // lane 5 of warp 0 sits the add out
  @%p1 redux.sync.add.s32 %r3, %r2, -1;
  redux.sync.min.s32 %r4, %r2, -1;
  redux.sync.xor.b32 %r5, %r1, -1;
  cvta.to.shared.u64 %rd2, %rd1;     // not a shared address: isspacep says so
  isspacep.global %p2, %rd1;
  isspacep.shared %p3, %rd1;
  selp.u32 %r6, 1, 0, %p2;
  selp.u32 %r7, 2, 0, %p3;
  or.b32 %r6, %r6, %r7;
  mul.wide.u32 %rd3, %r1, 16;
  add.s64 %rd4, %rd1, %rd3;
  st.global.v4.u32 [%rd4], {%r3, %r4, %r5, %r6};
  ret;
}
"""
)


def test_redux_reduces_the_active_lanes_of_each_warp_and_isspacep() -> None:
    mem = DeviceMemory()
    out = mem.alloc(16 * 64)
    load_ptx(WARP_REDUCE).launch("red", (1, 1, 1), (64, 1, 1), [out], mem)
    got = np.frombuffer(mem.read(out, 16 * 64), np.int32).reshape(64, 4)
    t = np.arange(64)
    v = (t * 37 & 255) - 100
    sums = [v[:32].sum() - v[5], v[32:].sum()]
    np.testing.assert_array_equal(got[:, 0], np.where(t == 5, 0, np.repeat(sums, 32)))
    np.testing.assert_array_equal(got[:, 1], np.repeat([v[:32].min(), v[32:].min()], 32))
    xors = [np.bitwise_xor.reduce(t[:32]), np.bitwise_xor.reduce(t[32:])]
    np.testing.assert_array_equal(got[:, 2], np.repeat(xors, 32))
    np.testing.assert_array_equal(got[:, 3], np.ones(64))


SCATTER_ATOMICS = """
.version 7.8
.target sm_80
.address_size 64
.visible .entry k(.param .u64 pc, .param .u64 pf, .param .u64 po, .param .u64 pof, .param .u32 nb)
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<12>;
  .reg .f32 %f<4>;
  ld.param.u64 %rd1, [pc];
  ld.param.u64 %rd2, [pf];
  ld.param.u64 %rd3, [po];
  ld.param.u64 %rd9, [pof];
  ld.param.u32 %r7, [nb];
  mov.u32 %r1, %tid.x; mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mad.lo.u32 %r4, %r2, %r3, %r1;
  mul.lo.u32 %r5, %r4, 2654435761; rem.u32 %r5, %r5, %r7;
  mul.wide.u32 %rd4, %r5, 4; add.s64 %rd5, %rd1, %rd4; add.s64 %rd6, %rd2, %rd4;
  atom.global.add.u32 %r6, [%rd5], %r4;
  cvt.rn.f32.u32 %f1, %r4; mul.f32 %f1, %f1, 0f3DCCCCCD;
  atom.global.add.f32 %f2, [%rd6], %f1;
  mul.wide.u32 %rd7, %r4, 4; add.s64 %rd8, %rd3, %rd7; st.global.u32 [%rd8], %r6;
  add.s64 %rd10, %rd9, %rd7; st.global.f32 [%rd10], %f2;
  ret;
}"""


@pytest.mark.parametrize("slots", [3, 1000])
def test_scattered_atomic_adds_see_the_earlier_lanes_in_order(slots: int) -> None:
    """4096 lanes add into a few or many addresses; integer and float adds and their old values equal a sequential
    run in lane order."""
    n = 4096
    mem = DeviceMemory()
    c, f, o, of = mem.alloc(4 * slots), mem.alloc(4 * slots), mem.alloc(4 * n), mem.alloc(4 * n)
    load_ptx(SCATTER_ATOMICS).launch("k", (n // 256, 1, 1), (256, 1, 1), [c, f, o, of, slots], mem)
    slot = (np.arange(n, dtype=np.uint64) * 2654435761 % 2**32) % slots
    cnt, fs = [0] * slots, np.zeros(slots, np.float32)
    olds, oldf = [], np.zeros(n, np.float32)
    for t in range(n):
        k = int(slot[t])
        olds.append(cnt[k])
        cnt[k] = (cnt[k] + t) % 2**32
        oldf[t] = fs[k]
        fs[k] = np.float32(fs[k] + np.float32(t) * np.float32(0.1))
    np.testing.assert_array_equal(np.frombuffer(mem.read(c, 4 * slots), np.uint32), np.array(cnt, np.uint32))
    np.testing.assert_array_equal(np.frombuffer(mem.read(o, 4 * n), np.uint32), np.array(olds, np.uint32))
    np.testing.assert_array_equal(np.frombuffer(mem.read(f, 4 * slots), np.float32), fs)
    np.testing.assert_array_equal(np.frombuffer(mem.read(of, 4 * n), np.float32), oldf)
