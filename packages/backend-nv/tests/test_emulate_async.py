"""The PTX interpreter's asynchronous copies (cp.async, commit_group, wait_group, wait_all) on hand-written PTX, with
the bytes each thread must see worked out by hand: a copy lands only when its group is waited for, its destination
reads 0xFF bytes until then, src-size reads a prefix and zero-fills the rest, and forms it does not know raise."""

from __future__ import annotations

import numpy as np
import pytest

from xgrad_nv.emulate import DeviceMemory, EmulatorError, load_ptx

HEAD = """
.version 7.8
.target sm_80
.address_size 64
"""

# two threads. Group 0: thread t copies a[16t : 16t+16] to s[16t] with one 16-byte .cg copy whose src-size is 16
# (thread 0) or 6 (thread 1). Group 1: a[32+16t : 48+16t] to s[32+16t] as two 8-byte .ca copies. After
# wait_group 1 and a barrier each thread stores the other's first copy and its own second one (still in flight);
# after wait_all and a barrier, the other's second copy. out: 48 bytes per thread.
GROUPS = (
    HEAD
    + """
.visible .entry groups(.param .u64 po, .param .u64 pa)
{
  .shared .align 16 .b8 s[64];
  .reg .pred %p<2>;
  .reg .b32 %r<24>;
  .reg .b64 %rd<16>;
  ld.param.u64 %rd1, [po];
  ld.param.u64 %rd2, [pa];
  mov.u32 %r1, %tid.x;
  setp.eq.u32 %p1, %r1, 0;
  selp.u32 %r2, 16, 6, %p1;
  mov.u32 %r3, s;
  mad.lo.u32 %r4, %r1, 16, %r3;          // &s[16t]
  mul.wide.u32 %rd3, %r1, 16;
  add.s64 %rd4, %rd2, %rd3;              // &a[16t]
  cp.async.cg.shared.global [%r4], [%rd4], 16, %r2;
  cp.async.commit_group;
  cp.async.ca.shared.global [%r4+32], [%rd4+32], 8;
  cp.async.ca.shared.global [%r4+40], [%rd4+40], 8;
  cp.async.commit_group;
  cp.async.wait_group 1;
  bar.sync 0;
  xor.b32 %r5, %r1, 1;
  mad.lo.u32 %r6, %r5, 16, %r3;          // &s[16(1-t)]
  mul.wide.u32 %rd5, %r1, 48;
  add.s64 %rd6, %rd1, %rd5;              // &out[48t]
  ld.shared.v4.u32 {%r10, %r11, %r12, %r13}, [%r6];
  st.global.v4.u32 [%rd6], {%r10, %r11, %r12, %r13};
  ld.shared.v4.u32 {%r14, %r15, %r16, %r17}, [%r4+32];
  st.global.v4.u32 [%rd6+16], {%r14, %r15, %r16, %r17};
  cp.async.wait_all;
  bar.sync 0;
  ld.shared.v4.u32 {%r18, %r19, %r20, %r21}, [%r6+32];
  st.global.v4.u32 [%rd6+32], {%r18, %r19, %r20, %r21};
  ret;
}
"""
)


def launch(text: str, name: str, a: np.ndarray, out_bytes: int, threads: int = 2) -> np.ndarray:
    mem = DeviceMemory()
    pa = mem.alloc(a.nbytes)
    mem.write(pa, a)
    out = mem.alloc(out_bytes)
    load_ptx(text).launch(name, (1, 1, 1), (threads, 1, 1), [out, pa], mem)
    return np.frombuffer(mem.read(out, out_bytes), np.uint8)


def test_copies_land_when_their_group_is_waited_for() -> None:
    a = np.arange(64, dtype=np.uint8) + 100
    got = launch(GROUPS, "groups", a, 96).reshape(2, 3, 16)
    undefined = np.full(16, 0xFF, np.uint8)
    # thread 0 sees thread 1's first copy: 6 bytes read, 10 zeros; its own second copy is still in flight
    np.testing.assert_array_equal(got[0, 0], np.r_[a[16:22], np.zeros(10, np.uint8)])
    np.testing.assert_array_equal(got[0, 1], undefined)
    np.testing.assert_array_equal(got[0, 2], a[48:64])  # thread 1's second copy, after wait_all
    np.testing.assert_array_equal(got[1, 0], a[0:16])  # thread 0's first copy: all 16 bytes
    np.testing.assert_array_equal(got[1, 1], undefined)
    np.testing.assert_array_equal(got[1, 2], a[32:48])


def copy_kernel(instruction: str) -> str:
    return (
        HEAD
        + f"""
.visible .entry one(.param .u64 po, .param .u64 pa)
{{
  .shared .align 16 .b8 s[64];
  .reg .b32 %r<4>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [po];
  ld.param.u64 %rd2, [pa];
  mov.u32 %r1, s;
  {instruction}
  cp.async.wait_all;
  ld.shared.u32 %r2, [s];
  st.global.u32 [%rd1], %r2;
  ret;
}}
"""
    )


def test_a_zero_src_size_reads_nothing_and_zero_fills() -> None:
    """src-size 0 reads no global memory (the source address may lie past the end) and writes zeros."""
    text = copy_kernel("cp.async.ca.shared.global [%r1], [%rd2+4096], 4, 0;")
    np.testing.assert_array_equal(launch(text, "one", np.arange(16, dtype=np.uint8), 4, 1), np.zeros(4, np.uint8))


