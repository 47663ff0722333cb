"""The code-object loader against clang-19's code objects, checked field by field with llvm-readelf-19."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from xgrad.errors import XgradError
from xgrad_amd.elf import (
    R_AMDGPU_RELATIVE64,
    CodeObjectError,
    KernelDescriptor,
    _msgpack,
    load_code_object,
)

CLANG, READELF, OBJDUMP = shutil.which("clang-19"), shutil.which("llvm-readelf-19"), shutil.which("llvm-objdump-19")
pytestmark = pytest.mark.skipif(
    not (CLANG and READELF and OBJDUMP), reason="clang-19 / llvm-readelf-19 / llvm-objdump-19 not installed"
)

SOURCE = r"""
__attribute__((constant)) float tbl[4] = {1.0f, 2.0f, 3.0f, 4.0f};
__attribute__((constant)) float tbl2[4] = {5.0f, 6.0f, 7.0f, 8.0f};
__attribute__((constant)) float* ptrs[2] = {tbl, tbl2};
extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(1, 256)))
void add(float* __restrict__ out, const float* __restrict__ a, const float* __restrict__ b, int n) {
  int i = __builtin_amdgcn_workgroup_id_x() * 256 + __builtin_amdgcn_workitem_id_x();
  if (i < n) out[i] = a[i] + b[i];
}
extern "C" __attribute__((global)) void ptab(float* out, int n, double d, char c) {
  __attribute__((shared)) float sh[64];
  int i = __builtin_amdgcn_workitem_id_x();
  sh[i & 63] = ptrs[n & 1][i & 3] + __builtin_amdgcn_workgroup_id_y() + __builtin_amdgcn_workitem_id_y();
  __builtin_amdgcn_s_barrier();
  out[i] = sh[(i + 1) & 63] * (float)d + c + __builtin_amdgcn_workgroup_id_z() + __builtin_amdgcn_workitem_id_z();
}
extern "C" __attribute__((global)) void sizes(unsigned* out) {
  const unsigned short* imp = (const unsigned short*)__builtin_amdgcn_implicitarg_ptr();
  const unsigned* imp32 = (const unsigned*)imp;
  int i = __builtin_amdgcn_workitem_id_x();
  if (i < 9) out[i] = i < 3 ? imp32[i] : imp[6 + (i - 3)];
}
"""


def hipcc(source: str, tmp: Path, arch: str = "gfx1100") -> bytes:
    src, out = tmp / "k.hip", tmp / "k.co"
    src.write_text(source)
    cmd = [CLANG, "-x", "hip", "--cuda-device-only", "-nogpulib", "-nogpuinc", "--no-gpu-bundle-output",
           f"--offload-arch={arch}", "-O3", str(src), "-o", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path]:
    tmp = tmp_path_factory.mktemp("elf")
    blob = hipcc(SOURCE, tmp)
    return blob, tmp / "k.co"


def readelf(path: Path, *flags: str) -> str:
    return subprocess.run([READELF, *flags, str(path)], check=True, capture_output=True, text=True).stdout


def test_symbols_and_sections_match_readelf(built: tuple[bytes, Path]) -> None:
    blob, path = built
    co = load_code_object(blob)
    text = readelf(path, "--symbols")
    symtab = text[text.index("Symbol table '.symtab'") :]
    rows = re.findall(r"^\s*\d+: ([0-9a-f]{16})\s+(\d+)\s+(\w+)\s+\w+\s+\w+\s+\S+\s*(\S*)$", symtab, re.M)
    expected = {name: (int(v, 16), int(size), typ) for v, size, typ, name in rows if name}
    got = {
        s.name: (s.value, s.size, {0: "NOTYPE", 1: "OBJECT", 2: "FUNC"}.get(s.type, "?")) for s in co.symbols if s.name
    }
    assert got == expected
    sections = readelf(path, "-S")
    for s in co.sections[1:]:
        assert re.search(rf"\] {re.escape(s.name)}\s+\w+\s+{s.addr:016x} {s.offset:06x} {s.size:06x}", sections), s


def test_relocations_match_readelf_and_are_applied(built: tuple[bytes, Path]) -> None:
    blob, path = built
    co = load_code_object(blob)
    rows = re.findall(r"^([0-9a-f]{16})\s+([0-9a-f]{16})\s+(R_AMDGPU_\w+)\s+([0-9a-f]+)", readelf(path, "-r"), re.M)
    assert len(rows) == 2 and len(co.relocations) == 2
    for r, (off, _info, _rtype, addend) in zip(co.relocations, rows, strict=True):
        assert (r.offset, r.type, r.addend) == (int(off, 16), R_AMDGPU_RELATIVE64, int(addend, 16))
    tbl = next(s for s in co.symbols if s.name == "tbl")
    tbl2 = next(s for s in co.symbols if s.name == "tbl2")
    ptrs = next(s for s in co.symbols if s.name == "ptrs")
    base = 0x7F12_3400_0000
    img = co.image(base)
    assert struct.unpack_from("<QQ", img, ptrs.value) == (base + tbl.value, base + tbl2.value)
    assert struct.unpack_from("<4f", img, tbl2.value) == (5.0, 6.0, 7.0, 8.0)
    assert len(img) == co.image_size


def test_descriptor_fields_match_readelf_and_disassembly(built: tuple[bytes, Path]) -> None:
    blob, path = built
    co = load_code_object(blob)
    assert co.target == "amdgcn-amd-amdhsa--gfx1100"
    assert set(co.kernels) == {"add", "ptab", "sizes"}
    add, ptab = co.kernels["add"], co.kernels["ptab"]
    # code: the bytes of the FUNC symbol, as llvm-objdump prints them
    dis = subprocess.run([OBJDUMP, "-d", str(path)], check=True, capture_output=True, text=True).stdout
    first = re.search(r"<add>:\n\s+\S.*// ([0-9A-F]{12}): ([0-9A-F]{8})", dis)
    assert first is not None
    assert add.code_offset == int(first.group(1), 16)
    assert add.code[:4] == int(first.group(2), 16).to_bytes(4, "little")
    func = next(s for s in co.symbols if s.name == "add")
    assert len(add.code) == func.size and add.code_offset == func.value
    d = add.descriptor
    assert d.wavefront_size32 and d.enable_sgpr_kernarg_segment_ptr and d.enable_sgpr_workgroup_id_x
    assert not d.enable_sgpr_workgroup_id_y and d.enable_vgpr_workitem_id == 0
    assert d.kernarg_size == add.kernarg_size == 28
    assert d.group_segment_fixed_size == 0 and add.lds_size == 0
    # ptab: workgroup id y/z, all three work-item ids, LDS of 64 floats
    p = ptab.descriptor
    assert p.enable_sgpr_workgroup_id_y and p.enable_sgpr_workgroup_id_z and p.enable_vgpr_workitem_id == 2
    assert ptab.lds_size == p.group_segment_fixed_size == 256
    # the granule fields agree with the metadata's VGPR count (granule of 8 in wave32)
    for k in co.kernels.values():
        g = k.descriptor.granulated_workitem_vgpr_count
        assert g * 8 < max(k.vgpr_count, 1) <= (g + 1) * 8
        assert k.descriptor.user_sgpr_count >= 2
        assert k.spills == (0, 0) and k.wave_size == 32
    # the notes as llvm-readelf decodes them
    notes = readelf(path, "--notes")
    for name, k in co.kernels.items():
        block = notes[notes.index(f".name:           {name}\n") - 600 : notes.index(f".name:           {name}\n")]
        assert f".kernarg_segment_size: {k.kernarg_size}\n" in block
        assert re.findall(r"\.vgpr_count:\s+(\d+)", notes[notes.index(f".name:           {name}\n") :])[0] == str(
            k.vgpr_count
        )
    assert add.max_flat_workgroup_size == 256
    assert add.args[:4] == [(0, 8, "global_buffer"), (8, 8, "global_buffer"), (16, 8, "global_buffer"),
                            (24, 4, "by_value")]  # fmt: skip


def test_pack_kernargs_places_explicit_and_hidden_args(built: tuple[bytes, Path]) -> None:
    co = load_code_object(built[0])
    ptab = co.kernels["ptab"]
    raw = ptab.pack_kernargs([0x1_0000_0100, -3, 2.5, 7], grid=(4, 5, 6), block=(8, 2, 3))
    assert len(raw) == ptab.kernarg_size == 28
    assert struct.unpack_from("<Qi", raw, 0) == (0x1_0000_0100, -3)
    assert struct.unpack_from("<d", raw, 16) == (2.5,)
    assert raw[24] == 7
    sizes = co.kernels["sizes"]  # reads the implicit arguments, so the metadata lists the hidden ones
    kinds = {kind: (off, size) for off, size, kind in sizes.args}
    raw = sizes.pack_kernargs([0x1_0000_0100], grid=(4, 5, 6), block=(8, 2, 3), dynamic_lds=128)
    assert len(raw) == sizes.kernarg_size == 264
    assert struct.unpack_from("<III", raw, kinds["hidden_block_count_x"][0]) == (4, 5, 6)
    assert struct.unpack_from("<HHH", raw, kinds["hidden_group_size_x"][0]) == (8, 2, 3)
    assert struct.unpack_from("<HHH", raw, kinds["hidden_remainder_x"][0]) == (0, 0, 0)
    assert struct.unpack_from("<QQQ", raw, kinds["hidden_global_offset_x"][0]) == (0, 0, 0)
    assert struct.unpack_from("<H", raw, kinds["hidden_grid_dims"][0]) == (3,)
    assert struct.unpack_from("<Q", raw, kinds["hidden_hostcall_buffer"][0]) == (0,)
    raw = sizes.pack_kernargs([0], grid=(4, 1, 1), block=(8, 1, 1))
    assert struct.unpack_from("<H", raw, kinds["hidden_grid_dims"][0]) == (1,)


def test_pack_kernargs_rejects_wrong_arguments(built: tuple[bytes, Path]) -> None:
    add = load_code_object(built[0]).kernels["add"]
    with pytest.raises(CodeObjectError, match="takes 4 explicit arguments"):
        add.pack_kernargs([1, 2], (1, 1, 1), (32, 1, 1))
    with pytest.raises(CodeObjectError, match="does not fit"):
        add.pack_kernargs([1, 2, 3, 1 << 40], (1, 1, 1), (32, 1, 1))
    with pytest.raises(CodeObjectError, match="max_flat_workgroup_size 256"):
        add.pack_kernargs([1, 2, 3, 4], (1, 1, 1), (512, 1, 1))
    with pytest.raises(CodeObjectError, match="must be >= 1"):
        add.pack_kernargs([1, 2, 3, 4], (1, 1, 1), (0, 1, 1))
    with pytest.raises(CodeObjectError, match="must be >= 1"):
        add.pack_kernargs([1, 2, 3, 4], (-1, 1, 1), (32, 1, 1))
    assert len(add.pack_kernargs([1, 2, 3, 4], (0, 1, 1), (32, 1, 1))) == 28  # an empty grid launches nothing


def test_bad_input_raises_code_object_error(built: tuple[bytes, Path]) -> None:
    assert issubclass(CodeObjectError, XgradError)
    with pytest.raises(CodeObjectError, match="not an ELF"):
        load_code_object(b"hello world")
    blob = bytearray(built[0])
    blob[18:20] = (62).to_bytes(2, "little")  # EM_X86_64
    with pytest.raises(CodeObjectError, match="not EM_AMDGPU"):
        load_code_object(bytes(blob))
    with pytest.raises(CodeObjectError, match="corrupt"):
        load_code_object(built[0][:200])
    with pytest.raises(CodeObjectError, match="64 bytes"):
        KernelDescriptor.decode(b"\0" * 10)


def test_msgpack_decoder_reads_every_type() -> None:
    # hand-encoded per the msgpack spec: fixmap{"a": [1, -1, 200, -200, 70000, 1.5, true, nil, "xy"]}
    raw = bytes([0x81, 0xA1, ord("a"), 0x99, 0x01, 0xFF, 0xCC, 200, 0xD1]) + struct.pack(">h", -200)
    raw += bytes([0xCE]) + struct.pack(">I", 70000) + bytes([0xCB]) + struct.pack(">d", 1.5)
    raw += bytes([0xC3, 0xC0, 0xD9, 2]) + b"xy"
    value, end = _msgpack(raw)
    assert value == {"a": [1, -1, 200, -200, 70000, 1.5, True, None, "xy"]} and end == len(raw)
    with pytest.raises(CodeObjectError, match="0xc1"):
        _msgpack(bytes([0xC1]))


@pytest.mark.parametrize("arch", ["gfx942", "gfx1201"])
def test_other_archs_load(tmp_path: Path, arch: str) -> None:
    co = load_code_object(hipcc(SOURCE, tmp_path, arch))
    assert co.target.endswith(arch)
    assert co.kernels["add"].wave_size == (64 if arch == "gfx942" else 32)
    assert co.kernels["add"].code[-4:] in (bytes.fromhex("0000b0bf"), bytes.fromhex("0000 81bf"))
