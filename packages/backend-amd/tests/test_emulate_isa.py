"""One test per instruction class of the RDNA3 emulator: short programs assembled by llvm-mc-19 for gfx1100 run on one
wave whose registers the test sets, and the results are compared with values worked out independently (Python
integers, numpy in float64 then rounded, the ISA reference's definitions), never with the emulator itself."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from xgrad_amd.emulate import DeviceMemory, EmulatorError
from xgrad_amd.emulate.dispatch import Program
from xgrad_amd.emulate.dispatch import run as run_program
from xgrad_amd.emulate.wave import EXEC, VCC, Waves

MC = shutil.which("llvm-mc-19")
pytestmark = pytest.mark.skipif(MC is None, reason="llvm-mc-19 not installed (apt-get install llvm-19)")
F32, F16, U32 = np.float32, np.float16, np.uint32


def assemble(text: str) -> bytes:
    assert MC is not None
    cmd = [MC, "-triple=amdgcn", "-mcpu=gfx1100", "-show-encoding"]
    out = subprocess.run(cmd, input=text + "\ns_endpgm\n", capture_output=True, text=True, check=True).stdout
    return b"".join(bytes(int(b, 16) for b in m.split(",")) for m in re.findall(r"encoding: \[(.*?)\]", out))


def wave(vgprs: int = 16, lds: int = 1024, mem: DeviceMemory | None = None) -> Waves:
    """A batch of one wave, all lanes on, its code at 0x1000."""
    w = Waves(1, vgprs, mem or DeviceMemory(), 0x1000, lds)
    w.s[EXEC] = 0xFFFFFFFF
    return w


def run(w: Waves, text: str) -> Waves:
    run_program(w, Program(assemble(text)))
    return w


def f32(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, F32).view(U32)


def lanes_f32(w: Waves, r: int) -> np.ndarray:
    return w.v[r].view(F32)


# ------------------------------------------------------------------------------------------------------ scalar
def test_sop2_arithmetic_carries_and_scc() -> None:
    w = wave()
    w.s[1], w.s[2], w.s[3] = 0xFFFFFFF0, 0x20, 0x7FFFFFFF
    run(w, "s_add_u32 s4, s1, s2\ns_addc_u32 s5, 0, 0\ns_sub_u32 s6, s2, s1\ns_cselect_b32 s7, 11, 22\n"
        "s_add_i32 s8, s3, 1\ns_mul_hi_u32 s9, s1, s1\ns_bfe_u32 s10, s1, 0x40004\ns_ashr_i32 s11, s1, 4")  # fmt: skip
    assert w.s[4] == (0xFFFFFFF0 + 0x20) & 0xFFFFFFFF and w.s[5] == 1
    assert w.s[6] == (0x20 - 0xFFFFFFF0) & 0xFFFFFFFF and w.s[7] == 11  # the borrow of s_sub_u32 set SCC
    assert w.s[8] == 0x80000000 and w.scc == 1  # signed overflow
    assert w.s[9] == (0xFFFFFFF0 * 0xFFFFFFF0) >> 32
    assert w.s[10] == (0xFFFFFFF0 >> 4) & 0xF
    assert w.s[11] == (-16 >> 4) & 0xFFFFFFFF


def test_sop1_sopk_sopc_and_64_bit_shifts() -> None:
    w = wave()
    w.s[2], w.s[3] = 0x89ABCDEF, 0x01234567
    run(w, "s_lshl_b64 s[4:5], s[2:3], 12\ns_movk_i32 s6, 0x8001\ns_not_b32 s7, s2\ns_cmp_lt_i32 s2, 0\n"
        "s_cselect_b32 s8, 1, 2\ns_cmpk_eq_u32 s6, 0x1\ns_cselect_b32 s9, 1, 2\ns_bcnt1_i32_b32 s10, s2\n"
        "s_ff1_i32_b32 s11, s2\ns_mov_b64 s[12:13], -1")  # fmt: skip
    v = (0x01234567 << 32 | 0x89ABCDEF) << 12
    assert (w.s[4], w.s[5]) == (v & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF)
    assert w.s[6] == 0xFFFF8001 and w.s[7] == ~0x89ABCDEF & 0xFFFFFFFF
    assert w.s[8] == 1 and w.s[9] == 2
    assert w.s[10] == bin(0x89ABCDEF).count("1") and w.s[11] == 0
    assert (w.s[12], w.s[13]) == (0xFFFFFFFF, 0xFFFFFFFF)


def test_sopp_branches_loop_and_getpc() -> None:
    w = wave()
    # the branch goes back 4 instructions: to pc + 4 + 4 * simm16
    run(w, "s_mov_b32 s0, 0\ns_mov_b32 s1, 5\ns_add_u32 s0, s0, s1\ns_sub_u32 s1, s1, 1\ns_cmp_lg_u32 s1, 0\n"
        "s_cbranch_scc1 -4\ns_getpc_b64 s[2:3]")  # fmt: skip
    assert w.s[0] == 5 + 4 + 3 + 2 + 1 and w.s[1] == 0
    assert w.s[2] == 0x1000 + 6 * 4 + 4  # the address of the instruction after s_getpc_b64


# ------------------------------------------------------------------------------------------------------ vector
def test_vop1_transcendentals_follow_the_isa_definitions() -> None:
    x = np.linspace(0.25, 3.0, 32, dtype=F32)
    w = wave()
    w.v[0] = f32(x)
    run(w, "v_exp_f32 v1, v0\nv_log_f32 v2, v0\nv_rcp_f32 v3, v0\nv_sqrt_f32 v4, v0\nv_rsq_f32 v5, v0\n"
        "v_sin_f32 v6, v0\nv_cos_f32 v7, v0\nv_fract_f32 v8, v0\nv_cvt_i32_f32 v9, v0\n"
        "v_frexp_exp_i32_f32 v10, v0")  # fmt: skip
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(lanes_f32(w, 1), 2**x64, rtol=1e-6)  # 2^x, not e^x
    np.testing.assert_allclose(lanes_f32(w, 2), np.log2(x64), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lanes_f32(w, 3), 1 / x64, rtol=1e-6)
    np.testing.assert_allclose(lanes_f32(w, 4), np.sqrt(x64), rtol=1e-6)
    np.testing.assert_allclose(lanes_f32(w, 5), 1 / np.sqrt(x64), rtol=1e-6)
    np.testing.assert_allclose(lanes_f32(w, 6), np.sin(2 * np.pi * x64), atol=1e-6)  # input in revolutions
    np.testing.assert_allclose(lanes_f32(w, 7), np.cos(2 * np.pi * x64), atol=1e-6)
    np.testing.assert_allclose(lanes_f32(w, 8), x64 - np.floor(x64), atol=1e-7)
    np.testing.assert_array_equal(w.v[9].view(np.int32), np.trunc(x64).astype(np.int32))
    np.testing.assert_array_equal(w.v[10].view(np.int32), np.frexp(x64)[1])


def test_vop2_vop3_modifiers_literals_and_inline_constants() -> None:
    rng = np.random.default_rng(0)
    a, b, c = (rng.uniform(-2, 2, 32).astype(F32) for _ in range(3))
    w = wave()
    w.v[0], w.v[1], w.v[2] = f32(a), f32(b), f32(c)
    w.v[3] = f32(c)
    run(w, "v_fmac_f32_e64 v3, -v0, |v1|\nv_add_f32_e64 v4, v0, v1 clamp mul:2\nv_mul_f32 v5, 0x3fc00000, v0\n"
        "v_fmamk_f32 v6, v0, 0x40400000, v1\nv_sub_f32 v7, 0.5, v2\nv_mad_u32_u24 v8, 7, 9, 100\n"
        "v_lshlrev_b32 v9, 3, 0x12345\nv_max_f32_e64 v10, -|v0|, v1 div:2")  # fmt: skip
    a64, b64, c64 = a.astype(np.float64), b.astype(np.float64), c.astype(np.float64)
    np.testing.assert_allclose(lanes_f32(w, 3), (-a64 * np.abs(b64) + c64).astype(F32), rtol=1e-6)
    np.testing.assert_allclose(lanes_f32(w, 4), np.clip((a64 + b64) * 2, 0, 1), rtol=1e-6)
    np.testing.assert_allclose(lanes_f32(w, 5), 1.5 * a64, rtol=1e-7)
    np.testing.assert_allclose(lanes_f32(w, 6), a64 * 3 + b64, rtol=1e-6)
    np.testing.assert_allclose(lanes_f32(w, 7), 0.5 - c64, rtol=1e-7)
    assert (w.v[8] == 7 * 9 + 100).all() and (w.v[9] == 0x12345 << 3).all()
    np.testing.assert_allclose(lanes_f32(w, 10), np.maximum(-np.abs(a64), b64) / 2, rtol=1e-7)


def test_vop3_integer_bitfields_and_64_bit_values() -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 2**32, 32, dtype=np.uint64).astype(U32)
    y = rng.integers(0, 2**32, 32, dtype=np.uint64).astype(U32)
    w = wave()
    w.v[0], w.v[1] = x, y
    w.s[4] = 0x11223344
    w.v[13] = 0x55667788
    run(w, "v_bfe_i32 v2, v0, 4, 12\nv_lshlrev_b64 v[4:5], 5, v[0:1]\nv_mad_u64_u32 v[6:7], s10, v0, v1, v[0:1]\n"
        "v_perm_b32 v8, s4, v13, 0x0c070105\nv_mul_hi_u32 v9, v0, v1\nv_alignbit_b32 v10, v0, v1, 7\n"
        "v_add_co_u32 v11, vcc_lo, v0, v1\nv_add_co_ci_u32_e64 v12, s11, 0, 0, vcc_lo")  # fmt: skip
    xi, yi = [int(v) for v in x], [int(v) for v in y]
    field = [(v >> 4) & 0xFFF for v in xi]
    assert [int(v) for v in w.v[2]] == [(f - 0x1000 if f & 0x800 else f) & 0xFFFFFFFF for f in field]
    pair = [(yy << 32 | xx) for xx, yy in zip(xi, yi)]
    assert [int(lo) | int(hi) << 32 for lo, hi in zip(w.v[4], w.v[5])] == [(p << 5) & (2**64 - 1) for p in pair]
    mads = [xx * yy + p for xx, yy, p in zip(xi, yi, pair)]
    assert [int(lo) | int(hi) << 32 for lo, hi in zip(w.v[6], w.v[7])] == [m & (2**64 - 1) for m in mads]
    assert w.s[10] == sum(1 << i for i, m in enumerate(mads) if m >> 64)
    both = (0x11223344 << 32) | 0x55667788  # v_perm bytes of {S0, S1}: selector 0x0c -> 0, 7 -> byte 7, ...
    sel = [0x05, 0x01, 0x07, 0x0C]
    want_perm = sum(((both >> (8 * s)) & 0xFF if s < 8 else 0) << (8 * i) for i, s in enumerate(sel))
    assert (w.v[8] == want_perm).all()
    assert [int(v) for v in w.v[9]] == [(a * b) >> 32 for a, b in zip(xi, yi)]
    assert [int(v) for v in w.v[10]] == [((a << 32 | b) >> 7) & 0xFFFFFFFF for a, b in zip(xi, yi)]
    carries = [a + b > 0xFFFFFFFF for a, b in zip(xi, yi)]
    assert [int(v) for v in w.v[12]] == [int(c) for c in carries]


def test_vopc_writes_vcc_cmpx_writes_exec_and_nan_is_unordered() -> None:
    a = np.arange(32, dtype=F32)
    a[3] = np.nan
    w = wave()
    w.v[0] = f32(a)
    w.v[1] = f32(np.full(32, 10, F32))
    run(w, "v_cmp_lt_f32 vcc_lo, v0, v1\nv_cmp_nge_f32_e64 s4, v0, v1\nv_cmp_class_f32_e64 s5, v0, 3\n"
        "v_cmpx_gt_f32_e64 v0, 20.0\nv_mov_b32 v2, 1")  # fmt: skip
    lt = [bool(x < 10) for x in a]
    assert w.s[VCC] == sum(1 << i for i, t in enumerate(lt) if t)
    assert w.s[4] == sum(1 << i for i, x in enumerate(a) if not x >= 10)  # NaN lanes are set
    assert w.s[5] == 1 << 3  # class bits 0|1: a NaN
    assert w.s[EXEC] == sum(1 << i for i, x in enumerate(a) if x > 20)  # only v_cmpx writes EXEC
    assert [int(v) for v in w.v[2]] == [1 if x > 20 else 0 for x in a]


def test_exec_mask_limits_writes_and_saveexec_restores() -> None:
    w = wave()
    w.v[0] = np.arange(32, dtype=U32)
    run(w, "v_cmp_gt_u32 vcc_lo, 8, v0\ns_and_saveexec_b32 s2, vcc_lo\nv_mov_b32 v1, 5\n"
        "s_or_b32 exec_lo, exec_lo, s2\nv_add_nc_u32 v2, 1, v1")  # fmt: skip
    assert w.s[2] == 0xFFFFFFFF and w.s[EXEC] == 0xFFFFFFFF
    assert [int(v) for v in w.v[1]] == [5] * 8 + [0] * 24
    assert [int(v) for v in w.v[2]] == [6] * 8 + [1] * 24


def test_f64_and_f16_with_op_sel() -> None:
    rng = np.random.default_rng(2)
    d = rng.uniform(-10, 10, 32)
    h = rng.uniform(-4, 4, 64).astype(F16)
    w = wave()
    raw = d.view(np.uint64)
    w.v[0], w.v[1] = (raw & 0xFFFFFFFF).astype(U32), (raw >> 32).astype(U32)
    w.v[4] = h.view(np.uint16).reshape(32, 2).astype(U32)[:, 0] | (
        h.view(np.uint16).reshape(32, 2).astype(U32)[:, 1] << 16
    )
    w.v[5] = 0xAAAA0000
    w.v[8] = 0x1234
    run(w, "v_add_f64 v[2:3], v[0:1], 0.5\nv_fma_f64 v[6:7], v[0:1], v[0:1], -1.0\n"
        "v_fma_f16 v5, v4, v4, v4 op_sel:[1,1,0,0]\nv_fma_f16 v8, v4, v4, 0 op_sel:[0,0,0,1]\n"
        "v_add_f16_e64 v9, v4, 2.0")  # fmt: skip
    got = (w.v[2].astype(np.uint64) | w.v[3].astype(np.uint64) << 32).view(np.float64)
    np.testing.assert_array_equal(got, d + 0.5)
    got = (w.v[6].astype(np.uint64) | w.v[7].astype(np.uint64) << 32).view(np.float64)
    np.testing.assert_allclose(got, d * d - 1, rtol=1e-15)
    hi = h.reshape(32, 2)[:, 1].astype(np.float64)
    lo = h.reshape(32, 2)[:, 0].astype(np.float64)
    np.testing.assert_array_equal((w.v[5] & 0xFFFF).astype(np.uint16).view(F16), (hi * hi + lo).astype(F16))
    assert (w.v[5] >> 16 == 0xAAAA).all()  # a 16-bit result keeps the other half
    np.testing.assert_array_equal((w.v[8] >> 16).astype(np.uint16).view(F16), (lo * lo).astype(F16))
    assert (w.v[8] & 0xFFFF == 0x1234).all()
    np.testing.assert_array_equal((w.v[9] & 0xFFFF).astype(np.uint16).view(F16), (lo + 2).astype(F16))


def test_vop3p_packed_mix_and_dot() -> None:
    rng = np.random.default_rng(3)
    h = rng.uniform(-3, 3, (3, 32, 2)).astype(F16)
    w = wave()
    for i in range(3):
        u = h[i].view(np.uint16).astype(U32)
        w.v[i] = u[:, 0] | (u[:, 1] << 16)
    run(w, "v_pk_add_f16 v4, v0, v1\nv_pk_fma_f16 v5, v0, v1, v2 op_sel:[1,0,0] op_sel_hi:[0,1,1]\n"
        "v_pk_mul_f16 v6, v0, v1 neg_lo:[1,0] neg_hi:[0,1]\n"
        "v_fma_mix_f32 v7, v0, v1, v2 op_sel:[1,0,0] op_sel_hi:[1,1,1]\n"
        "v_dot2_f32_f16 v8, v0, v1, 1.0")  # fmt: skip
    a, b, c = (h[i].astype(np.float64) for i in range(3))

    def halves(r: int) -> np.ndarray:
        u = np.stack([w.v[r] & 0xFFFF, w.v[r] >> 16], axis=1).astype(np.uint16)
        return u.view(F16).astype(np.float64)

    np.testing.assert_array_equal(halves(4), (a + b).astype(F16))
    want5 = np.stack([a[:, 1] * b[:, 0] + c[:, 0], a[:, 0] * b[:, 1] + c[:, 1]], axis=1)
    np.testing.assert_array_equal(halves(5), want5.astype(F16))
    np.testing.assert_array_equal(halves(6), np.stack([-a[:, 0] * b[:, 0], a[:, 1] * -b[:, 1]], axis=1).astype(F16))
    np.testing.assert_allclose(lanes_f32(w, 7), a[:, 1] * b[:, 0] + c[:, 0], rtol=1e-6)
    np.testing.assert_allclose(lanes_f32(w, 8), a[:, 0] * b[:, 0] + a[:, 1] * b[:, 1] + 1, rtol=1e-6)


def test_integer_and_half_dot_products() -> None:
    rng = np.random.default_rng(5)
    a8 = rng.integers(-128, 128, (32, 4)).astype(np.int8)
    b8 = rng.integers(-128, 128, (32, 4)).astype(np.int8)
    h = rng.uniform(-2, 2, (2, 32, 2)).astype(F16)
    w = wave()
    w.v[0], w.v[1] = a8.view(U32).ravel(), b8.view(U32).ravel()
    w.v[2] = np.arange(32, dtype=U32) * 1000
    w.v[5] = f32(np.full(32, 0.5, F32))
    w.v[8] = h[0].view(U32).ravel()
    w.v[9] = h[1].view(U32).ravel()
    w.v[7] = 0xFFFFFF00
    run(w, "v_dot4_i32_iu8 v3, v0, v1, v2 neg_lo:[1,1,0]\nv_dot4_u32_u8 v4, v0, v1, v2\nv_dot2acc_f32_f16 v5, v8, v9\n"
        "v_dot8_i32_iu4 v6, v0, v1, v2 neg_lo:[1,0,0]\nv_dot4_u32_u8 v7, v0, v1, v7 clamp")  # fmt: skip
    c = np.arange(32) * 1000
    sa, sb = a8.astype(np.int64), b8.astype(np.int64)
    ua, ub = a8.view(np.uint8).astype(np.int64), b8.view(np.uint8).astype(np.int64)
    assert [int(x) for x in w.v[3].view(np.int32)] == list((sa * sb).sum(1) + c)  # both signed
    assert [int(x) for x in w.v[4]] == list((ua * ub).sum(1) + c)
    want5 = (h[0].astype(np.float64) * h[1].astype(np.float64)).sum(1) + 0.5
    np.testing.assert_allclose(lanes_f32(w, 5), want5, rtol=1e-6)
    nib_a = (a8.view(U32).ravel()[:, None] >> (4 * np.arange(8, dtype=U32))) & 15  # S0 signed nibbles, S1 unsigned
    nib_a = np.where(nib_a >= 8, nib_a.astype(np.int64) - 16, nib_a.astype(np.int64))
    nib_b = ((b8.view(U32).ravel()[:, None] >> (4 * np.arange(8, dtype=U32))) & 15).astype(np.int64)
    assert [int(x) for x in w.v[6].view(np.int32)] == list((nib_a * nib_b).sum(1) + c)
    sums = (ua * ub).sum(1) + 0xFFFFFF00
    assert [int(x) for x in w.v[7]] == [min(int(x), 2**32 - 1) for x in sums]  # clamp saturates
    assert (sums > 2**32 - 1).any()


def test_vop3p_constants_are_32_bit_values_whose_halves_op_sel_picks() -> None:
    w = wave()
    w.v[0] = np.arange(32, dtype=U32) | (np.arange(100, 132, dtype=U32) << 16)
    w.v[6] = 0x4000 | 0x4400 << 16  # f16 (2.0, 4.0)
    run(w, "v_pk_add_u16 v1, v0, -1\nv_pk_add_u16 v2, v0, 1\nv_pk_add_u16 v3, v0, 1 op_sel_hi:[1,0]\n"
        "v_pk_add_u16 v4, v0, 1 op_sel:[0,1] op_sel_hi:[1,0]\nv_pk_mul_f16 v5, v6, 0.5 op_sel_hi:[1,0]\n"
        "v_pk_mul_f16 v7, v6, 0.5")  # fmt: skip
    lo, hi = np.arange(32), np.arange(100, 132)

    def halves(r: int) -> tuple[list[int], list[int]]:
        return [int(x) & 0xFFFF for x in w.v[r]], [int(x) >> 16 for x in w.v[r]]

    assert halves(1) == ([(x - 1) & 0xFFFF for x in lo], [x - 1 for x in hi])  # -1 is 0xFFFFFFFF: both halves
    assert halves(2) == ([x + 1 for x in lo], list(hi))  # 1 is 0x00000001: the high half adds 0
    assert halves(3) == ([x + 1 for x in lo], [x + 1 for x in hi])
    assert halves(4) == (list(lo), [x + 1 for x in hi])
    assert (w.v[5] == (0x3C00 | 0x4000 << 16)).all()  # (2, 4) * (0.5, 0.5) = (1, 2)
    assert (w.v[7] == 0x3C00).all()  # 0.5 is f16 bits in the low half: (2, 4) * (0.5, 0) = (1, 0)


def test_vopd_halves_read_before_either_writes() -> None:
    w = wave()
    w.v[0], w.v[1] = 7, 9
    w.v[4] = f32(np.full(32, 2.0, F32))
    run(w, "v_dual_mov_b32 v0, v1 :: v_dual_mov_b32 v1, v0\nv_dual_add_f32 v2, 1.0, v4 :: v_dual_lshlrev_b32 v3, 4, v1")
    assert (w.v[0] == 9).all() and (w.v[1] == 7).all()  # swapped, as dual issue reads both sources first
    assert (lanes_f32(w, 2) == 3.0).all() and (w.v[3] == 7 << 4).all()


def test_lane_ops_readlane_writelane_readfirstlane() -> None:
    w = wave()
    w.v[0] = np.arange(100, 132, dtype=U32)
    w.s[EXEC] = 0xFFFF0000
    w.s[3] = 5
    run(w, "v_readfirstlane_b32 s0, v0\nv_readlane_b32 s1, v0, s3\nv_writelane_b32 v1, s3, 2")
    assert w.s[0] == 116 and w.s[1] == 105
    assert int(w.v[1][2]) == 5 and int(w.v[1].sum()) == 5  # writelane ignores EXEC


# ------------------------------------------------------------------------------------------------------ memory
def test_smem_global_loads_stores_and_d16() -> None:
    mem = DeviceMemory()
    data = np.arange(80, dtype=U32) * 3
    base = mem.alloc(data.nbytes)
    mem.write(base, data)
    out = mem.alloc(512 * 4)
    w = wave(mem=mem)
    w.s[4], w.s[5] = base & 0xFFFFFFFF, base >> 32
    w.s[6], w.s[7] = out & 0xFFFFFFFF, out >> 32
    w.v[1] = np.arange(32, dtype=U32) * 8 + 8  # byte offsets of even elements, +8
    w.v[6] = 0xBEEF0000
    run(w, "s_load_b64 s[8:9], s[4:5], 0x10\ns_waitcnt lgkmcnt(0)\nglobal_load_b64 v[2:3], v1, s[4:5] offset:-8\n"
        "global_load_d16_b16 v6, v1, s[4:5]\nv_lshlrev_b32 v4, 2, v1\nglobal_store_b32 v4, v2, s[6:7] offset:4\n"
        "v_mov_b32 v8, s6\nv_mov_b32 v9, s7\nglobal_store_b16 v[8:9], v6, off")  # fmt: skip
    assert (w.s[8], w.s[9]) == (12, 15)
    idx = np.arange(32) * 2
    np.testing.assert_array_equal(w.v[2], data[idx])
    np.testing.assert_array_equal(w.v[3], data[idx + 1])
    np.testing.assert_array_equal(w.v[6], 0xBEEF0000 | data[idx + 2] & 0xFFFF)
    stored = np.frombuffer(mem.read(out, 512 * 4), U32)
    np.testing.assert_array_equal(stored[(np.arange(32) * 8 + 8) + 1], data[idx])
    assert stored[0] & 0xFFFF == int(data[62 + 2]) & 0xFFFF  # every lane stored to one address: the last wins


def test_lds_stores_loads_2addr_and_atomics() -> None:
    w = wave(lds=1024)
    w.v[0] = np.arange(32, dtype=U32) * 4
    w.v[1] = np.arange(32, dtype=U32) + 1000
    w.v[5] = 0
    run(w, "ds_store_b32 v0, v1 offset:128\nds_load_2addr_b32 v[2:3], v0 offset0:32 offset1:33\n"
        "ds_add_u32 v5, v1\nds_load_b32 v4, v5")  # fmt: skip
    np.testing.assert_array_equal(w.v[2], np.arange(32) + 1000)
    np.testing.assert_array_equal(w.v[3][:31], np.arange(1, 32) + 1000)
    assert int(w.v[4][0]) == sum(range(1000, 1032))  # every lane added at address 0
    with pytest.raises(EmulatorError, match="past the workgroup's"):
        run(wave(lds=64), "v_mov_b32 v0, 0x100\nds_load_b32 v1, v0")


def test_lds_d16_loads_fill_one_half_and_store_hi_writes_the_high_half() -> None:
    """ds_load_u16_d16 / _hi (what clang emits for a tiled matmul's half fragments read from LDS), the i8 form
    sign-extended to 16 bits, and ds_store_b16_d16_hi: each keeps the register's other half."""
    w = wave(lds=1024)
    w.v[0] = np.arange(32, dtype=U32) * 2  # byte address of halfword i
    w.v[1] = (np.arange(32, dtype=U32) + 0x8100) << 16 | 0x7777  # high halves to store
    w.v[2] = np.full(32, 0xAAAA5555, U32)
    w.v[3] = np.full(32, 0xAAAA5555, U32)
    w.v[4] = np.full(32, 0x12345678, U32)
    run(w, "ds_store_b16_d16_hi v0, v1\ns_waitcnt lgkmcnt(0)\nds_load_u16_d16 v2, v0\nds_load_u16_d16_hi v3, v0\n"
        "ds_load_i8_d16_hi v4, v0 offset:1")  # fmt: skip
    stored = np.arange(32, dtype=U32) + 0x8100
    np.testing.assert_array_equal(w.v[2], 0xAAAA0000 | stored)
    np.testing.assert_array_equal(w.v[3], stored << 16 | 0x5555)
    np.testing.assert_array_equal(w.v[4], 0xFF810000 | 0x5678)  # byte 1 of each halfword: 0x81, sign-extended


def test_wmma_layout_rows_and_columns_per_lane() -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((16, 16)).astype(F16)
    b = rng.standard_normal((16, 16)).astype(F16)
    w = wave(vgprs=32)
    lane = np.arange(32)
    for i in range(8):  # A: lane l holds row l % 16, k = 2i, 2i+1 in VGPR i; B: column l % 16
        lo, hi = a[lane % 16, 2 * i].view(np.uint16), a[lane % 16, 2 * i + 1].view(np.uint16)
        w.v[i] = lo.astype(U32) | hi.astype(U32) << 16
        lo, hi = b[2 * i, lane % 16].view(np.uint16), b[2 * i + 1, lane % 16].view(np.uint16)
        w.v[8 + i] = lo.astype(U32) | hi.astype(U32) << 16
        w.v[16 + i] = f32(np.full(32, 0.25, F32))
    run(w, "v_wmma_f32_16x16x16_f16 v[24:31], v[0:7], v[8:15], v[16:23]")
    want = a.astype(np.float64) @ b.astype(np.float64) + 0.25
    for i in range(8):  # D: VGPR i of lane l is row 2i + l // 16, column l % 16
        np.testing.assert_allclose(lanes_f32(w, 24 + i), want[2 * i + lane // 16, lane % 16], rtol=1e-5, atol=1e-6)


def test_wmma_under_a_partial_exec_raises_and_under_none_writes_nothing() -> None:
    """A WMMA is a whole-wave operation: every lane holds part of A, B and C (LLVM's WMMA intrinsics are convergent),
    so one that runs with some lanes off (code a compiler sank under a lane condition: clang-19 did, with the conv of
    test_mockgpu) is refused loudly rather than computed from lanes that never built their operands; with EXEC zero
    it writes nothing, as any vector instruction."""
    text = "v_wmma_f32_16x16x16_f16 v[24:31], v[0:7], v[8:15], v[16:23]"
    for exec_mask, on in ((0x00FF00FF, 16), (0xFFFFFFFE, 31), (0x80000000, 1)):
        w = wave(vgprs=32)
        w.s[EXEC] = exec_mask
        with pytest.raises(EmulatorError, match=f"v_wmma_f32_16x16x16_f16 at 0x0 runs with {on} of 32 lanes in EXEC"):
            run(w, text)
    w = wave(vgprs=32)
    w.v[0:8] = 0x3C003C00  # A, B = ones: D would be 16 in every lane
    w.v[8:16] = 0x3C003C00
    w.v[24:32] = 7
    w.s[EXEC] = 0
    run(w, text)
    np.testing.assert_array_equal(w.v[24:32], 7)


def test_unimplemented_instruction_raises_naming_it() -> None:
    with pytest.raises(EmulatorError, match="v_trig_preop_f64"):
        run(wave(), "v_trig_preop_f64 v[0:1], v[2:3], v4")
