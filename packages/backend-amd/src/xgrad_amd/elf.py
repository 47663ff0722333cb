"""The HSA code-object loader: what a runtime needs to launch the kernels clang-19 built for an AMD GPU.

In: the bytes of an HSA code object (an ELF64 shared object for EM_AMDGPU, as `clang -x hip --cuda-device-only
--no-gpu-bundle-output` writes it). Out: a `CodeObject` with its sections, symbols, dynamic relocations, loadable
image (relocated for any base address) and, per kernel, the decoded 64-byte kernel descriptor (`<name>.kd`), the
`amdhsa.kernels` entry of the NT_AMDGPU_METADATA note (msgpack, decoded here without a dependency) and
`pack_kernargs`, which lays out the kernel's argument segment: the explicit arguments at their offsets and the
hidden arguments (block counts, group sizes, remainders, ...) the metadata asks for.

Layouts follow LLVM's AMDGPUUsage document (code object V4/V5, "Kernel Descriptor" and "AMDGPU Metadata").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from xgrad.errors import XgradError

EM_AMDGPU = 224
NT_AMDGPU_METADATA = 32
SHT_SYMTAB, SHT_NOTE, SHT_RELA, SHT_NOBITS, SHT_DYNSYM = 2, 7, 4, 8, 11
PT_LOAD = 1
DESCRIPTOR_SIZE = 64


class CodeObjectError(XgradError, ValueError):
    """The bytes are not an AMDGPU code object this loader can read, or a kernel or argument does not fit it."""


# ---------------------------------------------------------------------------------------------------- ELF structure
@dataclass(frozen=True)
class Section:
    """One section header (name resolved)."""

    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    """One symbol of .symtab/.dynsym: `type` is STT_* (0 notype, 1 object, 2 func), `bind` is STB_*."""

    name: str
    value: int
    size: int
    type: int
    bind: int
    shndx: int


@dataclass(frozen=True)
class Relocation:
    """One RELA entry: where (`offset`, a virtual address), R_AMDGPU_* `type`, the symbol (name and value; value None
    when the symbol is undefined) and the addend."""

    offset: int
    type: int
    symbol: str
    symbol_value: int | None
    addend: int


@dataclass(frozen=True)
class Segment:
    """A PT_LOAD program header: file bytes [offset, offset+filesz) go to vaddr, the rest up to memsz is zero."""

    offset: int
    vaddr: int
    filesz: int
    memsz: int
    flags: int


# R_AMDGPU_* relocation types (AMDGPUUsage, "Relocation Records")
R_AMDGPU_ABS32_LO, R_AMDGPU_ABS32_HI, R_AMDGPU_ABS64, R_AMDGPU_REL32, R_AMDGPU_REL64 = 1, 2, 3, 4, 5
R_AMDGPU_ABS32, R_AMDGPU_REL32_LO, R_AMDGPU_REL32_HI, R_AMDGPU_RELATIVE64, R_AMDGPU_REL16 = 6, 10, 11, 13, 14


def _relocated_value(rtype: int, s: int, a: int, p: int, base: int) -> tuple[int, int]:
    """(value, width in bytes) that relocation `rtype` writes, with S symbol address, A addend, P place, B base."""
    table = {
        R_AMDGPU_ABS32_LO: ((s + a) & 0xFFFFFFFF, 4),
        R_AMDGPU_ABS32_HI: (((s + a) >> 32) & 0xFFFFFFFF, 4),
        R_AMDGPU_ABS64: (s + a, 8),
        R_AMDGPU_REL32: (s + a - p, 4),
        R_AMDGPU_REL64: (s + a - p, 8),
        R_AMDGPU_ABS32: (s + a, 4),
        R_AMDGPU_REL32_LO: ((s + a - p) & 0xFFFFFFFF, 4),
        R_AMDGPU_REL32_HI: (((s + a - p) >> 32) & 0xFFFFFFFF, 4),
        R_AMDGPU_RELATIVE64: (base + a, 8),
        R_AMDGPU_REL16: (((s + a - p) - 4) // 4, 2),
    }
    if rtype not in table:
        raise CodeObjectError(
            f"relocation type {rtype} is not an R_AMDGPU_* type this loader applies; "
            "rebuild the code object with clang-19/ld.lld-19 (-O3, no PIC tricks)"
        )
    value, width = table[rtype]
    return value & ((1 << (8 * width)) - 1), width


# ----------------------------------------------------------------------------------------------- msgpack (decode)
def _msgpack(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decode one msgpack value at `pos`; returns (value, next position). Covers every type the AMDGPU note uses."""
    b = buf[pos]
    pos += 1
    if b <= 0x7F:
        return b, pos
    if b >= 0xE0:
        return b - 0x100, pos
    if 0x80 <= b <= 0x8F:
        return _msgpack_map(buf, pos, b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return _msgpack_array(buf, pos, b & 0x0F)
    if 0xA0 <= b <= 0xBF:
        n = b & 0x1F
        return buf[pos : pos + n].decode(), pos + n
    fixed: dict[int, tuple[str, int]] = {
        0xCC: ("<B", 1), 0xCD: (">H", 2), 0xCE: (">I", 4), 0xCF: (">Q", 8),
        0xD0: (">b", 1), 0xD1: (">h", 2), 0xD2: (">i", 4), 0xD3: (">q", 8),
        0xCA: (">f", 4), 0xCB: (">d", 8),
    }  # fmt: skip
    if b in fixed:
        fmt, n = fixed[b]
        return struct.unpack_from(fmt, buf, pos)[0], pos + n
    if b in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[b], pos
    lengths = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4, 0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4}
    if b in lengths:
        w = lengths[b]
        n = int.from_bytes(buf[pos : pos + w], "big")
        pos += w
        if b in (0xD9, 0xDA, 0xDB):
            return buf[pos : pos + n].decode(), pos + n
        if b in (0xC4, 0xC5, 0xC6):
            return bytes(buf[pos : pos + n]), pos + n
        if b in (0xDC, 0xDD):
            return _msgpack_array(buf, pos, n)
        return _msgpack_map(buf, pos, n)
    raise CodeObjectError(f"the AMDGPU metadata note holds msgpack type byte {b:#04x}, which this loader does not read")


