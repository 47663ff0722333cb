"""Collectives across the processes of an MPI job, on xgrad tensors, lazily: each is a step of the schedule.

In: a Tensor on one device (every rank calls the same collective, in the same order, on tensors of the same shape and
dtype). Out: a lazy Tensor whose node is COLLECTIVE(x) with a `Collective` as its arg. The scheduler makes it an item
of its own, like a COPY (x is realized into one contiguous run of a buffer first, the output gets a new buffer), the
realize engine calls `Collective.run(out, src)` on the two buffers, and a TinyJit captures it with the kernels around
it and replays it on the same buffers.

How it runs, in order of preference:
1. The device's own collective library: a device object may have an optional method
   `collective(step: Collective, out: Buffer, src: Buffer) -> None` that performs `step` between the same device of
   every rank (NCCL for NV, RCCL for AMD: none yet; such a hook would take its communicator's id from rank 0 through
   `xgrad.distributed.comm`). It must honour DIST_TIMEOUT itself.
2. Host memory, without copies: when the buffers are host-visible (CPU), MPI reads and writes the xgrad buffers
   themselves (memoryviews of the allocator's memory passed to mpi4py's buffer interface). Broadcast's root copies its
   input into the output once (MPI broadcasts in place); every other rank receives straight into the output.
3. Any other device: the input is copied to the host, reduced there, and the result copied back.

Every MPI call is nonblocking and waited on under the watchdog of `xgrad.distributed.comm` (DIST_TIMEOUT).

Several sources: `all_reduce_coalesced(tensors)` and `broadcast_coalesced(tensors)` are one COLLECTIVE over all of
them; each is realized into a buffer of its own and copied once into the output (a memcpy), where MPI then reduces
(or broadcasts) in place.

Sizes: all_reduce and broadcast take any shape; all_gather concatenates every rank's tensor along axis 0 (same
shape on every rank); reduce_scatter reduces along axis 0 and gives rank r the rows `split_rows(n, world)[r]`: n
need not be divisible by the world size (the first n % world ranks get one row more, as numpy's array_split).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from xgrad.buffer import Buffer, host_visible
from xgrad.device import Device
from xgrad.distributed.comm import communicator
from xgrad.distributed.launch import DistributedError, rank, world_size
from xgrad.dtype import DType, dtypes
from xgrad.errors import DeviceError, DTypeError, ShapeError
from xgrad.helpers import prod
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops, UOp

REDUCE_OPS = ("sum", "mean", "max", "min")
# xgrad dtype -> the MPI datatype (by its mpi4py name) the reductions use; broadcast and all_gather move bytes
MPI_TYPES = {
    dtypes.float32: "FLOAT",
    dtypes.float64: "DOUBLE",
    dtypes.int8: "INT8_T",
    dtypes.int16: "INT16_T",
    dtypes.int32: "INT32_T",
    dtypes.int64: "INT64_T",
    dtypes.uint8: "UINT8_T",
    dtypes.uint16: "UINT16_T",
    dtypes.uint32: "UINT32_T",
    dtypes.uint64: "UINT64_T",
    dtypes.bool: "C_BOOL",
}
MPI_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}
BOOL_OPS = {"max": "LOR", "min": "LAND"}  # MPI reduces C_BOOL with logical ops only
# MPI has no 16-bit floats: they travel as UINT16_T and are reduced by an op of ours (`half_op`), through float64
# (float16: each step of the reduction rounds once, as a float16 add would) or float32 (bfloat16)
HALF_TYPES = (dtypes.float16, dtypes.bfloat16)
NUMPY_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}
_half_ops: dict[tuple[str, str], Any] = {}


def half_to_float(bits: np.ndarray, dtype: DType) -> np.ndarray:
    """16-bit floats (their bits as uint16) as float64 (float16) or float32 (bfloat16)."""
    if dtype == dtypes.float16:
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float_to_half(x: np.ndarray, dtype: DType) -> np.ndarray:
    """float64/float32 values rounded to the nearest 16-bit float (ties to even), as uint16 bits."""
    if dtype == dtypes.float16:
        return x.astype(np.float16).view(np.uint16)
    u = x.astype(np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def half_op(MPI: Any, dtype: DType, op: str) -> Any:  # noqa: N803  (the module's own name)
    """The MPI reduction `op` on 16-bit floats of `dtype` carried as UINT16_T (made once per dtype and op)."""
    key = (dtype.name, op)
    if key not in _half_ops:

        def reduce(inbuf: Any, inoutbuf: Any, datatype: Any, dtype: DType = dtype, fn: Any = NUMPY_OPS[op]) -> None:
            a = np.frombuffer(inbuf, np.uint16)
            b = np.frombuffer(inoutbuf, np.uint16)
            b[:] = float_to_half(fn(half_to_float(a, dtype), half_to_float(b, dtype)), dtype)

        _half_ops[key] = MPI.Op.Create(reduce, commute=True)
    return _half_ops[key]


def mpi_type_and_op(MPI: Any, dtype: DType, op: str) -> tuple[Any, Any]:  # noqa: N803
    """The MPI datatype the elements of `dtype` travel as, and the MPI op that reduces them with `op`."""
    if dtype in HALF_TYPES:
        return MPI.UINT16_T, half_op(MPI, dtype, op)
    return getattr(MPI, MPI_TYPES[dtype]), getattr(MPI, (BOOL_OPS if dtype == dtypes.bool else MPI_OPS)[op])


@dataclass(frozen=True)
class Collective:
    """The arg of a COLLECTIVE node: what to do across `world` ranks. `shape` is the output's; `counts` (for
    reduce_scatter) the elements each rank receives. `phase` splits an all_reduce in two steps of the schedule, so
    that the steps between them run while MPI works: "start" posts it (MPI then writes the step's output while a
    thread of the communicator drives it), "wait" completes the one started into its source and copies the result
    into its own output; "" does both at once. The first `after` sources are not read: they only order the step
    after the steps that compute them (another bucket's start)."""

    kind: str  # "all_reduce", "broadcast", "all_gather" or "reduce_scatter"
    op: str  # "sum", "max" or "min" for the reductions, "" otherwise
    root: int  # broadcast's source rank
    world: int
    shape: tuple[int, ...]
    counts: tuple[int, ...] = ()
    phase: str = ""  # "", "start" or "wait"
    after: int = 0

    @property
    def name(self) -> str:
        """What DEBUG output and errors call this step: `all_reduce(sum)`, `broadcast(0)`, `all_gather`,
        `all_reduce(sum) start`."""
        if self.op:
            base = f"{self.kind}({self.op})"
        else:
            base = f"broadcast({self.root})" if self.kind == "broadcast" else self.kind
        return f"{base} {self.phase}" if self.phase else base

    def run(self, out: Buffer, *srcs: Buffer) -> None:
        """Perform the collective: read `srcs` (several: the collective of them laid end to end), write `out` (the
        engine calls this for the schedule item)."""
        comm = communicator()
        if comm.size != self.world:
            raise DistributedError(f"{self.name} was built for {self.world} ranks, this job has {comm.size}")
        srcs = srcs[self.after :]
        if self.phase == "wait":  # the result MPI wrote into the start's output, once complete, copied into out
            comm.finish(in_flight_key(srcs[0]), self.name)
            out.copyin(srcs[0].as_bytes())
            return
        whole = replace(self, phase="", after=0) if self.phase else self
        hook = getattr(Device[out.device], "collective", None)
        if hook is not None:  # the device's own collective library (a start runs whole: its wait then only copies)
            hook(whole, out, *srcs)
            return
        direct = host_visible(out.allocator) and all(host_visible(s.allocator) for s in srcs)
        if self.phase == "start" and direct and self.kind == "all_reduce":
            self._start(comm, out, srcs)
            return
        if self.phase == "start":  # staged through host memory: done at once, the wait only copies
            whole.run(out, *srcs)
            return
        if direct:
            recv = out.allocator.as_memoryview(out.handle)  # type: ignore[attr-defined]
        else:
            recv = memoryview(bytearray(out.nbytes))
        send: memoryview | None = None
        staged: bytearray | None = None
        if len(srcs) == 1:
            send = srcs[0].as_bytes()  # synchronizes the device: the kernels writing it are done
        elif self.kind == "all_reduce":  # coalesced: the sources laid end to end in a send buffer, reduced into out
            staged = take_staging(out.nbytes)
            send = _lay_end_to_end(srcs, memoryview(staged)[: out.nbytes])
        else:  # coalesced broadcast: the sources laid end to end in the output, broadcast there in place
            _lay_end_to_end(srcs, recv)
        comm.wait(self._post(comm, send, recv, out.dtype), self.name)
        if staged is not None:
            give_staging(staged)
        if not direct:
            out.copyin(recv)

    def _start(self, comm: Any, out: Buffer, srcs: tuple[Buffer, ...]) -> None:
        """Post the all_reduce of `srcs` (laid end to end in a send buffer of its own) into `out` and return; the
        wait step completes it."""
        staged = take_staging(out.nbytes)
        send = _lay_end_to_end(srcs, memoryview(staged)[: out.nbytes])
        recv = out.allocator.as_memoryview(out.handle)  # type: ignore[attr-defined]
        request = self._post(comm, send, recv, out.dtype)
        comm.start(in_flight_key(out), request, self.name, lambda: give_staging(staged))

    def _post(self, comm: Any, send: memoryview | None, recv: memoryview, dtype: DType) -> Any:
        """The MPI request of this collective from `send` into `recv` (a broadcast's root copies send into recv)."""
        MPI = comm.MPI  # noqa: N806
        c = comm.comm
        if send is None:  # coalesced broadcast: the root's sources are in recv already
            return c.Ibcast([recv, MPI.BYTE], root=self.root)
        if self.kind == "broadcast":
            if comm.rank == self.root:
                recv[:] = send
            return c.Ibcast([recv, MPI.BYTE], root=self.root)
        if self.kind == "all_gather":
            return c.Iallgather([send, MPI.BYTE], [recv, MPI.BYTE])
        mpi_type, op = mpi_type_and_op(MPI, dtype, self.op)
        n_in = send.nbytes // dtype.itemsize
        if self.kind == "all_reduce":
            return c.Iallreduce([send, n_in, mpi_type], [recv, n_in, mpi_type], op)
        mine = self.counts[comm.rank]
        return c.Ireduce_scatter([send, n_in, mpi_type], [recv, mine, mpi_type], list(self.counts), op)


_free_staging: list[bytearray] = []  # send buffers of coalesced all_reduces that no collective uses now
_staging_use = [0, 0]  # how many are taken now, and the most ever taken at once


def take_staging(nbytes: int) -> bytearray:
    """Host memory of at least `nbytes` bytes that a coalesced all_reduce sends from, until `give_staging`: the
    smallest free one that is big enough, else a new one. Why not reduce in place in the output, as a broadcast does:
    Open MPI's ring Iallreduce runs 1.3-1.8x slower with MPI_IN_PLACE (2 ranks, 64 KB to 64 MB)."""
    _staging_use[0] += 1
    _staging_use[1] = max(_staging_use)
    fits = [b for b in _free_staging if len(b) >= nbytes]
    if not fits:
        return bytearray(nbytes)
    best = min(fits, key=len)
    _free_staging.remove(best)
    return best


def give_staging(buf: bytearray) -> None:
    """Hand back a send buffer of `take_staging`. As many are kept as were ever in use at once (DataParallel's
    overlapped buckets each hold one until their wait), the largest, so a training step allocates none."""
    _staging_use[0] -= 1
    _free_staging.append(buf)
    if len(_free_staging) > _staging_use[1]:
        _free_staging.remove(min(_free_staging, key=len))


def in_flight_key(buf: Buffer) -> tuple[int, int]:
    """What names the memory a started collective writes: its start's output and its wait's source are the same
    memory (the same Buffer, or views of one arena at one offset)."""
    return (id(buf.base), buf.offset) if buf.base is not None else (id(buf), 0)


def _lay_end_to_end(srcs: tuple[Buffer, ...], dest: memoryview) -> memoryview:
    """`dest` filled with the bytes of `srcs`, one after another (one memcpy each)."""
    start = 0
    for s in srcs:
        piece = s.as_bytes()  # synchronizes the device: the kernels writing it are done
        dest[start : start + piece.nbytes] = piece
        start += piece.nbytes
    return dest


# ---- building the lazy tensors ----
def _checked(x: Tensor, what: str) -> str:
    device = x.device
    if not isinstance(device, str):
        raise DeviceError(
            f"{what} of a tensor on several devices {device}: a collective across processes runs on one device per "
            "process; gather it first (.to(device)) or call it per shard"
        )
    return device


def _reduction_dtype(x: Tensor, op: str, what: str) -> None:
    if op not in REDUCE_OPS:
        raise DistributedError(f"{what}: op={op!r} is not one of {', '.join(REDUCE_OPS)}")
    if x.dtype not in MPI_TYPES and x.dtype not in HALF_TYPES:
        raise DTypeError(
            f"{what} of a {x.dtype.name} tensor: there is no MPI reduction for {x.dtype.name}; cast it first "
            "(x.float()) and back after"
        )
    if op == "sum" and x.dtype == dtypes.bool:
        raise DTypeError(f"{what}(sum) of a bool tensor; use op='max' (any) or op='min' (all), or cast to int")
    if op == "mean" and not dtypes.is_float(x.dtype):
        raise DTypeError(f"{what}(mean) of a {x.dtype.name} tensor; use op='sum' or cast to a float dtype first")


def _node(x: Tensor, step: Collective) -> Tensor:
    return Tensor(UOp(Ops.COLLECTIVE, x.dtype, (x.uop,), step))


def _shape(x: Tensor) -> tuple[int, ...]:
    shape = x.shape
    if not all(isinstance(s, int) for s in shape):
        raise ShapeError(f"a collective of a tensor of symbolic shape {shape}; bind the variables to sizes first")
    return tuple(int(s) for s in shape)


def all_reduce(x: Tensor, op: str = "sum") -> Tensor:
    """Every rank gets the elementwise `op` ("sum", "mean", "max", "min") of `x` over all ranks (lazy).

    Run under `mpirun -n N`: `all_reduce(Tensor([float(rank())]))` is `[0 + 1 + ... + N-1]` on every rank."""
    _checked(x, "all_reduce")
    _reduction_dtype(x, op, "all_reduce")
    world = world_size()
    out = _node(
        x, Collective("all_reduce", "max" if op == "max" else "min" if op == "min" else "sum", 0, world, _shape(x))
    )
    return out * (1.0 / world) if op == "mean" else out


def _coalesced(xs: list[Tensor], what: str) -> int:
    """The elements of `xs` together, once they are checked to share one device and one dtype."""
    if not xs:
        raise DistributedError(f"{what} of no tensors; pass at least one")
    devices = {_checked(x, what) for x in xs}
    dts = {x.dtype for x in xs}
    if len(devices) > 1 or len(dts) > 1:
        raise DistributedError(
            f"{what} of tensors on {sorted(devices)} with dtypes {sorted(d.name for d in dts)}: pass tensors of one "
            "device and one dtype (group them, one call per group)"
        )
    return sum(int(prod(_shape(x))) for x in xs)


def all_reduce_coalesced(xs: list[Tensor], op: str = "sum", after: Tensor | None = None) -> Tensor:
    """The `op` over all ranks of the tensors `xs` (one device, one dtype) laid end to end, as one flat tensor: one
    collective for all of them (lazy). Each is realized into a buffer of its own and copied once into a send buffer,
    which MPI reduces into the output (what DataParallel's buckets use). `after`: a tensor the step runs after (its
    value is not read; DataParallel orders its buckets with it)."""
    return _reduce_coalesced(xs, op, after, "", "all_reduce_coalesced")


def all_reduce_coalesced_start(xs: list[Tensor], op: str = "sum", after: Tensor | None = None) -> Tensor:
    """The first half of `all_reduce_coalesced` (lazy): the step that posts it. Its result is read through
    `collective_wait(started)`, whose step completes it; the steps the schedule runs between the two run while MPI
    reduces (a thread of the communicator drives MPI meanwhile). Read only what collective_wait gives: the started
    tensor's buffer is being written by MPI until the wait step ran."""
    if op == "mean":
        raise DistributedError(
            "all_reduce_coalesced_start(op='mean'): start a 'sum' and scale what collective_wait gives"
        )
    return _reduce_coalesced(xs, op, after, "start", "all_reduce_coalesced_start")


def collective_wait(started: Tensor) -> Tensor:
    """The result of the collective that `all_reduce_coalesced_start` started (lazy): its step waits for MPI to
    complete it (under the DIST_TIMEOUT watchdog) and copies the result into a buffer of its own."""
    u = started.uop
    if u.op is not Ops.COLLECTIVE or u.arg.phase != "start":
        raise DistributedError(
            "collective_wait of a tensor that all_reduce_coalesced_start did not return; pass the started tensor itself"
        )
    return Tensor(UOp(Ops.COLLECTIVE, u.dtype, (u,), replace(u.arg, phase="wait", after=0)))


def _reduce_coalesced(xs: list[Tensor], op: str, after: Tensor | None, phase: str, what: str) -> Tensor:
    total = _coalesced(xs, what)
    _reduction_dtype(xs[0], op, what)
    world = world_size()
    mpi_op = "max" if op == "max" else "min" if op == "min" else "sum"
    deps = () if after is None else (after.uop,)
    step = Collective("all_reduce", mpi_op, 0, world, (total,), phase=phase, after=len(deps))
    out = Tensor(UOp(Ops.COLLECTIVE, xs[0].dtype, (*deps, *(x.uop for x in xs)), step))
    return out * (1.0 / world) if op == "mean" else out


def broadcast_coalesced(xs: list[Tensor], root: int = 0) -> Tensor:
    """Rank `root`'s tensors `xs` (one device, one dtype) laid end to end, as one flat tensor on every rank: one
    collective for all of them (lazy; what DataParallel broadcasts the model's state with)."""
    total = _coalesced(xs, "broadcast_coalesced")
    world = world_size()
    if not 0 <= root < world:
        raise DistributedError(f"broadcast_coalesced from rank {root}, but the ranks are 0..{world - 1}")
    step = Collective("broadcast", "", root, world, (total,))
    return Tensor(UOp(Ops.COLLECTIVE, xs[0].dtype, tuple(x.uop for x in xs), step))


def broadcast(x: Tensor, root: int = 0) -> Tensor:
    """Rank `root`'s `x` on every rank (lazy; every rank passes a tensor of the same shape and dtype)."""
    _checked(x, "broadcast")
    world = world_size()
    if not 0 <= root < world:
        raise DistributedError(f"broadcast from rank {root}, but the ranks are 0..{world - 1}")
    return _node(x, Collective("broadcast", "", root, world, _shape(x)))


def all_gather(x: Tensor) -> Tensor:
    """Every rank's `x` (of one shape on all ranks) concatenated along axis 0 in rank order, on every rank (lazy)."""
    _checked(x, "all_gather")
    shape = _shape(x)
    if not shape:
        x, shape = x.reshape(1), (1,)
    world = world_size()
    return _node(x, Collective("all_gather", "", 0, world, (shape[0] * world, *shape[1:])))


def split_rows(n: int, world: int) -> list[tuple[int, int]]:
    """The (start, end) rows of each rank when `n` rows are split over `world` ranks: the first n % world get one
    more (numpy's array_split)."""
    base, extra = divmod(n, world)
    out, start = [], 0
    for r in range(world):
        end = start + base + (1 if r < extra else 0)
        out.append((start, end))
        start = end
    return out


def reduce_scatter(x: Tensor, op: str = "sum") -> Tensor:
    """The `op` of `x` over all ranks, split along axis 0: this rank gets rows `split_rows(len(x), world)[rank]`
    (lazy). The number of rows need not be divisible by the world size."""
    _checked(x, "reduce_scatter")
    _reduction_dtype(x, op, "reduce_scatter")
    shape = _shape(x)
    if not shape:
        raise ShapeError("reduce_scatter of a 0-d tensor: it splits axis 0; reshape it to (1,) or use all_reduce")
    world = world_size()
    rows = split_rows(shape[0], world)
    row = int(prod(shape[1:]))
    counts = tuple((e - s) * row for s, e in rows)
    me = rows[rank()]
    mpi_op = "max" if op == "max" else "min" if op == "min" else "sum"
    out = _node(x, Collective("reduce_scatter", mpi_op, 0, world, (me[1] - me[0], *shape[1:]), counts))
    return out * (1.0 / world) if op == "mean" else out


def barrier() -> None:
    """Wait until every rank has called barrier (under the DIST_TIMEOUT watchdog). Runs now: nothing to realize."""
    comm = communicator()
    comm.wait(comm.comm.Ibarrier(), "barrier")


__all__ = [
    "Collective",
    "MPI_TYPES",
    "all_gather",
    "all_reduce",
    "all_reduce_coalesced",
    "all_reduce_coalesced_start",
    "barrier",
    "broadcast",
    "broadcast_coalesced",
    "collective_wait",
    "reduce_scatter",
    "split_rows",
]
