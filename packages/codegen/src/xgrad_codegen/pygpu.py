"""GPU semantics for the PYTHON reference executor: workgroups, shared memory, barriers.

In: a linear program with SPECIAL ids (`gidx<d>`: the workgroup, `lidx<d>`: the thread within it, d = 0 for x),
DEFINE_LOCAL buffers and BARRIERs (see `xgrad_codegen.gpu`), plus buffers and variable values. Out: the STOREs'
effects. Every workgroup gets fresh shared memory that only its own threads see. Its threads run in lockstep phases:
each runs to its next BARRIER (or the end) in turn, and all must stop at the same BARRIER, or all end, before any goes
on: a divergent barrier is a ProgramError, and so is a data race on shared memory within a phase (`pyexec.Shared`).
A WMMA (tensor-core instruction) is such a stop too: there each warp's D = A @ B + C is computed from its lanes'
register fragments, lane by lane in the TensorCore's layout (`run_wmma`).

Asynchronous copies (a STORE of an INDEX, see `Renderer.async_copy_bytes`; `AsyncCopies`) read their source when
issued and fill their destination with 0xFF bytes (NaN in every float format): what it holds is undefined until the
copy lands, when a BARRIER with an `AsyncWait` finds its group completed. Until then the copy counts as a write of
its thread in every phase, so another thread touching the destination meanwhile is a race.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from xgrad.dtype import truncate
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.symbolic import sym_infer
from xgrad_codegen.pyexec import Machine, Place, ProgramError, Shared, check_program, decode
from xgrad_codegen.renderer import AsyncWait, MatrixLoad, TensorCore

Size = int | UOp


def launch_sizes(uops: Sequence[UOp]) -> tuple[tuple[Size, Size, Size], tuple[int, int, int]]:
    """(workgroups per dimension x, y, z; threads per workgroup x, y, z) of a GPU program. A workgroup count whose
    SPECIAL has a size expression is that expression (evaluate it with the variables: `eval_launch`)."""
    groups: list[Size] = [1, 1, 1]
    threads = [1, 1, 1]
    for u in uops:
        if u.op is not Ops.SPECIAL:
            continue
        name, size = u.arg
        dim = int(name[-1])
        if name.startswith("gidx"):
            groups[dim] = u.src[0] if u.src else int(size)
        else:
            threads[dim] = int(size)
    return (groups[0], groups[1], groups[2]), (threads[0], threads[1], threads[2])


def eval_launch(uops: Sequence[UOp], vals: dict[str, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """`launch_sizes` with every workgroup count evaluated under `vals`."""
    groups, threads = launch_sizes(uops)
    g = tuple(x if isinstance(x, int) else int(sym_infer(x, vals)) for x in groups)
    return (g[0], g[1], g[2]), threads


def run_gpu_program(uops: Sequence[UOp], bufs: Sequence[memoryview], vals: dict[str, int] | None = None) -> None:
    """Run every workgroup of a GPU program, its threads in lockstep phases between barriers."""
    vals = dict(vals or {})
    layout = check_program(uops)
    (gx, gy, gz), (lx, ly, lz) = eval_launch(uops, vals)
    locals_ = [u for u in uops if u.op is Ops.DEFINE_LOCAL]
    for gid in itertools.product(range(gz), range(gy), range(gx)):
        shared_bufs = [memoryview(bytearray(int(u.arg[1]) * u.dtype.itemsize)) for u in locals_]
        shared = Shared(len(bufs), {u: len(bufs) + i for i, u in enumerate(locals_)})
        threads = []
        in_flight: list[AsyncCopies] = []
        for t, lid in enumerate(itertools.product(range(lz), range(ly), range(lx))):
            m = Machine(uops, [*bufs, *shared_bufs], vals, (None, None), layout)
            m.specials = {f"gidx{d}": gid[2 - d] for d in range(3)} | {f"lidx{d}": lid[2 - d] for d in range(3)}
            m.shared, m.thread = shared, t
            m.copies = copies = AsyncCopies()
            threads.append(m)
            in_flight.append(copies)
        while True:
            stopped = [m.run_to_barrier() for m in threads]
            if not any(stopped):
                break
            where = {m.pc for m in threads if m.waiting}
            if not all(stopped) or len(where) > 1:
                raise ProgramError(
                    f"workgroup {gid[::-1]}: its threads reached different barriers (uops {sorted(where)}) or some "
                    "ended while others wait: a BARRIER (or WMMA) must be reached by every thread of a workgroup"
                )
            u = uops[threads[0].pc - 1]
            if u.op is Ops.WMMA:
                run_wmma(u, threads)
            elif u.op is Ops.LOAD:
                run_matrix_load(u, threads)
            else:
                shared.new_phase()
                for m, copies in zip(threads, in_flight, strict=True):  # copies in flight may land in this phase
                    copies.claim(m)


class AsyncCopies:
    """One thread's asynchronous copies: those issued since its last commit, then its committed groups (oldest
    first), each a list of (destination, the bytes it receives)."""

    def __init__(self) -> None:
        self.open: list[tuple[Place, bytes]] = []
        self.groups: list[list[tuple[Place, bytes]]] = []

    def issue(self, m: Machine, dst: Place, src: Place) -> None:
        """Copy `src` (zeros where its gate is off) to `dst`, which must be shared memory."""
        if m.shared is None or dst.buf < m.shared.first or not dst.gate:
            raise ProgramError("an asynchronous copy goes to shared memory (DEFINE_LOCAL), ungated")
        if src.lanes != dst.lanes or src.dtype != dst.dtype:
            raise ProgramError(f"an asynchronous copy of {src.lanes} x {src.dtype} into {dst.lanes} x {dst.dtype}")
        nbytes = dst.lanes * dst.dtype.itemsize
        if src.gate:
            offset = m.element(src, "asynchronous copy")
            data = bytes(m.bufs[src.buf][offset : offset + nbytes])
        else:
            data = bytes(nbytes)
        m.shared.access(dst, m.thread, write=True)
        offset = m.element(dst, "asynchronous copy")
        m.bufs[dst.buf][offset : offset + nbytes] = b"\xff" * nbytes  # undefined until it lands
        self.open.append((dst, data))

    def wait(self, m: Machine, arg: object) -> None:
        """Commit the open copies as one group, land the groups older than the `arg.pending` most recent."""
        if not isinstance(arg, AsyncWait):
            raise ProgramError(f"a BARRIER's arg is an AsyncWait or None, not {arg!r}")
        self.groups.append(self.open)
        self.open = []
        while len(self.groups) > arg.pending:
            for dst, data in self.groups.pop(0):
                assert m.shared is not None
                m.shared.access(dst, m.thread, write=True)
                offset = m.element(dst, "asynchronous copy")
                m.bufs[dst.buf][offset : offset + len(data)] = data

    def claim(self, m: Machine) -> None:
        """Count every copy in flight as this thread's write in the current phase."""
        assert m.shared is not None
        for dst, _ in [*self.open, *(c for g in self.groups for c in g)]:
            m.shared.access(dst, m.thread, write=True)


