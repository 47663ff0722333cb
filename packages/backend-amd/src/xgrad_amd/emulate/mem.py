"""Memory instructions: SMEM scalar loads, GLOBAL/FLAT loads, stores and atomics through `DeviceMemory`, and DS
(LDS) loads, stores and atomics on each workgroup's LDS block.

In: a decoded `Inst`. Out: its executor for the selected waves. Only lanes EXEC enables touch memory (an inactive
lane's address may be garbage). Addresses: SMEM sbase pair + offset (+ soffset SGPR); GLOBAL with saddr an SGPR pair
+ the lane's 32-bit VGPR offset, else a 64-bit VGPR pair, + the signed 13-bit offset; FLAT addresses in the shared
aperture go to LDS; DS the lane's VGPR + offset modulo 2^32 (offset0/offset1 times the element size, or 64 times it
for *_stride64). An element of n dwords moves as one access of n * 4 bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xgrad_amd.elf import SHARED_APERTURE_HI
from xgrad_amd.emulate.decode import EmulatorError, Inst
from xgrad_amd.emulate.wave import LANES, M32, Waves

Exec = Callable[[Waves], None]


def _dwords(count: int) -> np.dtype:
    return np.dtype(np.uint32) if count == 1 else np.dtype((np.void, 4 * count))


def build_smem(inst: Inst) -> Exec:
    """s_load_b32 .. s_load_b512."""
    f, size, name = inst.f, inst.size, inst.name
    if not name.startswith("s_load_b"):
        raise EmulatorError(f"unimplemented scalar memory instruction {name} (opcode {inst.op}) at {inst.addr:#x}")
    n = int(name[len("s_load_b") :]) // 32
    sdata, sbase, offset, soffset = f["sdata"], f["sbase"], f["offset"], f["soffset"]

    def sload(w: Waves) -> None:
        addr = w.sread64(sbase).astype(np.int64) + offset
        if soffset != 124:
            addr = addr + w.sread(soffset)
        data = w.mem.load((addr & ~3).astype(np.uint64), _dwords(n)).view(np.uint32).reshape(-1, n)
        for i in range(n):
            w.s[sdata + i, w.ix] = data[:, i]
        w.pc[w.ix] += size

    return sload


_LOAD = {"u8": (np.uint8, 1), "i8": (np.int8, 1), "u16": (np.uint16, 1), "i16": (np.int16, 1), "b32": (np.uint32, 1),
         "b64": (np.uint32, 2), "b96": (np.uint32, 3), "b128": (np.uint32, 4)}  # fmt: skip
_STORE = {"b8": (np.uint8, 1), "b16": (np.uint16, 1), "b32": (np.uint32, 1), "b64": (np.uint32, 2),
          "b96": (np.uint32, 3), "b128": (np.uint32, 4)}  # fmt: skip


def _addresses(w: Waves, inst: Inst, lanes: np.ndarray) -> np.ndarray:
    """The byte addresses of `lanes` (absolute lane indices of active lanes)."""
    f = inst.f
    off = np.uint64(f["offset"] & ((1 << 64) - 1))
    if inst.enc != "FLAT" and f["saddr"] not in (124, 125):
        base = w.s[f["saddr"]].astype(np.uint64) | (w.s[f["saddr"] + 1].astype(np.uint64) << np.uint64(32))
        return np.asarray(base[lanes // LANES] + w.v[f["addr"], lanes].astype(np.uint64) + off)
    lo = w.v[f["addr"], lanes].astype(np.uint64)
    hi = w.v[f["addr"] + 1, lanes].astype(np.uint64)
    return np.asarray(((hi << np.uint64(32)) | lo) + off)


def _as_unsigned(vals: np.ndarray) -> np.ndarray:
    return vals.astype(np.int64).astype(np.uint32) if vals.dtype.kind == "i" else vals.astype(np.uint32)


class _Space:
    """Loads and stores of one access: global memory, LDS for flat addresses in the shared aperture, or each lane's
    private (scratch) memory for SCRATCH instructions, whose addresses are offsets into the lane's own segment."""

    def __init__(self, w: Waves, lanes: np.ndarray, addrs: np.ndarray, flat: bool, private: bool = False) -> None:
        self.w = w
        self.lanes = lanes
        self.addrs = addrs
        self.private = private
        self.lds = flat and bool(((addrs >> np.uint64(32)) == np.uint64(SHARED_APERTURE_HI)).any())
        if self.lds:
            self.addrs = addrs & np.uint64(M32)

    def _private_index(self, nbytes: int) -> np.ndarray:
        a = self.addrs.astype(np.int64)
        size = self.w.private_bytes
        if a.size and (int(a.max()) + nbytes > size or int(a.min()) < 0):
            bad = int(a.max()) if int(a.max()) + nbytes > size else int(a.min())
            raise EmulatorError(
                f"scratch access of {nbytes} bytes at {bad:#x} is outside the lane's {size} private bytes"
            )
        return np.asarray((self.lanes * size + a)[:, None] + np.arange(nbytes))

    def load(self, dtype: type, count: int) -> np.ndarray:
        if self.private:
            dt = np.dtype(dtype)
            vals = np.ascontiguousarray(self.w.private[self._private_index(dt.itemsize * count)]).view(dt)
            return vals.reshape(-1) if count == 1 else vals.reshape(-1, count)
        if self.lds:
            return _lds_load(self.w, self.lanes, self.addrs.astype(np.int64), np.dtype(dtype), count)
        if count == 1:
            return self.w.mem.load(self.addrs, dtype)
        return self.w.mem.load(self.addrs, _dwords(count)).view(np.uint32).reshape(-1, count)

    def store(self, values: np.ndarray, count: int) -> None:
        if self.private:
            v = np.ascontiguousarray(values)
            n = v.dtype.itemsize * count
            self.w.private[self._private_index(n)] = v.view(np.uint8).reshape(-1, n)
        elif self.lds:
            _lds_store(self.w, self.lanes, self.addrs.astype(np.int64), values, count)
        elif count == 1:
            self.w.mem.store(self.addrs, values)
        else:
            self.w.mem.store(self.addrs, np.ascontiguousarray(values, np.uint32).view(_dwords(count)).reshape(-1))


