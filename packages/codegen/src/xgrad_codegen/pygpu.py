"""GPU semantics for the PYTHON reference executor: workgroups, shared memory, barriers.

In: a linear program with SPECIAL ids (`gidx<d>`: the workgroup, `lidx<d>`: the thread within it, d = 0 for x),
DEFINE_LOCAL buffers and BARRIERs (see `xgrad_codegen.gpu`), plus buffers and variable values. Out: the STOREs'
effects. Every workgroup gets fresh shared memory that only its own threads see. Its threads run in lockstep phases:
each runs to its next BARRIER (or the end) in turn, and all must stop at the same BARRIER, or all end, before any goes
on: a divergent barrier is a ProgramError, and so is a data race on shared memory within a phase (`pyexec.Shared`).
A WMMA (tensor-core instruction) is such a stop too: there each warp's D = A @ B + C is computed from its lanes'
register fragments, lane by lane in the TensorCore's layout (`run_wmma`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from xgrad.dtype import truncate
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.symbolic import sym_infer
from xgrad_codegen.pyexec import Machine, ProgramError, Shared, check_program
from xgrad_codegen.renderer import TensorCore

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
        for t, lid in enumerate(itertools.product(range(lz), range(ly), range(lx))):
            m = Machine(uops, [*bufs, *shared_bufs], vals, (None, None), layout)
            m.specials = {f"gidx{d}": gid[2 - d] for d in range(3)} | {f"lidx{d}": lid[2 - d] for d in range(3)}
            m.shared, m.thread = shared, t
            threads.append(m)
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
            else:
                shared.new_phase()


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


def is_gpu_program(uops: Sequence[UOp]) -> bool:
    """A program with SPECIAL ids (or shared memory) runs under `run_gpu_program`."""
    return any(u.op in (Ops.SPECIAL, Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.WMMA) for u in uops)


__all__ = ["launch_sizes", "eval_launch", "run_gpu_program", "run_wmma", "is_gpu_program"]
