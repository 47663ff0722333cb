"""One wave32's architectural state and its operand reads and writes.

In: operand codes of decoded instructions (the 9-bit source encoding: SGPRs, VCC, EXEC, M0, inline and literal
constants, VGPRs from 256). Out: Python ints for scalar operands, numpy arrays of 32 lanes for vector operands, and
EXEC-masked writes of VGPRs. Values travel as raw bits (uint32 per dword); typed views are taken by the ALU tables.
"""

from __future__ import annotations

import struct

import numpy as np

from xgrad_amd.emulate.decode import FLOAT_CONSTANTS, INV_2PI, LITERAL, EmulatorError
from xgrad_codegen.devmem import DeviceMemory

LANES = 32
VCC, M0, NULL, EXEC, SCC = 106, 125, 124, 126, 253
SHARED_BASE, SHARED_LIMIT, PRIVATE_BASE, PRIVATE_LIMIT = 235, 236, 237, 238
M32, M64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
_LANE_BITS = np.uint32(1) << np.arange(LANES, dtype=np.uint32)
_MASKS: dict[int, np.ndarray] = {}


def mask_of(bits: int) -> np.ndarray:
    """EXEC (or any lane mask) as a boolean array of 32 lanes; cached, never written."""
    m = _MASKS.get(bits)
    if m is None:
        m = (np.uint32(bits) & _LANE_BITS) != 0
        m.flags.writeable = False
        if len(_MASKS) < 4096:
            _MASKS[bits] = m
    return m


def bits_of(mask: np.ndarray) -> int:
    """A boolean lane array as an integer lane mask."""
    return int(np.bitwise_or.reduce(_LANE_BITS[: mask.size][mask])) if mask.any() else 0


