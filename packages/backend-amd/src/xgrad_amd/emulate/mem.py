"""Memory instructions: SMEM scalar loads, GLOBAL/FLAT loads, stores and atomics through `DeviceMemory`, and DS
(LDS) loads, stores and atomics on the workgroup's LDS bytes.

In: a decoded `Inst`. Out: its executor. Only lanes EXEC enables touch memory (an inactive lane's address may be
garbage). Addresses: SMEM sbase pair + offset (+ soffset SGPR); GLOBAL with saddr an SGPR pair + the lane's 32-bit
VGPR offset, else a 64-bit VGPR pair, + the signed 13-bit offset; FLAT addresses in the shared aperture go to LDS;
DS the lane's VGPR + offset (offset0/offset1 times the element size, or 64 times it for *_stride64).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xgrad_amd.elf import SHARED_APERTURE_HI
from xgrad_amd.emulate.decode import EmulatorError, Inst
from xgrad_amd.emulate.wave import LANES, M32, Wave

Exec = Callable[[Wave], None]


def build_smem(inst: Inst) -> Exec:
    """s_load_b32 .. s_load_b512."""
    f, size, name = inst.f, inst.size, inst.name
    if not name.startswith("s_load_b"):
        raise EmulatorError(f"unimplemented scalar memory instruction {name} (opcode {inst.op}) at {inst.addr:#x}")
    n = int(name[len("s_load_b") :]) // 32
    sdata, sbase, offset, soffset = f["sdata"], f["sbase"], f["offset"], f["soffset"]

    def sload(w: Wave) -> None:
        addr = w.sread64(sbase) + offset + (w.s[soffset] if soffset != 124 else 0)
        data = np.frombuffer(w.group.mem.read(addr & ~3, 4 * n), np.uint32)
        for i in range(n):
            w.s[sdata + i] = int(data[i])
        w.pc += size

    return sload


_LOAD = {"u8": (np.uint8, 1), "i8": (np.int8, 1), "u16": (np.uint16, 1), "i16": (np.int16, 1), "b32": (np.uint32, 1),
         "b64": (np.uint32, 2), "b96": (np.uint32, 3), "b128": (np.uint32, 4)}  # fmt: skip
_STORE = {"b8": (np.uint8, 1), "b16": (np.uint16, 1), "b32": (np.uint32, 1), "b64": (np.uint32, 2),
          "b96": (np.uint32, 3), "b128": (np.uint32, 4)}  # fmt: skip


def _lane_addresses(w: Wave, inst: Inst) -> np.ndarray:
    f = inst.f
    if inst.enc != "FLAT" and f["saddr"] not in (124, 125):
        base = np.uint64(w.sread64(f["saddr"]))
        return np.asarray(base + w.v[f["addr"]].astype(np.uint64) + np.uint64(f["offset"] & ((1 << 64) - 1)))
    lo = w.v[f["addr"]].astype(np.uint64)
    hi = w.v[f["addr"] + 1].astype(np.uint64)
    return np.asarray(((hi << np.uint64(32)) | lo) + np.uint64(f["offset"] & ((1 << 64) - 1)))


class _Space:
    """Loads and stores of one access: global memory, or LDS for flat addresses in the shared aperture."""

    def __init__(self, w: Wave, addrs: np.ndarray, flat: bool) -> None:
        self.w = w
        self.addrs = addrs
        self.lds = flat and bool(((addrs >> np.uint64(32)) == np.uint64(SHARED_APERTURE_HI)).any())
        if self.lds:
            self.addrs = addrs & np.uint64(M32)

    def load(self, dtype: type, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        if self.lds:
            return _lds_load(self.w.lds, self.addrs, dt, count)
        if count == 1:
            return self.w.group.mem.load(self.addrs, dt)
        out = np.empty((self.addrs.size, count), dt)
        for i in range(count):
            out[:, i] = self.w.group.mem.load(self.addrs + np.uint64(4 * i), dt)
        return out

    def store(self, values: np.ndarray, count: int) -> None:
        if self.lds:
            _lds_store(self.w.lds, self.addrs, values, count)
            return
        if count == 1:
            self.w.group.mem.store(self.addrs, values)
            return
        for i in range(count):
            self.w.group.mem.store(self.addrs + np.uint64(4 * i), np.ascontiguousarray(values[:, i]))


def build_flat(inst: Inst) -> Exec:
    """global_*/flat_* loads, stores (incl. d16 halves) and the 32-bit atomics."""
    name, f, size = inst.name, inst.f, inst.size
    flat = inst.enc == "FLAT"
    if inst.enc == "SCRATCH":
        raise EmulatorError(f"{name} at {inst.addr:#x}: scratch memory (register spills) is not emulated")
    kind = name.split("_", 1)[1]  # load_b32, store_b64, load_d16_hi_b16, atomic_add_f32, ...
    vdst, vdata = f["vdst"], f["data"]

    if kind.startswith("load_d16"):
        hi = "_hi_" in kind
        src = kind.rsplit("_", 1)[1]
        dt = {"u8": np.uint8, "i8": np.int8, "b16": np.uint16}[src]

        def load_d16(w: Wave) -> None:
            m = w.mask()
            if m.any():
                sp = _Space(w, _lane_addresses(w, inst)[m], flat)
                vals = sp.load(dt, 1).astype(np.int32 if dt == np.int8 else np.uint32).view(np.uint32) & np.uint32(
                    0xFFFF
                )
                old = w.v[vdst, m]
                w.v[vdst, m] = (
                    (old & np.uint32(0xFFFF)) | (vals << np.uint32(16)) if hi else (old & np.uint32(0xFFFF0000)) | vals
                )
            w.pc += size

        return load_d16
    if kind.startswith("load_"):
        dt, count = _LOAD[kind[5:]]

        def load(w: Wave) -> None:
            m = w.mask()
            if m.any():
                sp = _Space(w, _lane_addresses(w, inst)[m], flat)
                vals = sp.load(dt, count)
                if count == 1:
                    w.v[vdst, m] = (
                        vals.astype(np.int64).astype(np.uint32) if vals.dtype.kind == "i" else vals.astype(np.uint32)
                    )
                else:
                    w.v[vdst : vdst + count, m] = vals.T
            w.pc += size

        return load
    if kind.startswith("store_d16_hi"):
        dt = {"b8": np.uint8, "b16": np.uint16}[kind.rsplit("_", 1)[1]]

        def store_hi(w: Wave) -> None:
            m = w.mask()
            if m.any():
                sp = _Space(w, _lane_addresses(w, inst)[m], flat)
                sp.store((w.v[vdata, m] >> np.uint32(16)).astype(dt), 1)
            w.pc += size

        return store_hi
    if kind.startswith("store_"):
        dt, count = _STORE[kind[6:]]

        def store(w: Wave) -> None:
            m = w.mask()
            if m.any():
                sp = _Space(w, _lane_addresses(w, inst)[m], flat)
                sp.store(w.v[vdata, m].astype(dt) if count == 1 else w.v[vdata : vdata + count, m].T.copy(), count)
            w.pc += size

        return store
    if kind.startswith("atomic_"):
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

    def atomic(w: Wave) -> None:
        m = w.mask()
        lanes = np.nonzero(m)[0]
        addrs = _lane_addresses(w, inst)
        olds = np.zeros(LANES, np.uint32)
        for lane in lanes:  # one lane after another, as the memory system serialises them
            sp = _Space(w, addrs[lane : lane + 1], flat)
            old = sp.load(dt, 1)
            new = fn(old, w.v[f["data"], lane : lane + 1].view(dt))
            sp.store(np.asarray(new, dt), 1)
            olds[lane] = old.view(np.uint32)[0]
        if returns:
            w.v[f["vdst"], m] = olds[m]
        w.pc += size

    return atomic


# ----------------------------------------------------------------------------------------------------------- LDS
def _check_lds(lds: np.ndarray, addrs: np.ndarray, nbytes: int) -> None:
    if addrs.size and int(addrs.max()) + nbytes > lds.size:
        raise EmulatorError(
            f"LDS access of {nbytes} bytes at {int(addrs.max()):#x} is past the workgroup's {lds.size} bytes of LDS"
        )


def _lds_load(lds: np.ndarray, addrs: np.ndarray, dt: np.dtype, count: int) -> np.ndarray:
    a = addrs.astype(np.int64)
    n = dt.itemsize * count
    _check_lds(lds, a, n)
    raw = lds[a[:, None] + np.arange(n)]
    vals = np.ascontiguousarray(raw).view(dt)
    return vals.reshape(-1) if count == 1 else vals.reshape(-1, count)


def _lds_store(lds: np.ndarray, addrs: np.ndarray, values: np.ndarray, count: int) -> None:
    a = addrs.astype(np.int64)
    v = np.ascontiguousarray(values)
    n = v.dtype.itemsize * count
    _check_lds(lds, a, n)
    lds[a[:, None] + np.arange(n)] = v.view(np.uint8).reshape(a.size, n)


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

        def ds2(w: Wave) -> None:
            m = w.mask()
            if m.any():
                base = w.v[addr_r, m].astype(np.int64)
                for i, o in enumerate(offs):
                    if is_load:
                        vals = _lds_load(w.lds, base + o, np.dtype(np.uint32), count)
                        w.v[vdst + i * count : vdst + (i + 1) * count, m] = vals.reshape(-1, count).T
                    else:
                        src = (d0, d1)[i]
                        _lds_store(w.lds, base + o, w.v[src : src + count, m].T.copy(), count)
            w.pc += size

        return ds2
    if kind.startswith("load_") and kind[5:] in _LOAD:
        dt, count = _LOAD[kind[5:]]

        def dsload(w: Wave) -> None:
            m = w.mask()
            if m.any():
                vals = _lds_load(w.lds, w.v[addr_r, m].astype(np.int64) + off, np.dtype(dt), count)
                if count == 1:
                    w.v[vdst, m] = (
                        vals.astype(np.int64).astype(np.uint32) if vals.dtype.kind == "i" else vals.astype(np.uint32)
                    )
                else:
                    w.v[vdst : vdst + count, m] = vals.T
            w.pc += size

        return dsload
    if kind.startswith("store_") and kind[6:] in _STORE:
        dt, count = _STORE[kind[6:]]

        def dsstore(w: Wave) -> None:
            m = w.mask()
            if m.any():
                vals = w.v[d0, m].astype(dt) if count == 1 else w.v[d0 : d0 + count, m].T.copy()
                _lds_store(w.lds, w.v[addr_r, m].astype(np.int64) + off, vals, count)
            w.pc += size

        return dsstore
    atomic = kind.replace("_rtn", "")
    if atomic in _ATOMIC:
        adt, afn = _ATOMIC[atomic]
        returns = "_rtn" in kind

        def dsatomic(w: Wave) -> None:
            m = w.mask()
            for lane in np.nonzero(m)[0]:
                a = np.array([int(w.v[addr_r, lane]) + off], np.int64)
                old = _lds_load(w.lds, a, np.dtype(adt), 1)
                _lds_store(w.lds, a, np.asarray(afn(old, w.v[d0, lane : lane + 1].view(adt)), adt), 1)
                if returns:
                    w.v[vdst, lane] = old.view(np.uint32)[0]
            w.pc += size

        return dsatomic
    raise EmulatorError(f"unimplemented LDS instruction {name} (DS opcode {inst.op}) at {inst.addr:#x}")
