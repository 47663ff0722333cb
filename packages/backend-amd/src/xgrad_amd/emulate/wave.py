"""The architectural state of a batch of wave32s that execute in lockstep, and their operand reads and writes.

In: operand codes of decoded instructions (the 9-bit source encoding: SGPRs, VCC, EXEC, M0, inline and literal
constants, VGPRs from 256). Out: numpy arrays with one value per selected wave for scalar operands, and one per lane
of the selected waves (32 each, wave after wave) for vector operands; EXEC-masked writes of VGPRs.

Every wave of a launch (or of a chunk of whole workgroups) lives in one `Waves`: SGPRs as [128, waves] int64 (32-bit
values), SCC and the program counter per wave, VGPRs as [n, 32 * waves] uint32. The scheduler (`launch`) runs the
instruction at the lowest program counter for the waves that are there (`select`), so waves that branch differently
reconverge, an s_barrier finds every wave of its workgroup at it, and one numpy operation serves many waves.
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
_BIT = np.int64(1) << np.arange(LANES, dtype=np.int64)
_U32_BIT = np.uint32(1) << np.arange(LANES, dtype=np.uint32)


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


def lanes_of(bits: np.ndarray) -> np.ndarray:
    """Per-wave 32-bit lane masks (int64 [k]) as booleans over the waves' lanes ([32 k])."""
    return np.asarray((np.asarray(bits, np.int64)[:, None] & _BIT) != 0).reshape(-1)


def bits_of(lanes: np.ndarray) -> np.ndarray:
    """Booleans over the lanes of k waves ([32 k]) as per-wave lane masks (int64 [k])."""
    return np.asarray((lanes.reshape(-1, LANES) * _BIT).sum(axis=1), np.int64)