def _f32_bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def _f64_bits(x: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", x))[0])


def _f16_bits(x: float) -> int:
    return int(struct.unpack("<H", struct.pack("<e", x))[0])


INV_2PI_VALUE = 0.15915494309189532


def const_bits(code: int, literal: int | None, bits: int, is_float: bool) -> int | None:
    """The raw value of an inline or literal constant for an operand of `bits` width, or None if `code` is none."""
    if 128 <= code <= 208:
        v = code - 128 if code <= 192 else 192 - code
        return v & ((1 << bits) - 1)
    if code in FLOAT_CONSTANTS or code == INV_2PI:
        x = FLOAT_CONSTANTS.get(code, INV_2PI_VALUE)
        if bits == 64:
            return _f64_bits(x) if code != INV_2PI else 0x3FC45F306DC9C882
        if bits == 16:
            return _f16_bits(x) if code != INV_2PI else 0x3118
        return _f32_bits(x) if code != INV_2PI else 0x3E22F983
    if code == LITERAL:
        lit = literal or 0
        if bits == 64:
            return lit << 32 if is_float else lit
        return lit & ((1 << bits) - 1)
    return None


class Wave:
    """Registers of one wave: `s` (SGPRs by operand code, VCC at 106/107, M0, EXEC at 126/127), `scc`, `v` (VGPRs as
    uint32 [n, 32]), `pc` (byte offset in the kernel's code)."""

    def __init__(self, n_vgprs: int, lds: np.ndarray, group: Group, index: int) -> None:
        self.s = [0] * 128
        self.scc = 0
        self.v = np.zeros((max(n_vgprs, 1), LANES), np.uint32)
        self.pc = 0
        self.lds = lds
        self.group = group
        self.index = index
        self.done = False
        self.at_barrier = False

    # ------------------------------------------------------------------------------------------------ scalar
    @property
    def exec(self) -> int:
        """EXEC_LO (wave32)."""
        return self.s[EXEC]

    def mask(self) -> np.ndarray:
        """EXEC as a boolean lane array."""
        return mask_of(self.s[EXEC])

    def sread(self, code: int, literal: int | None = None, is_float: bool = False) -> int:
        """A 32-bit scalar source."""
        if code < 128:
            return self.s[code]
        if code == SCC:
            return self.scc
        c = const_bits(code, literal, 32, is_float)
        if c is not None:
            return c
        return self._special(code) & M32

    def sread64(self, code: int, literal: int | None = None, is_float: bool = False) -> int:
        """A 64-bit scalar source (a register pair or a 64-bit constant)."""
        if code < 128:
            return self.s[code] | (self.s[code + 1] if code + 1 < 128 else 0) << 32
        if code == SCC:
            return self.scc
        c = const_bits(code, literal, 64, is_float)
        if c is not None:
            return c
        return self._special(code)

    def _special(self, code: int) -> int:
        from xgrad_amd.elf import PRIVATE_APERTURE_HI, SHARED_APERTURE_HI

        if code == SHARED_BASE:
            return SHARED_APERTURE_HI << 32
        if code == SHARED_LIMIT:
            return (SHARED_APERTURE_HI << 32) | M32
        if code == PRIVATE_BASE:
            return PRIVATE_APERTURE_HI << 32
        if code == PRIVATE_LIMIT:
            return (PRIVATE_APERTURE_HI << 32) | M32
        raise EmulatorError(f"scalar operand code {code} is not a register or constant this emulator reads")

    def swrite(self, code: int, value: int) -> None:
        """A 32-bit scalar destination (NULL discards)."""
        if code < NULL or code == M0 or code in (EXEC, EXEC + 1):
            self.s[code] = value & M32
        elif code != NULL:
            raise EmulatorError(f"scalar destination code {code} is not writable")

    def swrite64(self, code: int, value: int) -> None:
        """A 64-bit scalar destination (a register pair)."""
        if code == NULL:
            return
        self.swrite(code, value & M32)
        self.swrite(code + 1, (value >> 32) & M32)

    # ------------------------------------------------------------------------------------------------ vector
    def vread(self, code: int, literal: int | None = None, dwords: int = 1, is_float: bool = False) -> np.ndarray:
        """A vector source as raw bits: uint32[32] for one dword, uint64[32] for two, uint32[dwords, 32] for more."""
        if code >= 256:
            r = code - 256
            if dwords == 1:
                return np.asarray(self.v[r])
            if dwords == 2:
                return np.asarray(self.v[r].astype(np.uint64) | (self.v[r + 1].astype(np.uint64) << np.uint64(32)))
            return self.v[r : r + dwords]
        if dwords == 1:
            return np.full(LANES, self.sread(code, literal, is_float), np.uint32)
        if dwords == 2:
            return np.full(LANES, self.sread64(code, literal, is_float), np.uint64)
        return np.array([[self.s[code + i]] * LANES for i in range(dwords)], np.uint32)

    def vwrite(self, code: int, value: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Write lanes of VGPR(s) `code` under `mask` (EXEC by default); uint64 values fill a register pair."""
        r = code - 256
        if r < 0:
            raise EmulatorError(f"vector destination code {code} is not a VGPR")
        m = self.mask() if mask is None else mask
        if value.dtype == np.uint64 or value.dtype.itemsize == 8:
            value = value.view(np.uint64) if value.dtype.itemsize == 8 else value
            np.copyto(self.v[r], (value & np.uint64(M32)).astype(np.uint32), where=m)
            np.copyto(self.v[r + 1], (value >> np.uint64(32)).astype(np.uint32), where=m)
        elif value.ndim == 2:
            np.copyto(self.v[r : r + value.shape[0]], value, where=m[None, :])
        else:
            np.copyto(
                self.v[r], value.view(np.uint32) if value.dtype.itemsize == 4 else value.astype(np.uint32), where=m
            )


class Group:
    """A workgroup: its waves, its LDS, the device memory and the address of the kernel's first instruction."""

    def __init__(self, lds_bytes: int, mem: DeviceMemory, code_base: int) -> None:
        self.lds = np.zeros(max(lds_bytes, 4), np.uint8)
        self.waves: list[Wave] = []
        self.mem = mem
        self.code_base = code_base