def _msgpack_array(buf: bytes, pos: int, n: int) -> tuple[list[Any], int]:
    out = []
    for _ in range(n):
        v, pos = _msgpack(buf, pos)
        out.append(v)
    return out, pos


def _msgpack_map(buf: bytes, pos: int, n: int) -> tuple[dict[Any, Any], int]:
    out = {}
    for _ in range(n):
        k, pos = _msgpack(buf, pos)
        v, pos = _msgpack(buf, pos)
        out[k] = v
    return out, pos


# --------------------------------------------------------------------------------------------- kernel descriptor
def _bits(word: int, lo: int, width: int) -> int:
    return (word >> lo) & ((1 << width) - 1)


@dataclass(frozen=True)
class KernelDescriptor:
    """The 64-byte `<name>.kd` record, with compute_pgm_rsrc1/2/3 and kernel_code_properties split into fields
    (gfx10+/gfx11 meanings). `kernel_code_entry_byte_offset` is relative to the descriptor's own address."""

    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    kernel_code_entry_byte_offset: int
    compute_pgm_rsrc1: int
    compute_pgm_rsrc2: int
    compute_pgm_rsrc3: int
    kernel_code_properties: int
    kernarg_preload: int
    # compute_pgm_rsrc1
    granulated_workitem_vgpr_count: int
    granulated_wavefront_sgpr_count: int
    float_round_mode_32: int
    float_round_mode_16_64: int
    float_denorm_mode_32: int
    float_denorm_mode_16_64: int
    enable_dx10_clamp: bool
    enable_ieee_mode: bool
    fp16_overflow: bool
    workgroup_processor_mode: bool
    mem_ordered: bool
    forward_progress: bool
    # compute_pgm_rsrc2
    enable_private_segment: bool
    user_sgpr_count: int
    enable_trap_handler: bool
    enable_sgpr_workgroup_id_x: bool
    enable_sgpr_workgroup_id_y: bool
    enable_sgpr_workgroup_id_z: bool
    enable_sgpr_workgroup_info: bool
    enable_vgpr_workitem_id: int  # 0: x only, 1: x and y, 2: x, y and z (packed in v0 on gfx11)
    granulated_lds_size: int
    # compute_pgm_rsrc3 (gfx10/gfx11)
    shared_vgpr_count: int
    inst_pref_size: int
    # kernel_code_properties
    enable_sgpr_private_segment_buffer: bool
    enable_sgpr_dispatch_ptr: bool
    enable_sgpr_queue_ptr: bool
    enable_sgpr_kernarg_segment_ptr: bool
    enable_sgpr_dispatch_id: bool
    enable_sgpr_flat_scratch_init: bool
    enable_sgpr_private_segment_size: bool
    wavefront_size32: bool
    uses_dynamic_stack: bool

    @classmethod
    def decode(cls, raw: bytes) -> KernelDescriptor:
        """Decode the 64 bytes of a kernel descriptor."""
        if len(raw) != DESCRIPTOR_SIZE:
            raise CodeObjectError(f"a kernel descriptor is {DESCRIPTOR_SIZE} bytes, got {len(raw)}")
        group, private, kernarg = struct.unpack_from("<III", raw, 0)
        (entry,) = struct.unpack_from("<q", raw, 16)
        rsrc3, rsrc1, rsrc2 = struct.unpack_from("<III", raw, 44)
        props, preload = struct.unpack_from("<HH", raw, 56)
        return cls(
            group_segment_fixed_size=group,
            private_segment_fixed_size=private,
            kernarg_size=kernarg,
            kernel_code_entry_byte_offset=entry,
            compute_pgm_rsrc1=rsrc1,
            compute_pgm_rsrc2=rsrc2,
            compute_pgm_rsrc3=rsrc3,
            kernel_code_properties=props,
            kernarg_preload=preload,
            granulated_workitem_vgpr_count=_bits(rsrc1, 0, 6),
            granulated_wavefront_sgpr_count=_bits(rsrc1, 6, 4),
            float_round_mode_32=_bits(rsrc1, 12, 2),
            float_round_mode_16_64=_bits(rsrc1, 14, 2),
            float_denorm_mode_32=_bits(rsrc1, 16, 2),
            float_denorm_mode_16_64=_bits(rsrc1, 18, 2),
            enable_dx10_clamp=bool(_bits(rsrc1, 21, 1)),
            enable_ieee_mode=bool(_bits(rsrc1, 23, 1)),
            fp16_overflow=bool(_bits(rsrc1, 26, 1)),
            workgroup_processor_mode=bool(_bits(rsrc1, 29, 1)),
            mem_ordered=bool(_bits(rsrc1, 30, 1)),
            forward_progress=bool(_bits(rsrc1, 31, 1)),
            enable_private_segment=bool(_bits(rsrc2, 0, 1)),
            user_sgpr_count=_bits(rsrc2, 1, 5),
            enable_trap_handler=bool(_bits(rsrc2, 6, 1)),
            enable_sgpr_workgroup_id_x=bool(_bits(rsrc2, 7, 1)),
            enable_sgpr_workgroup_id_y=bool(_bits(rsrc2, 8, 1)),
            enable_sgpr_workgroup_id_z=bool(_bits(rsrc2, 9, 1)),
            enable_sgpr_workgroup_info=bool(_bits(rsrc2, 10, 1)),
            enable_vgpr_workitem_id=_bits(rsrc2, 11, 2),
            granulated_lds_size=_bits(rsrc2, 15, 9),
            shared_vgpr_count=_bits(rsrc3, 0, 4),
            inst_pref_size=_bits(rsrc3, 4, 6),
            enable_sgpr_private_segment_buffer=bool(_bits(props, 0, 1)),
            enable_sgpr_dispatch_ptr=bool(_bits(props, 1, 1)),
            enable_sgpr_queue_ptr=bool(_bits(props, 2, 1)),
            enable_sgpr_kernarg_segment_ptr=bool(_bits(props, 3, 1)),
            enable_sgpr_dispatch_id=bool(_bits(props, 4, 1)),
            enable_sgpr_flat_scratch_init=bool(_bits(props, 5, 1)),
            enable_sgpr_private_segment_size=bool(_bits(props, 6, 1)),
            wavefront_size32=bool(_bits(props, 10, 1)),
            uses_dynamic_stack=bool(_bits(props, 11, 1)),
        )

    @property
    def wave_size(self) -> int:
        """32 or 64 lanes per wave."""
        return 32 if self.wavefront_size32 else 64

    @property
    def vgpr_granules_count(self) -> int:
        """VGPRs allocated per lane implied by the granule field (wave32 granule 8 on gfx10+/gfx11, wave64 4)."""
        return (self.granulated_workitem_vgpr_count + 1) * (8 if self.wavefront_size32 else 4)


