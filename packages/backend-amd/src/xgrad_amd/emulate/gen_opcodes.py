"""Regenerates `opcodes.py`, the gfx11 opcode table, from LLVM's own disassembler (a developer tool, not imported by
the emulator): `python -m xgrad_amd.emulate.gen_opcodes > opcodes.py` with llvm-mc-19 on PATH.

For every encoding it builds one instruction per opcode value with registers in every operand field (v3 dst, v0/v1/v2
or s0/s2/s4 sources), has `llvm-mc-19 --disassemble -mcpu=gfx1100` print it, and records the mnemonic and the
printed register widths (v[3:4] is 2 dwords). Those widths tell the executor how many dwords each operand moves.
"""

from __future__ import annotations

import re
import shutil
import subprocess

MASKS = {  # the bits that name the encoding and the opcode, and the instruction's size in bytes
    "SOP2": (0xFF800000, 4), "SOPK": (0xFF800000, 4), "SOP1": (0xFF80FF00, 4), "SOPC": (0xFFFF0000, 4),
    "SOPP": (0xFFFF0000, 4), "SMEM": (0xFFFC0000, 8), "VOP2": (0xFE000000, 4), "VOP1": (0xFE01FE00, 4),
    "VOPC": (0xFFFE0000, 4), "VOP3": (0xFFFF0000, 8), "VOP3P": (0xFFFF0000, 8), "DS": (0xFFFC0000, 8),
    "FLAT": (0xFFFF0000, 8), "MUBUF": (0xFFFC0000, 8), "SCRATCH": (0xFFFF0000, 8), "GLOBAL": (0xFFFF0000, 8),
}  # fmt: skip


def _candidates() -> dict[str, list[tuple[int, list[list[int]]]]]:
    """Per encoding: (opcode, instruction word variants to try; the first that decodes wins)."""
    out: dict[str, list[tuple[int, list[list[int]]]]] = {}
    out["SOP2"] = [(op, [[0x80000000 | op << 23 | 3 << 16 | 4 << 8 | 2]]) for op in range(0x60)]
    out["SOPK"] = [(op, [[0xB0000000 | op << 23 | 3 << 16 | 0x10]]) for op in range(29)]
    out["SOP1"] = [(op, [[0xBE800000 | 4 << 16 | op << 8 | 2]]) for op in range(256)]
    out["SOPC"] = [(op, [[0xBF000000 | op << 16 | 4 << 8 | 2]]) for op in range(128)]
    out["SOPP"] = [(op, [[0xBF800000 | op << 16 | 0x10], [0xBF800000 | op << 16]]) for op in range(128)]
    out["SMEM"] = [(op, [[0xF4000000 | op << 18 | 8 << 6 | 2, 0xF8000010]]) for op in range(256)]
    # a second variant carries a literal dword (v_fmamk_f32 and the like always have one)
    out["VOP2"] = [(op, [[op << 25 | 4 << 17 | 2 << 9 | 256], [op << 25 | 4 << 17 | 2 << 9 | 256, 0x3F800000]])
                   for op in range(62)]  # fmt: skip
    out["VOP1"] = [(op, [[0x7E000000 | 4 << 17 | op << 9 | 256]]) for op in range(256)]
    out["VOPC"] = [(op, [[0x7C000000 | op << 17 | 2 << 9 | 256]]) for op in range(256)]
    v3 = [256 | 258 << 9, 256, 0, 256 | 258 << 9 | 260 << 18]  # src2 = s0 first: a 3-source op still shows it
    out["VOP3"] = [(op, [[0xD4000000 | op << 16 | 8, w] for w in v3]) for op in range(1024)]
    v3p = [256 | 264 << 9 | 272 << 18 | h << 27 for h in (3, 0)] + [256 | 264 << 9 | h << 27 for h in (3, 0)]
    out["VOP3P"] = [(op, [[0xCC000000 | op << 16 | 8, w] for w in v3p]) for op in range(128)]
    ds = [0x08040200, 0x08000200, 0x08000000, 0x00040200, 0x00000200, 0x00000000, 0x08040000]
    out["DS"] = [(op, [[0xD8000000 | op << 18, w] for w in ds]) for op in range(256)]
    for seg, name in ((0, "FLAT"), (1, "SCRATCH"), (2, "GLOBAL")):
        fl = [0x087C0402, 0x007C0402, 0x087C0002, 0x08000402, 0x00000402, 0x08000002, 0x087C0400]
        out[name] = [(op, [[0xDC000000 | seg << 16 | op << 18, w] for w in fl]) for op in range(128)]
    out["MUBUF"] = [(op, [[0xE0000000 | op << 18, 0], [0xE0000000 | op << 18, 0x00000201]]) for op in range(256)]
    return out