def run_wmma(u: UOp, threads: list[Machine]) -> None:
    """WMMA `u` for every warp of a workgroup (threads in order of their linear id, `tc.threads` per warp): gather
    each operand's matrix from the lanes' fragments by the TensorCore's register layout, D = A @ B + C (products and
    sums exact, rounded once to the accumulator dtype), and hand each lane its fragment of D."""
    tc: TensorCore = u.arg
    m, n, k = tc.dims
    if len(threads) % tc.threads:
        raise ProgramError(f"{tc.name} needs warps of {tc.threads} threads; the workgroup has {len(threads)}")
    for w in range(0, len(threads), tc.threads):
        warp = threads[w : w + tc.threads]
        mats: dict[str, dict[tuple[int, int], float]] = {"a": {}, "b": {}, "c": {}}
        for lane, t in enumerate(warp):
            for operand, src in zip("abc", u.src):
                frag = t.values[src]
                for e, v in enumerate(frag if isinstance(frag, tuple) else (frag,)):
                    mats[operand][tc.place(operand, lane, e)] = float(v)
        rnd = truncate(tc.acc)
        d = {
            (i, j): rnd(math.fsum([mats["a"][(i, x)] * mats["b"][(x, j)] for x in range(k)] + [mats["c"][(i, j)]]))
            for i in range(m)
            for j in range(n)
        }
        for lane, t in enumerate(warp):
            t.values[u] = tuple(d[tc.place("c", lane, e)] for e in range(tc.elements("c")))


def run_matrix_load(u: UOp, threads: list[Machine]) -> None:
    """A LOAD with a `MatrixLoad` arg for every warp of a workgroup: row r of matrix i is the 8 elements at the place
    lane 8i + r names; lane l gets 2 elements of each matrix (see `MatrixLoad`), each a read of shared memory by l."""
    ml: MatrixLoad = u.arg
    if len(threads) % 32:
        raise ProgramError(f"a matrix load needs warps of 32 threads; the workgroup has {len(threads)}")
    for w in range(0, len(threads), 32):
        warp = threads[w : w + 32]
        rows: list[Place] = [warp[8 * i + r].values[u.src[0]] for i in range(ml.count) for r in range(8)]
        shared = warp[0].shared
        assert shared is not None
        if any(p.lanes != 2 * ml.count or not p.gate or p.buf < shared.first for p in rows):
            raise ProgramError("a matrix load reads rows of 8 elements of shared memory, ungated")
        for lane, t in enumerate(warp):
            out = []
            for i in range(ml.count):
                for j in range(2):
                    r, c = (2 * (lane % 4) + j, lane // 4) if ml.trans else (lane // 4, 2 * (lane % 4) + j)
                    row = rows[8 * i + r]
                    at = Place(row.buf, row.dtype, row.pos + c, 1, True)
                    shared.access(at, t.thread, write=False)
                    out.extend(decode(at.dtype, t.bufs[at.buf], 1, t.element(at, "matrix load")))
            t.values[u] = tuple(out)


def is_gpu_program(uops: Sequence[UOp]) -> bool:
    """A program with SPECIAL ids (or shared memory) runs under `run_gpu_program`."""
    return any(u.op in (Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.WMMA) for u in uops)


__all__ = [
    "AsyncCopies",
    "run_matrix_load",
    "launch_sizes",
    "eval_launch",
    "run_gpu_program",
    "run_wmma",
    "is_gpu_program",
]