# --------------------------------------------------------------------------------------------------- hidden args
# sizes of the code-object V5 hidden arguments that pack_kernargs fills with values (others are written as zero)
_HIDDEN_BLOCK_COUNT = ("hidden_block_count_x", "hidden_block_count_y", "hidden_block_count_z")
_HIDDEN_GROUP_SIZE = ("hidden_group_size_x", "hidden_group_size_y", "hidden_group_size_z")
_HIDDEN_REMAINDER = ("hidden_remainder_x", "hidden_remainder_y", "hidden_remainder_z")
_HIDDEN_GLOBAL_OFFSET = ("hidden_global_offset_x", "hidden_global_offset_y", "hidden_global_offset_z")
SHARED_APERTURE_HI = 0x10000000  # hidden_shared_base: high 32 bits of flat addresses that fall in LDS
PRIVATE_APERTURE_HI = 0x20000000  # hidden_private_base: the same for scratch


@dataclass
class Kernel:
    """One kernel: its descriptor, its metadata entry and where its machine code lies in the loaded image."""

    name: str
    descriptor: KernelDescriptor
    descriptor_offset: int  # virtual address of `<name>.kd` in the image
    meta: dict[str, Any]
    code: bytes
    code_offset: int  # virtual address of the first instruction in the image
    args: list[tuple[int, int, str]] = field(default_factory=list)  # (offset, size, value_kind)

    @property
    def kernarg_size(self) -> int:
        """Bytes of the kernel argument segment (metadata `.kernarg_segment_size`, else the descriptor's)."""
        return int(self.meta.get(".kernarg_segment_size", self.descriptor.kernarg_size))

    @property
    def lds_size(self) -> int:
        """Bytes of LDS (group segment) the kernel uses before any dynamic LDS."""
        return int(self.meta.get(".group_segment_fixed_size", self.descriptor.group_segment_fixed_size))

    @property
    def vgpr_count(self) -> int:
        """VGPRs per lane the compiler reports (metadata `.vgpr_count`)."""
        return int(self.meta.get(".vgpr_count", self.descriptor.vgpr_granules_count))

    @property
    def sgpr_count(self) -> int:
        """SGPRs the compiler reports (metadata `.sgpr_count`)."""
        return int(self.meta.get(".sgpr_count", 0))

    @property
    def spills(self) -> tuple[int, int]:
        """(VGPR spills, SGPR spills) from the metadata."""
        return int(self.meta.get(".vgpr_spill_count", 0)), int(self.meta.get(".sgpr_spill_count", 0))

    @property
    def wave_size(self) -> int:
        """Lanes per wave (metadata `.wavefront_size`, else the descriptor's wave32 bit)."""
        return int(self.meta.get(".wavefront_size", self.descriptor.wave_size))

    @property
    def max_flat_workgroup_size(self) -> int:
        """The most work-items one workgroup may have (metadata; 1024 when absent)."""
        return int(self.meta.get(".max_flat_workgroup_size", 1024))

    def pack_kernargs(
        self,
        explicit: list[int | float | bytes],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        dynamic_lds: int = 0,
    ) -> bytes:
        """The kernarg segment: `explicit` values (pointers and ints as integers, floats, or raw bytes) in the order
        of the non-hidden `.args`, then the hidden ones (`grid` in workgroups, `block` in work-items per workgroup)."""
        if len(block) != 3 or len(grid) != 3:
            raise CodeObjectError(f"grid and block are (x, y, z) triples, got grid={grid} block={block}")
        if any(b < 1 for b in block) or any(g < 0 for g in grid):  # an empty grid (a zero-size tensor) runs nothing
            raise CodeObjectError(f"block {block} must be >= 1 and grid {grid} >= 0 in every dimension")
        if block[0] * block[1] * block[2] > self.max_flat_workgroup_size:
            raise CodeObjectError(
                f"kernel {self.name}: a block of {block} is {block[0] * block[1] * block[2]} work-items, over its "
                f"max_flat_workgroup_size {self.max_flat_workgroup_size}; launch smaller blocks"
            )
        buf = bytearray(self.kernarg_size)
        visible = [a for a in self.args if not a[2].startswith("hidden_")]
        if len(explicit) != len(visible):
            raise CodeObjectError(
                f"kernel {self.name} takes {len(visible)} explicit arguments "
                f"({', '.join(f'{k}@{o}' for o, _, k in visible)}), got {len(explicit)}"
            )
        for (offset, size, kind), value in zip(visible, explicit, strict=True):
            buf[offset : offset + size] = _arg_bytes(self.name, offset, size, kind, value)
        hidden: dict[str, int] = {"hidden_grid_dims": 3 if grid[2] > 1 else 2 if grid[1] > 1 else 1}
        hidden |= {"hidden_dynamic_lds_size": dynamic_lds, "hidden_shared_base": SHARED_APERTURE_HI}
        hidden |= {"hidden_private_base": PRIVATE_APERTURE_HI}
        for i in range(3):
            hidden[_HIDDEN_BLOCK_COUNT[i]] = grid[i]
            hidden[_HIDDEN_GROUP_SIZE[i]] = block[i]
            hidden[_HIDDEN_REMAINDER[i]] = 0  # grids here are whole workgroups: the last one is never partial
            hidden[_HIDDEN_GLOBAL_OFFSET[i]] = 0
        for offset, size, kind in self.args:
            if kind.startswith("hidden_"):
                value = hidden.get(kind, 0)  # pointers to runtime services (hostcall, printf, queue): none here
                buf[offset : offset + size] = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
        return bytes(buf)