def _disassemble(words: list[list[int]], size: int, mask: int) -> dict[int, tuple[str, str]]:
    """Decode each instruction; returns masked first dword -> (mnemonic, operands) for those llvm accepts."""
    mc = shutil.which("llvm-mc-19")
    if mc is None:
        raise SystemExit("llvm-mc-19 is needed to regenerate the opcode table")
    lines = [",".join(f"0x{b:02x}" for w in ws for b in w.to_bytes(4, "little")) for ws in words]
    cmd = [mc, "--disassemble", "-triple=amdgcn", "-mcpu=gfx1100", "-show-encoding"]
    text = subprocess.run(cmd, input="\n".join(lines), capture_output=True, text=True).stdout
    res: dict[int, tuple[str, str]] = {}
    for line in text.splitlines():
        m = re.match(r"\s+(\S+)\s*(.*?)\s*; encoding: \[(.*)\]", line)
        if m:
            enc = bytes(int(x, 16) for x in m.group(3).split(","))
            if len(enc) >= size:
                res.setdefault(int.from_bytes(enc[:4], "little") & mask, (m.group(1), m.group(2)))
    return res


def _widths(operands: str) -> tuple[int, ...]:
    """Dwords of each printed operand before the modifiers: v3 -> 1, v[3:4] -> 2, s[4:7] -> 4, others 1."""
    out = []
    for tok in re.findall(r"[vs]\[\d+:\d+\]|[^,\s\[]+(?:\[[^\]]*\])?", operands):
        if ":" in tok and not tok.startswith(("v[", "s[")):
            break  # offset:, op_sel:[...], ... : modifiers follow the operands
        m = re.match(r"[vs]\[(\d+):(\d+)\]", tok)
        out.append(int(m.group(2)) - int(m.group(1)) + 1 if m else 1)
    return tuple(out)


def generate() -> dict[str, dict[int, tuple[str, tuple[int, ...]]]]:
    """The table: encoding -> opcode -> (mnemonic without _e32/_e64, operand widths as printed)."""
    table: dict[str, dict[int, tuple[str, tuple[int, ...]]]] = {}
    for enc, ops in _candidates().items():
        mask, size = MASKS[enc]
        table[enc] = {}
        for variant in range(max(len(v) for _, v in ops)):
            todo = [(op, vs[variant]) for op, vs in ops if op not in table[enc] and variant < len(vs)]
            decoded = _disassemble([ws for _, ws in todo], size, mask)
            for op, ws in todo:
                hit = decoded.get(ws[0] & mask)
                if hit is not None:
                    table[enc][op] = (re.sub(r"_e(32|64)$", "", hit[0]), _widths(hit[1]))
    table["VOPDX"], table["VOPDY"] = _vopd()
    table["VOP3"][865] = ("v_writelane_b32", (1, 1, 1))  # its tied VGPR input makes llvm-mc print extra fields
    return table


def _vopd() -> tuple[dict[int, tuple[str, tuple[int, ...]]], dict[int, tuple[str, tuple[int, ...]]]]:
    """VOPD (dual issue): opX is 4 bits, opY 5; every pair is tried."""
    mc = shutil.which("llvm-mc-19")
    if mc is None:
        raise SystemExit("llvm-mc-19 is needed to regenerate the opcode table")
    lines = []
    for x in range(16):
        for y in range(32):
            for x1, y1 in ((257, 259), (0, 259), (257, 0), (0, 0)):  # a one-source op needs its vsrc1 field 0
                w0 = 0xC8000000 | x << 22 | y << 17 | x1 << 9 & 0x1FE00 | 256
                w1 = 4 << 24 | 2 << 17 | y1 << 9 & 0x1FE00 | 258  # vdstX v4, vdstY v5, srcY0 v2, vsrcY1 v3
                lines.append(",".join(f"0x{b:02x}" for w in (w0, w1) for b in w.to_bytes(4, "little")))
    cmd = [mc, "--disassemble", "-triple=amdgcn", "-mcpu=gfx1100", "-show-encoding"]
    text = subprocess.run(cmd, input="\n".join(lines), capture_output=True, text=True).stdout
    xs: dict[int, tuple[str, tuple[int, ...]]] = {}
    ys: dict[int, tuple[str, tuple[int, ...]]] = {}
    for line in text.splitlines():
        m = re.match(r"\s+(v_dual_\S+)\s*(.*?)\s*::\s*(v_dual_\S+)\s*(.*?)\s*; encoding: \[(.*)\]", line)
        if m:
            w0 = int.from_bytes(bytes(int(v, 16) for v in m.group(5).split(",")[:4]), "little")
            x, y = w0 >> 22 & 0xF, w0 >> 17 & 0x1F
            xs[x] = (m.group(1), _widths(m.group(2)))
            ys[y] = (m.group(3), _widths(m.group(4)))
    return xs, ys


def main() -> None:
    """Print opcodes.py."""
    table = generate()
    print(
        '"""gfx11 (RDNA3) opcode table: encoding -> opcode -> (mnemonic, dwords of each operand as llvm prints them).'
    )
    print()
    print("Generated by gen_opcodes.py from llvm-mc-19's gfx1100 disassembler; do not edit by hand.")
    print('"""')
    print()
    print("OPCODES: dict[str, dict[int, tuple[str, tuple[int, ...]]]] = {")
    for enc, ops in table.items():
        print(f"    {enc!r}: {{")
        for op, (name, widths) in sorted(ops.items()):
            print(f"        {op}: ({name!r}, {widths!r}),")
        print("    },")
    print("}")


if __name__ == "__main__":
    main()