class Waves:
    """Registers of a batch of waves (see the module docstring) plus what they share: device memory, LDS (one block
    of `lds_bytes` per workgroup, `group` giving each wave's), each lane's `private_bytes` of scratch memory and the
    address of the kernel's first instruction."""

    def __init__(self, n_waves: int, n_vgprs: int, mem: DeviceMemory, code_base: int = 0, lds_bytes: int = 0,
                 group: np.ndarray | None = None, private_bytes: int = 0) -> None:  # fmt: skip
        self.n = n_waves
        self.s = np.zeros((128, n_waves), np.int64)
        self.scc = np.zeros(n_waves, np.int64)
        self.pc = np.zeros(n_waves, np.int64)
        self.done = np.zeros(n_waves, bool)
        self.v = np.zeros((max(n_vgprs, 1), LANES * n_waves), np.uint32)
        self.mem = mem
        self.code_base = code_base
        self.group = np.zeros(n_waves, np.int64) if group is None else group
        self.lds_bytes = max(lds_bytes, 4)
        self.lds = np.zeros(self.lds_bytes * (int(self.group.max()) + 1 if n_waves else 1), np.uint8)
        self.private_bytes = private_bytes
        self.private = np.zeros(LANES * n_waves * private_bytes, np.uint8)  # each lane's scratch segment
        self.select_all()

    # ------------------------------------------------------------------------------------------------ selection
    def select_all(self) -> None:
        """Every wave executes the next instruction."""
        self.ix: slice | np.ndarray = slice(None)
        self.lx: slice | np.ndarray = slice(None)
        self.k = self.n
        self._mask: np.ndarray | None = None

    def select(self, waves: np.ndarray) -> None:
        """Only `waves` (indices) execute the next instruction."""
        self.ix = waves
        self.lx = (waves[:, None] * LANES + np.arange(LANES)).reshape(-1)
        self.k = waves.size
        self._mask = None

    def mask(self) -> np.ndarray:
        """EXEC of the selected waves over their lanes."""
        if self._mask is None:
            self._mask = lanes_of(self.s[EXEC, self.ix])
        return self._mask

    # ------------------------------------------------------------------------------------------------ scalar
    def sread(self, code: int, literal: int | None = None, is_float: bool = False) -> np.ndarray:
        """A 32-bit scalar source: int64 [k]."""
        if code < 128:
            return self.s[code, self.ix]
        if code == SCC:
            return self.scc[self.ix]
        c = const_bits(code, literal, 32, is_float)
        if c is None:
            c = self._special(code) & M32
        return np.full(self.k, c, np.int64)

    def sread64(self, code: int, literal: int | None = None, is_float: bool = False) -> np.ndarray:
        """A 64-bit scalar source (a register pair or a 64-bit constant): uint64 [k]."""
        if code < 127:
            lo = self.s[code, self.ix].astype(np.uint64)
            return lo | (self.s[code + 1, self.ix].astype(np.uint64) << np.uint64(32))
        if code == SCC:
            return self.scc[self.ix].astype(np.uint64)
        c = const_bits(code, literal, 64, is_float)
        if c is None:
            c = self._special(code)
        return np.full(self.k, c, np.uint64)

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

    def swrite(self, code: int, value: np.ndarray | int) -> None:
        """A 32-bit scalar destination of the selected waves (NULL discards)."""
        if code < NULL or code == M0 or code in (EXEC, EXEC + 1):
            self.s[code, self.ix] = np.asarray(value).astype(np.int64) & M32
            if code == EXEC:
                self._mask = None
        elif code != NULL:
            raise EmulatorError(f"scalar destination code {code} is not writable")

    def swrite64(self, code: int, value: np.ndarray) -> None:
        """A 64-bit scalar destination (a register pair)."""
        if code == NULL:
            return
        u = np.asarray(value).astype(np.uint64)
        self.swrite(code, (u & np.uint64(M32)).astype(np.int64))
        self.swrite(code + 1, (u >> np.uint64(32)).astype(np.int64))

    # ------------------------------------------------------------------------------------------------ vector
    def vread(self, code: int, literal: int | None = None, dwords: int = 1, is_float: bool = False) -> np.ndarray:
        """A vector source as raw bits over the selected lanes: uint32 [32 k] for one dword, uint64 for two,
        uint32 [dwords, 32 k] for more."""
        if code >= 256:
            r = code - 256
            if dwords == 1:
                return self.v[r, self.lx]
            if dwords == 2:
                lo = self.v[r, self.lx].astype(np.uint64)
                return lo | (self.v[r + 1, self.lx].astype(np.uint64) << np.uint64(32))
            return self.v[r : r + dwords][:, self.lx]
        if dwords == 1:
            return np.repeat(self.sread(code, literal, is_float).astype(np.uint32), LANES)
        if dwords == 2:
            return np.repeat(self.sread64(code, literal, is_float), LANES)
        return np.stack([np.repeat(self.s[code + i, self.ix].astype(np.uint32), LANES) for i in range(dwords)])

    def vwrite(self, code: int, value: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Write the selected lanes of VGPR(s) `code` under `mask` (EXEC by default); a 64-bit value fills a pair,
        a [d, 32 k] value d registers."""
        r = code - 256
        if r < 0:
            raise EmulatorError(f"vector destination code {code} is not a VGPR")
        m = self.mask() if mask is None else mask
        if value.dtype.itemsize == 8:
            u = value.view(np.uint64)
            self._put(r, (u & np.uint64(M32)).astype(np.uint32), m)
            self._put(r + 1, (u >> np.uint64(32)).astype(np.uint32), m)
        elif value.ndim == 2:
            for i in range(value.shape[0]):
                self._put(r + i, value[i], m)
        else:
            self._put(r, value.view(np.uint32) if value.dtype.itemsize == 4 else value.astype(np.uint32), m)

    def _put(self, r: int, value: np.ndarray, m: np.ndarray) -> None:
        if isinstance(self.lx, slice):
            np.copyto(self.v[r], value, where=m)
        else:
            self.v[r, self.lx] = np.where(m, value, self.v[r, self.lx])

    def active(self) -> np.ndarray:
        """Indices (into the lane axis of `v`) of the selected waves' lanes that EXEC enables."""
        m = self.mask()
        return np.nonzero(m)[0] if isinstance(self.lx, slice) else self.lx[m]

    def wave_lanes(self, r: int) -> np.ndarray:
        """VGPR r of the selected waves as [k, 32] (a copy when only some waves are selected)."""
        return self.v[r, self.lx].reshape(self.k, LANES)