def _arg_bytes(kernel: str, offset: int, size: int, kind: str, value: int | float | bytes) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        if len(value) != size:
            raise CodeObjectError(f"kernel {kernel}: argument at offset {offset} is {size} bytes, got {len(value)}")
        return bytes(value)
    if isinstance(value, float):
        if size not in (2, 4, 8):
            raise CodeObjectError(f"kernel {kernel}: a float for the {size}-byte argument at offset {offset}")
        return struct.pack({2: "<e", 4: "<f", 8: "<d"}[size], value)
    if isinstance(value, int):
        v = int(value)
        if not -(1 << (8 * size - 1)) <= v < (1 << (8 * size)):
            raise CodeObjectError(f"kernel {kernel}: {v} does not fit the {size}-byte {kind} argument at {offset}")
        return (v & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
    raise CodeObjectError(f"kernel {kernel}: argument at offset {offset} must be int, float or bytes, not {value!r}")


# ----------------------------------------------------------------------------------------------------- code object
@dataclass(eq=False)  # compared and hashed by identity: the emulator caches per loaded code object
class CodeObject:
    """A parsed code object. `image(base)` is the loadable memory image relocated to `base`, of `image_size` bytes;
    every virtual address here (a kernel's `code_offset`, `descriptor_offset`) is an offset into it."""

    blob: bytes
    sections: list[Section]
    symbols: list[Symbol]
    relocations: list[Relocation]
    segments: list[Segment]
    metadata: dict[str, Any]
    kernels: dict[str, Kernel]

    @property
    def target(self) -> str:
        """The `amdhsa.target` string, e.g. 'amdgcn-amd-amdhsa--gfx1100'."""
        return str(self.metadata.get("amdhsa.target", ""))

    @property
    def image_size(self) -> int:
        """Bytes from virtual address 0 to the end of the last loadable segment."""
        return max((s.vaddr + s.memsz for s in self.segments), default=0)

    def image(self, base: int = 0) -> bytes:
        """The loaded image for load address `base`: segments copied, .bss zero, dynamic relocations applied."""
        img = bytearray(self.image_size)
        for s in self.segments:
            img[s.vaddr : s.vaddr + s.filesz] = self.blob[s.offset : s.offset + s.filesz]
        for r in self.relocations:
            if r.symbol_value is None and r.type != R_AMDGPU_RELATIVE64:
                raise CodeObjectError(
                    f"relocation at {r.offset:#x} needs undefined symbol {r.symbol!r}; link every "
                    "kernel and its data into one code object (ld.lld-19 -shared)"
                )
            s_addr = base + (r.symbol_value or 0)
            value, width = _relocated_value(r.type, s_addr, r.addend, base + r.offset, base)
            if r.offset + width > len(img):
                raise CodeObjectError(f"relocation at {r.offset:#x} lies outside the loaded image")
            img[r.offset : r.offset + width] = value.to_bytes(width, "little")
        return bytes(img)

    def section(self, name: str) -> Section:
        """The section called `name`."""
        for s in self.sections:
            if s.name == name:
                return s
        raise CodeObjectError(f"the code object has no section {name!r} (sections: {[s.name for s in self.sections]})")


def _cstr(table: bytes, off: int) -> str:
    end = table.index(b"\0", off)
    return table[off:end].decode()


def load_code_object(blob: bytes) -> CodeObject:
    """Parse an AMDGPU HSA code object; raises CodeObjectError naming what is wrong."""
    blob = bytes(blob)
    if blob[:4] != b"\x7fELF":
        raise CodeObjectError(
            "not an ELF file: an AMD code object starts with \\x7fELF; pass the bytes clang wrote "
            "with --no-gpu-bundle-output (a clang offload bundle must be unbundled first)"
        )
    if blob[4] != 2 or blob[5] != 1:
        raise CodeObjectError("not a 64-bit little-endian ELF: AMD code objects are ELF64 LSB")
    (machine,) = struct.unpack_from("<H", blob, 18)
    if machine != EM_AMDGPU:
        raise CodeObjectError(
            f"ELF machine is {machine}, not EM_AMDGPU ({EM_AMDGPU}): compile with --offload-arch=gfxN"
        )
    phoff, shoff = struct.unpack_from("<QQ", blob, 32)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", blob, 54)
    try:
        raw_sections = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
        shstr = raw_sections[shstrndx]
        names = blob[shstr[4] : shstr[4] + shstr[5]]
        sections = [Section(_cstr(names, r[0]), r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[9]) for r in raw_sections]
        segments = []
        for i in range(phnum):
            ptype, pflags, off, vaddr, _paddr, filesz, memsz, _align = struct.unpack_from(
                "<IIQQQQQQ", blob, phoff + i * phentsize
            )
            if ptype == PT_LOAD:
                segments.append(Segment(off, vaddr, filesz, memsz, pflags))
    except (struct.error, IndexError, ValueError) as e:
        raise CodeObjectError(f"truncated or corrupt ELF headers ({e}); rebuild the code object") from None

    def symbols_of(sec: Section) -> list[Symbol]:
        strtab = blob[sections[sec.link].offset : sections[sec.link].offset + sections[sec.link].size]
        out = []
        for off in range(sec.offset, sec.offset + sec.size, 24):
            st_name, st_info, _other, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", blob, off)
            out.append(Symbol(_cstr(strtab, st_name), st_value, st_size, st_info & 0xF, st_info >> 4, st_shndx))
        return out

    symtab = next((s for s in sections if s.type == SHT_SYMTAB), None)
    dynsym = next((s for s in sections if s.type == SHT_DYNSYM), None)
    if symtab is None and dynsym is None:
        raise CodeObjectError("the code object has no symbol table, so its kernels cannot be found")
    symbols = symbols_of(symtab if symtab is not None else dynsym)  # type: ignore[arg-type]

    relocations = []
    for sec in sections:
        if sec.type != SHT_RELA:
            continue
        table = symbols_of(sections[sec.link]) if sec.link else []
        for off in range(sec.offset, sec.offset + sec.size, 24):
            r_offset, r_info, r_addend = struct.unpack_from("<QQq", blob, off)
            sym = table[r_info >> 32] if table and (r_info >> 32) < len(table) else None
            value = None if sym is None or (sym.shndx == 0 and sym.name) else sym.value
            relocations.append(Relocation(r_offset, r_info & 0xFFFFFFFF, sym.name if sym else "", value, r_addend))

    metadata: dict[str, Any] = {}
    for sec in sections:
        if sec.type != SHT_NOTE:
            continue
        pos, end = sec.offset, sec.offset + sec.size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", blob, pos)
            name = blob[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            desc_at = pos + 12 + (-(-namesz // 4) * 4)
            if name == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
                metadata, _ = _msgpack(blob[desc_at : desc_at + descsz])
            pos = desc_at + (-(-descsz // 4) * 4)
    if not metadata:
        raise CodeObjectError(
            "the code object has no NT_AMDGPU_METADATA note (code object V3+ is needed; clang-19 writes V5 by default)"
        )

    by_name = {s.name: s for s in symbols}
    kernels = {}
    image = CodeObject(blob, sections, symbols, relocations, segments, metadata, {}).image(0)
    for meta in metadata.get("amdhsa.kernels", []):
        name = meta[".name"]
        kd_sym = by_name.get(meta.get(".symbol", name + ".kd"))
        if kd_sym is None:
            raise CodeObjectError(f"kernel {name}: no descriptor symbol {name}.kd in the symbol table")
        desc = KernelDescriptor.decode(image[kd_sym.value : kd_sym.value + DESCRIPTOR_SIZE])
        entry = kd_sym.value + desc.kernel_code_entry_byte_offset
        func = by_name.get(name)
        code_end = entry + func.size if func is not None and func.size else _section_end_of(sections, entry)
        args = [(int(a[".offset"]), int(a[".size"]), str(a[".value_kind"])) for a in meta.get(".args", [])]
        kernels[name] = Kernel(name, desc, kd_sym.value, meta, image[entry:code_end], entry, args)
    return CodeObject(blob, sections, symbols, relocations, segments, metadata, kernels)


def _section_end_of(sections: list[Section], addr: int) -> int:
    for s in sections:
        if s.addr <= addr < s.addr + s.size and s.type != SHT_NOBITS:
            return s.addr + s.size
    raise CodeObjectError(f"kernel entry {addr:#x} is in no section of the code object")