def _scratch_offsets(w: Waves, inst: Inst, lanes: np.ndarray) -> np.ndarray:
    """SCRATCH addresses: the offset, plus an SGPR (saddr) and the lane's VGPR when the instruction names them."""
    f = inst.f
    off = np.full(lanes.size, f["offset"], np.int64)
    if f["saddr"] not in (124, 125):
        off = off + w.s[f["saddr"]][lanes // LANES]
    if f["sve"]:
        off = off + w.v[f["addr"], lanes].astype(np.int64)
    return (off & M32).astype(np.uint64)


def _space(w: Waves, inst: Inst, lanes: np.ndarray, flat: bool, private: bool) -> _Space:
    if private:
        return _Space(w, lanes, _scratch_offsets(w, inst, lanes), False, True)
    return _Space(w, lanes, _addresses(w, inst, lanes), flat)


def build_flat(inst: Inst) -> Exec:
    """global_*/flat_*/scratch_* loads, stores (incl. d16 halves) and the 32-bit global/flat atomics."""
    name, f, size = inst.name, inst.f, inst.size
    flat = inst.enc == "FLAT"
    private = inst.enc == "SCRATCH"
    kind = name.split("_", 1)[1]  # load_b32, store_b64, load_d16_hi_b16, atomic_add_f32, ...
    vdst, vdata = f["vdst"], f["data"]

    if kind.startswith("load_d16"):
        hi = "_hi_" in kind
        dt = {"u8": np.uint8, "i8": np.int8, "b16": np.uint16}[kind.rsplit("_", 1)[1]]

        def load_d16(w: Waves) -> None:
            lanes = w.active()
            if lanes.size:
                vals = _as_unsigned(_space(w, inst, lanes, flat, private).load(dt, 1)) & np.uint32(0xFFFF)
                old = w.v[vdst, lanes]
                keep = old & np.uint32(0xFFFF) if hi else old & np.uint32(0xFFFF0000)
                w.v[vdst, lanes] = keep | (vals << np.uint32(16) if hi else vals)
            w.pc[w.ix] += size

        return load_d16
    if kind.startswith("load_"):
        dt, count = _LOAD[kind[5:]]

        def load(w: Waves) -> None:
            lanes = w.active()
            if lanes.size:
                vals = _space(w, inst, lanes, flat, private).load(dt, count)
                if count == 1:
                    w.v[vdst, lanes] = _as_unsigned(vals)
                else:
                    w.v[vdst : vdst + count, lanes] = vals.T
            w.pc[w.ix] += size

        return load
    if kind.startswith("store_d16_hi"):
        sdt = {"b8": np.uint8, "b16": np.uint16}[kind.rsplit("_", 1)[1]]

        def store_hi(w: Waves) -> None:
            lanes = w.active()
            if lanes.size:
                sp = _space(w, inst, lanes, flat, private)
                sp.store((w.v[vdata, lanes] >> np.uint32(16)).astype(sdt), 1)
            w.pc[w.ix] += size

        return store_hi
    if kind.startswith("store_"):
        sdt, count = _STORE[kind[6:]]

        def store(w: Waves) -> None:
            lanes = w.active()
            if lanes.size:
                sp = _space(w, inst, lanes, flat, private)
                vals = w.v[vdata, lanes].astype(sdt) if count == 1 else w.v[vdata : vdata + count, lanes].T
                sp.store(vals, count)
            w.pc[w.ix] += size

        return store
    if kind.startswith("atomic_") and not private:
        return _build_atomic(inst, kind[7:], flat)
    raise EmulatorError(f"unimplemented memory instruction {name} ({inst.enc} opcode {inst.op}) at {inst.addr:#x}")


_ATOMIC: dict[str, tuple[type, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "add_u32": (np.uint32, lambda a, b: a + b), "sub_u32": (np.uint32, lambda a, b: a - b),
    "add_f32": (np.float32, lambda a, b: a + b), "min_i32": (np.int32, np.minimum), "max_i32": (np.int32, np.maximum),
    "min_u32": (np.uint32, np.minimum), "max_u32": (np.uint32, np.maximum), "and_b32": (np.uint32, lambda a, b: a & b),
    "or_b32": (np.uint32, lambda a, b: a | b), "xor_b32": (np.uint32, lambda a, b: a ^ b),
    "swap_b32": (np.uint32, lambda a, b: b), "min_f32": (np.float32, np.fmin), "max_f32": (np.float32, np.fmax),
}  # fmt: skip


def _build_atomic(inst: Inst, op: str, flat: bool) -> Exec:
    if op not in _ATOMIC:
        raise EmulatorError(f"unimplemented atomic {inst.name} ({inst.enc} opcode {inst.op}) at {inst.addr:#x}")
    dt, fn = _ATOMIC[op]
    f, size = inst.f, inst.size
    returns = bool(f["glc"])

    def atomic(w: Waves) -> None:
        lanes = w.active()
        addrs = _addresses(w, inst, lanes)
        for i, lane in enumerate(lanes):  # one lane after another, as the memory system serialises them
            sp = _Space(w, lanes[i : i + 1], addrs[i : i + 1], flat)
            old = sp.load(dt, 1)
            sp.store(np.asarray(fn(old, w.v[f["data"], lane : lane + 1].view(dt)), dt), 1)
            if returns:
                w.v[f["vdst"], lane] = old.view(np.uint32)[0]
        w.pc[w.ix] += size

    return atomic


# ----------------------------------------------------------------------------------------------------------- LDS
def _lds_index(w: Waves, lanes: np.ndarray, addrs: np.ndarray, nbytes: int) -> np.ndarray:
    """Byte indices into the batch's LDS for `nbytes` at each lane's address, in the lane's workgroup block."""
    if addrs.size and (int(addrs.max()) + nbytes > w.lds_bytes or int(addrs.min()) < 0):
        bad = int(addrs.max()) if int(addrs.max()) + nbytes > w.lds_bytes else int(addrs.min())
        raise EmulatorError(
            f"LDS access of {nbytes} bytes at {bad:#x} is past the workgroup's {w.lds_bytes} bytes of LDS"
        )
    start = w.group[lanes // LANES] * w.lds_bytes + addrs
    return np.asarray(start[:, None] + np.arange(nbytes))


def _lds_load(w: Waves, lanes: np.ndarray, addrs: np.ndarray, dt: np.dtype, count: int) -> np.ndarray:
    n = dt.itemsize * count
    vals = np.ascontiguousarray(w.lds[_lds_index(w, lanes, addrs, n)]).view(dt)
    return vals.reshape(-1) if count == 1 else vals.reshape(-1, count)


def _lds_store(w: Waves, lanes: np.ndarray, addrs: np.ndarray, values: np.ndarray, count: int) -> None:
    v = np.ascontiguousarray(values)
    n = v.dtype.itemsize * count
    w.lds[_lds_index(w, lanes, addrs, n)] = v.view(np.uint8).reshape(addrs.size, n)


def _ds_load_d16(inst: Inst, kind: str, addr_r: int, vdst: int, off: int) -> Exec:
    """ds_load_{u8,i8,u16}_d16[_hi]: one 8/16-bit value (the i8 sign-extended to 16 bits) into the low (or with
    _hi the high) half of vdst; the other half is kept."""
    hi = kind.endswith("_hi")
    dt = {"u8": np.uint8, "i8": np.int8, "u16": np.uint16}[kind.split("_")[1]]
    size = inst.size

    def dsload_d16(w: Waves) -> None:
        lanes = w.active()
        if lanes.size:
            vals = _lds_load(w, lanes, (w.v[addr_r, lanes].astype(np.int64) + off) & M32, np.dtype(dt), 1)
            half = vals.astype(np.int16).view(np.uint16).astype(np.uint32) if dt == np.int8 else vals.astype(np.uint32)
            old = w.v[vdst, lanes]
            keep = old & np.uint32(0xFFFF) if hi else old & np.uint32(0xFFFF0000)
            w.v[vdst, lanes] = keep | (half << np.uint32(16) if hi else half)
        w.pc[w.ix] += size

    return dsload_d16


def build_ds(inst: Inst) -> Exec:
    """ds_load_*, ds_store_*, their 2addr forms and the 32-bit LDS atomics."""
    name, f, size = inst.name, inst.f, inst.size
    kind = name[3:]
    addr_r, d0, d1, vdst = f["addr"], f["data0"], f["data1"], f["vdst"]
    off = f["offset0"] | f["offset1"] << 8
    if "2addr" in kind:
        width = 8 if kind.endswith("b64") else 4
        scale = width * (64 if "stride64" in kind else 1)
        offs = (f["offset0"] * scale, f["offset1"] * scale)
        count = width // 4
        is_load = kind.startswith("load")

        def ds2(w: Waves) -> None:
            lanes = w.active()
            if lanes.size:
                base = w.v[addr_r, lanes].astype(np.int64)
                for i, o in enumerate(offs):
                    if is_load:
                        vals = _lds_load(w, lanes, (base + o) & M32, np.dtype(np.uint32), count)
                        w.v[vdst + i * count : vdst + (i + 1) * count, lanes] = vals.reshape(-1, count).T
                    else:
                        src = (d0, d1)[i]
                        _lds_store(w, lanes, (base + o) & M32, w.v[src : src + count, lanes].T, count)
            w.pc[w.ix] += size

        return ds2
    if kind.startswith("load_") and "_d16" in kind:  # load_u16_d16(_hi), load_u8_d16(_hi), load_i8_d16(_hi)
        return _ds_load_d16(inst, kind, addr_r, vdst, off)
    if kind.startswith("store_") and kind.endswith("_d16_hi"):  # store_b16_d16_hi, store_b8_d16_hi
        hdt = {"b8": np.uint8, "b16": np.uint16}[kind.split("_")[1]]

        def dsstore_hi(w: Waves) -> None:
            lanes = w.active()
            if lanes.size:
                vals = (w.v[d0, lanes] >> np.uint32(16)).astype(hdt)
                _lds_store(w, lanes, (w.v[addr_r, lanes].astype(np.int64) + off) & M32, vals, 1)
            w.pc[w.ix] += size

        return dsstore_hi
    if kind.startswith("load_") and kind[5:] in _LOAD:
        dt, count = _LOAD[kind[5:]]

        def dsload(w: Waves) -> None:
            lanes = w.active()
            if lanes.size:
                vals = _lds_load(w, lanes, (w.v[addr_r, lanes].astype(np.int64) + off) & M32, np.dtype(dt), count)
                if count == 1:
                    w.v[vdst, lanes] = _as_unsigned(vals)
                else:
                    w.v[vdst : vdst + count, lanes] = vals.T
            w.pc[w.ix] += size

        return dsload
    if kind.startswith("store_") and kind[6:] in _STORE:
        sdt, count = _STORE[kind[6:]]

        def dsstore(w: Waves) -> None:
            lanes = w.active()
            if lanes.size:
                vals = w.v[d0, lanes].astype(sdt) if count == 1 else w.v[d0 : d0 + count, lanes].T
                _lds_store(w, lanes, (w.v[addr_r, lanes].astype(np.int64) + off) & M32, vals, count)
            w.pc[w.ix] += size

        return dsstore
    atomic = kind.replace("_rtn", "")
    if atomic in _ATOMIC:
        adt, afn = _ATOMIC[atomic]
        returns = "_rtn" in kind

        def dsatomic(w: Waves) -> None:
            for lane in w.active():
                one = np.array([lane])
                a = np.array([(int(w.v[addr_r, lane]) + off) & M32], np.int64)
                old = _lds_load(w, one, a, np.dtype(adt), 1)
                _lds_store(w, one, a, np.asarray(afn(old, w.v[d0, lane : lane + 1].view(adt)), adt), 1)
                if returns:
                    w.v[vdst, lane] = old.view(np.uint32)[0]
            w.pc[w.ix] += size

        return dsatomic
    raise EmulatorError(f"unimplemented LDS instruction {name} (DS opcode {inst.op}) at {inst.addr:#x}")