@pytest.mark.parametrize(
    ("instruction", "message"),
    [
        ("cp.async.cg.shared.global [%r1+4], [%rd2], 16;", "not aligned"),
        ("cp.async.ca.shared.global [%r1], [%rd2], 4, 8;", "src-size 8"),
    ],
)
def test_bad_copies_fault_naming_the_instruction(instruction: str, message: str) -> None:
    with pytest.raises(EmulatorError, match=message):
        launch(copy_kernel(instruction), "one", np.arange(16, dtype=np.uint8), 4, 1)


@pytest.mark.parametrize(
    "instruction",
    [
        "cp.async.cg.shared.global [%r1], [%rd2], 8;",  # .cg copies 16 bytes only
        "cp.async.ca.shared.global [%r1], [%rd2], 4, 4, %rd3;",  # a cache policy
        "cp.async.bulk.prefetch.L2.global [%rd2], 16;",
        "cp.async.wait_group %r1;",
    ],
)
def test_unknown_forms_raise_naming_the_opcode(instruction: str) -> None:
    with pytest.raises(EmulatorError, match=r"cp\.async"):
        load_ptx(copy_kernel(instruction))


# one warp: shared holds 512 halves, s[e] = e. Lane l names row address 16 * ROWS[l] bytes (a row of 8 halves each),
# loads the matrices with ldmatrix and stores its registers to out[l * count * 4 bytes ...].
ROWS = [(5 * lane + 3) % 64 for lane in range(32)]  # scattered rows: lane 8i + r names row ROWS[8i + r] of matrix i


def ldmatrix_kernel(shape: str, count: int) -> str:
    regs = ", ".join(f"%r{10 + i}" for i in range(count))
    stores = "\n".join(f"  st.global.u32 [%rd4+{4 * i}], %r{10 + i};" for i in range(count))
    return (
        HEAD
        + f"""
.visible .entry ldm(.param .u64 po, .param .u64 pa, .param .u64 prow)
{{
  .shared .align 16 .b8 s[1024];
  .reg .pred %p<2>;
  .reg .b32 %r<20>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [po];
  ld.param.u64 %rd2, [pa];
  ld.param.u64 %rd5, [prow];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, s;
  mul.wide.u32 %rd3, %r1, 4;
  mov.u32 %r4, 0;                        // fill shared from a: 4 bytes per thread and round, 8 rounds
$fill:
  mad.lo.u32 %r5, %r4, 32, %r1;
  mul.lo.u32 %r6, %r5, 4;
  cvt.u64.u32 %rd7, %r6;
  add.s64 %rd7, %rd2, %rd7;
  ld.global.u32 %r3, [%rd7];
  add.u32 %r7, %r2, %r6;
  st.shared.u32 [%r7], %r3;
  add.u32 %r4, %r4, 1;
  setp.lt.u32 %p1, %r4, 8;
  @%p1 bra $fill;
  bar.sync 0;
  add.s64 %rd6, %rd5, %rd3;
  ld.global.u32 %r8, [%rd6];             // this lane's row
  mad.lo.u32 %r9, %r8, 16, %r2;
  ldmatrix.sync.aligned.m8n8.{shape}.shared.b16 {{{regs}}}, [%r9];
  mul.wide.u32 %rd3, %r1, {4 * count};
  add.s64 %rd4, %rd1, %rd3;
{stores}
  ret;
}}
"""
    )


@pytest.mark.parametrize(("count", "trans"), [(1, False), (2, False), (4, False), (2, True), (4, True)])
def test_ldmatrix_gives_each_lane_its_elements(count: int, trans: bool) -> None:
    """Lane l gets in register i the halves of matrix i (rows named by lanes 8i..8i+7) at row l / 4, columns
    2 (l % 4) and 2 (l % 4) + 1 (.trans: rows 2 (l % 4) + j of column l / 4), worked out here lane by lane."""
    shape = f"x{count}{'.trans' if trans else ''}"
    text = ldmatrix_kernel(shape, count)
    mem = DeviceMemory()
    halves = np.arange(512, dtype=np.uint16)  # s[e] = e
    pa = mem.alloc(halves.nbytes)
    mem.write(pa, halves)
    prow = mem.alloc(32 * 4)
    mem.write(prow, np.array(ROWS, np.uint32))
    out = mem.alloc(32 * count * 4)
    load_ptx(text).launch("ldm", (1, 1, 1), (32, 1, 1), [out, pa, prow], mem)
    got = np.frombuffer(mem.read(out, 32 * count * 4), np.uint16).reshape(32, count, 2)
    for lane in range(32):
        for i in range(count):
            for j in range(2):
                r, c = (2 * (lane % 4) + j, lane // 4) if trans else (lane // 4, 2 * (lane % 4) + j)
                assert got[lane, i, j] == 8 * ROWS[8 * i + r] + c, (lane, i, j)


def test_ldmatrix_refuses_unaligned_rows_and_unknown_forms() -> None:
    bad = ldmatrix_kernel("x1", 1).replace("mad.lo.u32 %r9, %r8, 16, %r2;", "mad.lo.u32 %r9, %r8, 18, %r2;")
    mem = DeviceMemory()
    pa, prow, out = mem.alloc(1024), mem.alloc(128), mem.alloc(128)
    mem.write(prow, np.array(ROWS, np.uint32))
    with pytest.raises(EmulatorError, match="aligned"):
        load_ptx(bad).launch("ldm", (1, 1, 1), (32, 1, 1), [out, pa, prow], mem)
    with pytest.raises(EmulatorError, match="ldmatrix"):
        load_ptx(ldmatrix_kernel("x4", 4).replace("m8n8.x4", "m16n16.x4"))
