"""Kernel launch on the emulated gfx1100: loading the code object into device memory, the initial register state the
kernel descriptor asks for, and running the waves of every workgroup together as one `Waves` batch (or several, of
whole workgroups, for large grids).

In: a `CodeObject`, a kernel name, grid (workgroups) and block (work-items), the kernarg bytes, a `DeviceMemory`.
Out: the kernel's effects in that memory. Each instruction is decoded and turned into a Python function once (cached
by its bytes, across kernels), and one call executes it for every wave at that program counter, so the Python cost
grows with the instructions a kernel runs, not with its grid.
"""

from __future__ import annotations

import contextlib
import struct
import weakref
from collections.abc import Callable

import numpy as np

from xgrad_amd.elf import CodeObject, Kernel
from xgrad_amd.emulate.decode import EmulatorError, Inst, decode_at
from xgrad_amd.emulate.mem import build_ds, build_flat, build_smem
from xgrad_amd.emulate.salu import build_scalar
from xgrad_amd.emulate.valu import build_vector
from xgrad_amd.emulate.wave import EXEC, LANES, Waves
from xgrad_codegen.devmem import DeviceMemory, MemoryFaultError

Exec = Callable[[Waves], None]
MAX_STEPS = 50_000_000  # steps a batch may take before the launch is declared hung
MAX_BATCH_BYTES = 1 << 25  # VGPR and scratch bytes of the lanes executed together (whole workgroups)
LDS_LIMIT = 64 * 1024

# memory -> {code object: image base}: where each code object was loaded in each emulated memory; an image is freed
# by `unload` or when its code object is garbage-collected
_loaded: weakref.WeakKeyDictionary[DeviceMemory, weakref.WeakKeyDictionary[CodeObject, int]] = (
    weakref.WeakKeyDictionary()
)


def _free_image(mem_ref: weakref.ref[DeviceMemory], base: int) -> None:
    mem = mem_ref()
    if mem is not None:
        with contextlib.suppress(MemoryFaultError):  # already freed by `unload`
            mem.free(base)


def load(co: CodeObject, mem: DeviceMemory) -> int:
    """Copy the code object's image (relocated) into `mem` once; returns its base address."""
    per_mem = _loaded.setdefault(mem, weakref.WeakKeyDictionary())
    base = per_mem.get(co)
    if base is None:
        base = mem.alloc(co.image_size)
        mem.write(base, co.image(base))
        per_mem[co] = base
        weakref.finalize(co, _free_image, weakref.ref(mem), base)
    return base


def unload(co: CodeObject, mem: DeviceMemory) -> None:
    """Free the image `load` placed in `mem` (a module unload)."""
    per_mem = _loaded.get(mem)
    base = per_mem.pop(co, None) if per_mem is not None else None
    if base is not None:
        _free_image(weakref.ref(mem), base)


def build(inst: Inst) -> Exec:
    """The executor of one decoded instruction."""
    enc = inst.enc
    if enc.startswith("SOP") or enc == "MUBUF":
        if enc == "MUBUF" and inst.name not in ("buffer_gl0_inv", "buffer_gl1_inv"):
            raise EmulatorError(
                f"unimplemented buffer instruction {inst.name} (MUBUF opcode {inst.op}) at {inst.addr:#x}"
            )
        return build_scalar(inst)
    if enc == "SMEM":
        return build_smem(inst)
    if enc == "DS":
        return build_ds(inst)
    if enc in ("FLAT", "GLOBAL", "SCRATCH"):
        return build_flat(inst)
    return build_vector(inst)


