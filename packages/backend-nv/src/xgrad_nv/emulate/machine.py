"""Running decoded PTX over a grid: the thread state and the scheduler.

In: a parsed module, decoded once per kernel into closures (`decode.py`). Out: `Module.launch`, which runs the grid
in chunks of whole blocks, every thread of a chunk at once as one lane of numpy arrays.

Scheduling is per thread PC: each step takes the lowest PC among the threads that can run, runs the threads standing
there together along straight-line code until a branch, a label or a barrier, and re-picks. Threads that diverge
therefore run their sides one after the other and meet again where their PCs meet (any control-flow layout, loops
included). A thread at `bar.sync` waits until every thread of the chunk that has not exited is waiting too (a chunk
holds whole blocks, so this is at least as strict as a per-block barrier).
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from xgrad_codegen.devmem import DeviceMemory, MemoryFaultError
from xgrad_nv.emulate.asynccopy import AsyncCopies
from xgrad_nv.emulate.decode import Decoded, decode_function
from xgrad_nv.emulate.errors import EmulatorError
from xgrad_nv.emulate.inline import inline_calls
from xgrad_nv.emulate.parse import TYPE_BYTES, Function, ParsedModule, Variable, parse_ptx
from xgrad_nv.emulate.values import UINT, Array, Mask

SHARED_WINDOW = 1 << 56  # generic addresses of shared memory: SHARED_WINDOW + offset in the block's shared memory
LOCAL_WINDOW = 1 << 57  # generic addresses of local memory: LOCAL_WINDOW + offset in the thread's local memory
CHUNK_THREADS = 1 << 16  # threads run together at most (whole blocks; a bigger block runs alone)
NORMAL, BRANCH, EXIT, BARRIER = 0, 1, 2, 3


class Threads:
    """The state of one chunk of blocks: registers (one array per register, a lane per thread), special registers,
    and the memories the threads see."""

    def __init__(
        self,
        kernel: Kernel,
        mem: DeviceMemory,
        first_block: int,
        nblocks: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        params: bytes,
        symbols: dict[str, int],
        shared_bytes: int,
    ) -> None:
        self.kernel = kernel
        self.mem = mem
        bsize = block[0] * block[1] * block[2]
        self.bsize = bsize
        self.n = n = nblocks * bsize
        self.nblocks = nblocks
        lin = np.arange(n, dtype=np.int64)
        self.blk = lin // bsize  # block index within the chunk
        tl = lin % bsize
        self.tid_linear = tl
        cta = self.blk + first_block
        self._special: dict[str, Array] = {}
        sp = self._special
        sp["%tid.x"] = (tl % block[0]).astype(np.uint32)
        sp["%tid.y"] = (tl // block[0] % block[1]).astype(np.uint32)
        sp["%tid.z"] = (tl // (block[0] * block[1])).astype(np.uint32)
        sp["%ctaid.x"] = (cta % grid[0]).astype(np.uint32)
        sp["%ctaid.y"] = (cta // grid[0] % grid[1]).astype(np.uint32)
        sp["%ctaid.z"] = (cta // (grid[0] * grid[1])).astype(np.uint32)
        for k, ax in enumerate("xyz"):
            sp[f"%ntid.{ax}"] = np.asarray(block[k], np.uint32)
            sp[f"%nctaid.{ax}"] = np.asarray(grid[k], np.uint32)
        sp["%laneid"] = (tl % 32).astype(np.uint32)
        sp["%warpid"] = (tl // 32).astype(np.uint32)
        sp["%nwarpid"] = np.asarray(-(-bsize // 32), np.uint32)
        for name in ("%smid", "%gridid"):
            sp[name] = np.asarray(0, np.uint32)
        sp["%nsmid"] = np.asarray(1, np.uint32)
        lane = sp["%laneid"].astype(np.uint64)
        one = np.uint64(1)
        sp["%lanemask_eq"] = (one << lane).astype(np.uint32)
        sp["%lanemask_lt"] = ((one << lane) - one).astype(np.uint32)
        sp["%lanemask_le"] = ((one << (lane + one)) - one).astype(np.uint32)
        sp["%lanemask_gt"] = (~((one << (lane + one)) - one)).astype(np.uint32)
        sp["%lanemask_ge"] = (~((one << lane) - one)).astype(np.uint32)
        self.clock = 0
        # registers start as zeros; one shared array per width (register arrays are never changed in place)
        zeros = {w: np.zeros(n, np.bool_ if w == 0 else UINT[w]) for w in set(kernel.widths)}
        self.regs: list[Array] = [zeros[w] for w in kernel.widths]
        self.params = params
        self.symbols = symbols
        self.shared = np.zeros((nblocks, max(shared_bytes, 16)), np.uint8)
        self.local = np.zeros((n, max(kernel.local_bytes, 16)), np.uint8)
        self.copies = AsyncCopies(n)  # cp.async copies in flight

    def special(self, name: str) -> Array:
        """A special register's value per lane (or one value for all)."""
        if name in ("%clock", "%clock64"):
            self.clock += 1
            return np.asarray(self.clock, np.uint64)
        if name not in self._special:
            raise EmulatorError(f"kernel {self.kernel.name}: unknown special register {name}")
        return self._special[name]

    def symbol(self, name: str) -> int:
        """The address of a variable in its own state space (global addresses are generic too)."""
        if name not in self.symbols:
            raise EmulatorError(f"kernel {self.kernel.name}: unknown variable {name}")
        return self.symbols[name]

    def write(self, idx: int, bits: Array, mask: Mask) -> None:
        """Set register `idx` to `bits` on the lanes of `mask` (all when None)."""
        if mask is None:
            if bits.shape != (self.n,):
                bits = np.broadcast_to(bits, (self.n,)).copy()
            self.regs[idx] = bits
        else:
            self.regs[idx] = np.where(mask, bits, self.regs[idx])

    def fault(self, what: str) -> EmulatorError:
        """An access error naming the kernel."""
        return EmulatorError(f"kernel {self.kernel.name}: {what}")

    def _span(self, addrs: Array, k: int) -> tuple[Array, Array] | None:
        """The common case: every address in one allocation, a multiple of `k` bytes from the lowest. Returns that
        span of device memory (a byte view) and the element index of each address in it, or None."""
        if addrs.size == 0:
            return None
        lo, hi = int(addrs.min()), int(addrs.max())
        offs = addrs - np.uint64(lo)
        if (offs % np.uint64(k)).any():
            return None
        try:
            span = self.mem.view(lo, hi - lo + k)
        except MemoryFaultError:
            return None  # spans allocations or faults: the general path sorts it out (and names the address)
        return span, (offs // np.uint64(k)).astype(np.int64)

    def global_load(self, addrs: Array, dt: np.dtype[Any]) -> Array:
        """Load from device memory, naming the kernel on a fault."""
        addrs = np.asarray(addrs, np.uint64)
        if (fast := self._span(addrs, dt.itemsize)) is not None:
            span, idx = fast
            out: Array = span.view(dt)[idx]
            return out
        try:
            return self.mem.load(addrs, dt)
        except MemoryFaultError as e:
            raise self.fault(f"global load outside device memory: {e}") from e

    def global_store(self, addrs: Array, vals: Array) -> None:
        """Store to device memory, naming the kernel on a fault (lanes storing to one address: the last one wins)."""
        addrs = np.asarray(addrs, np.uint64)
        if (fast := self._span(addrs, vals.dtype.itemsize)) is not None:
            span, idx = fast
            span.view(vals.dtype)[idx] = vals
            return
        try:
            self.mem.store(addrs, vals)
        except MemoryFaultError as e:
            raise self.fault(f"global store outside device memory: {e}") from e


@dataclass
class Kernel:
    """A decoded `.entry`: parameters, register widths, the decoded instructions, memory sizes."""

    name: str
    params: list[tuple[str, str]]
    param_vars: list[Variable]
    widths: list[int]
    code: list[Decoded]
    local_bytes: int
    local_offsets: dict[str, int]
    shared_vars: list[Variable]


class Module:
    """A loaded PTX module: its kernels by name, and `launch`."""

    def __init__(self, parsed: ParsedModule, kernels: dict[str, Kernel] | None = None) -> None:
        self.parsed = parsed
        self._globals: dict[int, dict[str, int]] = {}  # id(mem) -> module-level .global/.const addresses
        self._mems: dict[int, DeviceMemory] = {}
        if kernels is None:
            spaces = {v.name: v.space for v in parsed.variables}
            kernels = {n: _build_kernel(fn, parsed, spaces) for n, fn in parsed.functions.items() if fn.entry}
        self.kernels: dict[str, Kernel] = kernels

    def _global_symbols(self, mem: DeviceMemory) -> dict[str, int]:
        key = id(mem)
        if key not in self._globals or self._mems.get(key) is not mem:
            addrs = {}
            for v in self.parsed.variables:
                if v.space in ("global", "const"):
                    addrs[v.name] = mem.alloc(max(v.nbytes, 1))
                    if v.init:
                        mem.write(addrs[v.name], v.init)
            self._globals[key] = addrs
            self._mems[key] = mem
        return self._globals[key]

    def launch(
        self,
        name: str,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        args: list[Any],
        mem: DeviceMemory,
        dynamic_shared: int = 0,
    ) -> None:
        """Run kernel `name` over `grid` blocks of `block` threads with one argument per `.param`."""
        if name not in self.kernels:
            raise EmulatorError(f"no kernel {name!r} in this PTX module; it has {sorted(self.kernels)}")
        k = self.kernels[name]
        g = _dims(grid, "grid")
        b = _dims(block, "block")
        bsize = b[0] * b[1] * b[2]
        if bsize > 1024:
            raise EmulatorError(f"kernel {name}: a block of {bsize} threads is more than 1024; use smaller blocks")
        params = _pack_params(k, args)
        symbols = dict(self._global_symbols(mem))
        off = 0
        for v in k.shared_vars:
            off = -(-off // max(v.align, 1)) * max(v.align, 1)
            symbols[v.name] = off
            off += v.nbytes if not v.extern else 0
        dyn_base = -(-off // 16) * 16
        for v in k.shared_vars:
            if v.extern:
                symbols[v.name] = dyn_base
        shared_bytes = dyn_base + dynamic_shared
        symbols.update(k.local_offsets)
        poff = 0
        for v in k.param_vars:
            poff = -(-poff // max(v.align, 1)) * max(v.align, 1)
            symbols[v.name] = poff
            poff += v.nbytes
        nblocks = g[0] * g[1] * g[2]
        per = max(1, CHUNK_THREADS // bsize)
        with np.errstate(all="ignore"):
            for first in range(0, nblocks, per):
                st = Threads(k, mem, first, min(per, nblocks - first), g, b, params, symbols, shared_bytes)
                _run(k, st)


def _dims(d: tuple[int, ...], what: str) -> tuple[int, int, int]:
    t = tuple(int(x) for x in d) + (1,) * (3 - len(d))
    if len(t) != 3 or min(t) < 1:
        raise EmulatorError(f"{what} dimensions {d} must be 1 to 3 positive integers")
    return t[0], t[1], t[2]


def _pack_params(k: Kernel, args: list[Any]) -> bytes:
    if len(args) < len(k.param_vars):
        raise EmulatorError(f"kernel {k.name} takes {len(k.param_vars)} arguments {k.params}, got {len(args)}")
    buf = bytearray()
    # extra arguments are ignored, as by cuLaunchKernel, which reads as many as the kernel declares (a renderer drops
    # the trailing buffers a kernel never uses)
    for v, a in zip(k.param_vars, args[: len(k.param_vars)], strict=True):
        align = max(v.align, 1)
        buf += bytes(-len(buf) % align)
        if isinstance(a, (bytes, bytearray)):
            if len(a) != v.nbytes:
                raise EmulatorError(f"kernel {k.name}: parameter {v.name} takes {v.nbytes} bytes, got {len(a)}")
            buf += a
        elif v.dtype in ("f32", "f64"):
            buf += np.asarray(a, np.float32 if v.dtype == "f32" else np.float64).tobytes()
        else:
            size = TYPE_BYTES[v.dtype]
            buf += (int(a) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
    return bytes(buf)


def _build_kernel(fn: Function, parsed: ParsedModule, spaces: dict[str, str]) -> Kernel:
    fn = inline_calls(fn, parsed.functions)
    symbols = dict(spaces)
    local_offsets = {}
    off = 0
    sizes: dict[str, Variable] = {}
    for v in fn.variables:  # a call's slots are declared again at each call site: one slot of the largest size
        symbols[v.name] = v.space
        if v.space in ("local", "callparam") and (v.name not in sizes or v.nbytes > sizes[v.name].nbytes):
            sizes[v.name] = v
    for v in sizes.values():
        off = -(-off // max(v.align, 1)) * max(v.align, 1)
        local_offsets[v.name] = off
        off += v.nbytes
    for p in fn.params:
        symbols[p.name] = "param"
    shared = [v for v in parsed.variables if v.space == "shared"]
    shared += [v for v in fn.variables if v.space == "shared"]
    widths, code = decode_function(fn, symbols)
    params = [(p.name, "." + p.dtype) for p in fn.params]
    return Kernel(fn.name, params, fn.params, widths, code, off, local_offsets, shared)


_LOADED: OrderedDict[str, Module] = OrderedDict()  # PTX text -> a module decoded from it (most recent last)
LOAD_CACHE = 64


def load_ptx(text: str) -> Module:
    """Parse and decode a PTX module. Decoded kernels hold no state, so loading the same text again shares them
    (a new Module: module-level variables stay per module and device memory)."""
    if (done := _LOADED.get(text)) is not None:
        _LOADED.move_to_end(text)
        return Module(done.parsed, done.kernels)
    was_enabled = gc.isenabled()
    gc.disable()  # a module is tens of thousands of small objects: collections while building them double the time
    try:
        mod = Module(parse_ptx(text))
    finally:
        if was_enabled:
            gc.enable()
    _LOADED[text] = mod
    while len(_LOADED) > LOAD_CACHE:
        _LOADED.popitem(last=False)
    return Module(mod.parsed, mod.kernels)


def _run(k: Kernel, st: Threads) -> None:
    code = k.code
    n = st.n
    end = len(code)
    pcs = np.zeros(n, np.int64)
    live = np.ones(n, bool)
    waiting = np.zeros(n, bool)
    while True:
        runnable = live & ~waiting
        if not runnable.any():
            if not waiting.any():
                return
            pcs[waiting] += 1
            waiting[:] = False
            continue
        pc = int(pcs[runnable].min())
        group = runnable & (pcs == pc)
        mask: Mask = None if group.all() else group
        while True:
            if pc >= end:
                live &= ~group
                break
            d = code[pc]
            if d.kind == NORMAL:
                if d.guard is None:
                    d.step(st, mask)
                else:
                    g = st.regs[d.guard]
                    g = ~g if d.guard_neg else g
                    m = g if mask is None else g & mask
                    if m.all():
                        d.step(st, None)
                    elif m.any():
                        d.step(st, m)
                pc += 1
                if d.stop:
                    pcs[group] = pc
                    break
            elif d.kind == BRANCH:
                if d.guard is None:
                    pcs[group] = d.target
                    break
                g = st.regs[d.guard]
                g = ~g if d.guard_neg else g
                pcs[group & g] = d.target
                pcs[group & ~g] = pc + 1
                break
            elif d.kind == EXIT:
                if d.guard is None:
                    live &= ~group
                else:
                    g = st.regs[d.guard]
                    g = ~g if d.guard_neg else g
                    live &= ~(group & g)
                    pcs[group & ~g] = pc + 1
                break
            else:  # BARRIER
                pcs[group] = pc
                waiting |= group
                break