class Program:
    """A kernel's instructions, decoded and built on first execution, indexed by byte offset / 4."""

    def __init__(self, code: bytes) -> None:
        self.code = code
        self.table: list[Exec | None] = [None] * (len(code) // 4 + 1)

    def at(self, pc: int) -> Exec:
        """The executor of the instruction at byte offset `pc`."""
        i = pc >> 2
        fn = self.table[i] if 0 <= i < len(self.table) else None
        if fn is None:
            fn = self.table[i] = _executor(self.code, pc)
        return fn


# executors by the instruction's bytes (with its literal): an executor depends on nothing else (branch offsets are
# relative, s_getpc reads the pc at run time), and most kernels share most of their instructions
_executors: dict[bytes, Exec] = {}
EXECUTOR_CACHE = 1 << 16


_windows: dict[bytes, Exec] = {}  # by the 12 bytes at pc (the longest instruction): no decoding on a hit


def _executor(code: bytes, pc: int) -> Exec:
    window = code[pc : pc + 12]
    fn = _windows.get(window)
    if fn is not None:
        return fn
    inst = decode_at(code, pc)
    key = code[pc : pc + inst.size]
    fn = _executors.get(key)
    if fn is None:
        if len(_executors) >= EXECUTOR_CACHE:
            _executors.clear()
            _windows.clear()
        fn = _executors[key] = build(inst)
    if len(_windows) >= EXECUTOR_CACHE:
        _windows.clear()
    _windows[window] = fn
    return fn


_programs: dict[bytes, Program] = {}  # by machine code: equal kernels (a module loaded again) share their build
PROGRAM_CACHE = 256


def program(co: CodeObject, name: str) -> Program:
    """The (cached) built program of kernel `name`; its executors do not depend on where the code is loaded."""
    code = co.kernels[name].code
    prog = _programs.get(code)
    if prog is None:
        if len(_programs) >= PROGRAM_CACHE:
            del _programs[next(iter(_programs))]  # the oldest
        prog = _programs[code] = Program(code)
    return prog


def _initial_sgprs(k: Kernel, w: Waves, kernarg: int, dispatch: int, wg: np.ndarray) -> None:
    """The user SGPRs the descriptor enables (in their fixed order from s0), then from USER_SGPR_COUNT the system
    SGPRs: the workgroup ids enabled (`wg`: [3, waves]) and the workgroup info."""
    d = k.descriptor
    i = 0
    if d.enable_sgpr_private_segment_buffer:
        i += 4
    if d.enable_sgpr_dispatch_ptr:
        w.s[i], w.s[i + 1] = dispatch & 0xFFFFFFFF, dispatch >> 32
        i += 2
    if d.enable_sgpr_queue_ptr:
        i += 2
    if d.enable_sgpr_kernarg_segment_ptr:
        w.s[i], w.s[i + 1] = kernarg & 0xFFFFFFFF, kernarg >> 32
        i += 2
    if d.enable_sgpr_dispatch_id:
        i += 2
    if d.enable_sgpr_flat_scratch_init:
        i += 2
    if d.enable_sgpr_private_segment_size:
        i += 1
    s = d.user_sgpr_count
    for enabled, ids in zip(
        (d.enable_sgpr_workgroup_id_x, d.enable_sgpr_workgroup_id_y, d.enable_sgpr_workgroup_id_z), wg
    ):
        if enabled:
            w.s[s] = ids
            s += 1
    if d.enable_sgpr_workgroup_info:
        w.s[s] = 0
        s += 1
    if d.enable_private_segment:
        w.s[s] = 0  # the private segment wave offset: scratch addresses here are offsets in each lane's own segment


def _dispatch_packet(grid: tuple[int, int, int], block: tuple[int, int, int], k: Kernel, kernarg: int) -> bytes:
    """An hsa_kernel_dispatch_packet_t (64 bytes), for kernels that read sizes through the dispatch pointer."""
    dims = 3 if grid[2] > 1 or block[2] > 1 else 2 if grid[1] > 1 or block[1] > 1 else 1
    sizes = [g * b for g, b in zip(grid, block)]
    return struct.pack("<HHHHHHIIIIIQQQQ", 0, dims, *block, 0, *sizes, 0, k.lds_size, 0, kernarg, 0, 0)


def launch(
    co: CodeObject,
    name: str,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    kernarg: bytes,
    mem: DeviceMemory,
    dynamic_lds: int = 0,
) -> None:
    """Run kernel `name` over `grid` workgroups of `block` work-items, with `kernarg` as its argument segment."""
    if name not in co.kernels:
        raise EmulatorError(f"the code object has no kernel {name!r}; it has {sorted(co.kernels)}")
    k = co.kernels[name]
    if k.wave_size != LANES:
        raise EmulatorError(f"kernel {name} is wave{k.wave_size}; the emulator runs gfx1100 wave32 code objects only")
    if not co.target.endswith("gfx1100"):
        raise EmulatorError(f"kernel {name} targets {co.target}; the emulator executes gfx1100 code only")
    threads = block[0] * block[1] * block[2]
    if min(grid) < 0 or min(block) < 1 or threads > k.max_flat_workgroup_size:
        raise EmulatorError(
            f"grid {grid} / block {block} is invalid for {name} (at most {k.max_flat_workgroup_size} work-items)"
        )
    lds_bytes = k.lds_size + dynamic_lds
    if lds_bytes > LDS_LIMIT:
        raise EmulatorError(f"kernel {name} needs {lds_bytes} bytes of LDS, over gfx1100's {LDS_LIMIT}")
    if k.descriptor.uses_dynamic_stack:
        raise EmulatorError(f"kernel {name} uses a dynamic stack (recursion or variable-size allocas): not emulated")
    if min(grid) == 0:
        return  # no workgroups: a launch over a zero-size tensor does nothing
    image = load(co, mem)
    code_base = image + k.code_offset
    karg = mem.alloc(max(len(kernarg), 1) + 256)
    mem.write(karg, kernarg)
    packet = mem.alloc(64)
    mem.write(packet, _dispatch_packet(grid, block, k, karg))
    prog = program(co, name)
    per_group = -(-threads // LANES)
    n_vgprs = max(k.vgpr_count, (k.descriptor.granulated_workitem_vgpr_count + 1) * 8)
    t = np.arange(per_group * LANES)
    packed = (t % block[0]) | ((t // block[0]) % block[1]) << 10 | (t // (block[0] * block[1])) << 20
    live = np.minimum(LANES, threads - np.arange(per_group) * LANES)
    exec_bits = (np.int64(1) << live) - 1
    n_groups = grid[0] * grid[1] * grid[2]
    lane_bytes = 4 * n_vgprs + k.descriptor.private_segment_fixed_size
    chunk = max(1, min(n_groups, MAX_BATCH_BYTES // (per_group * LANES * lane_bytes)))  # whole workgroups per batch
    try:
        for first in range(0, n_groups, chunk):
            ids = np.arange(first, min(first + chunk, n_groups))
            g = ids.size
            group = np.repeat(np.arange(g), per_group)
            w = Waves(g * per_group, n_vgprs, mem, code_base, lds_bytes, group, k.descriptor.private_segment_fixed_size)
            wg = np.stack([ids % grid[0], (ids // grid[0]) % grid[1], ids // (grid[0] * grid[1])])
            _initial_sgprs(k, w, karg, packet, np.repeat(wg, per_group, axis=1))
            w.v[0] = np.tile(packed, g).astype(np.uint32)
            w.s[EXEC] = np.tile(exec_bits, g)
            run(w, prog)
    finally:
        mem.free(karg)
        mem.free(packet)


def run(w: Waves, prog: Program) -> None:
    """Execute a batch of waves to s_endpgm: each step runs the instruction at the lowest program counter for the
    waves there. Waves reconverge after divergent branches, and no wave passes an instruction (an s_barrier among
    them) before every wave behind it has reached it, so barriers need no other handling."""
    at = prog.at
    pc, done = w.pc, w.done
    for _ in range(MAX_STEPS):
        if done.any():
            live = ~done
            if not live.any():
                return
            p = int(pc[live].min())
            sel = live & (pc == p)
        else:
            p = int(pc.min())
            sel = pc == p
        if sel.all():
            w.select_all()
        else:
            w.select(np.nonzero(sel)[0])
        at(p)(w)
    raise EmulatorError(f"waves ran {MAX_STEPS} steps without ending (pc {int(w.pc.min()):#x}): a hung kernel?")
