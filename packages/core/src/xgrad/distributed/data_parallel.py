"""Data-parallel training: every rank holds the whole model, trains on its own part of each batch, and averages the
gradients with the others before the optimizer step.

In: a model (any object whose tensors `xgrad.nn.state.get_state_dict` finds) and, after each `backward()`, its
parameters' `.grad`. Out: the same model, its parameters equal on every rank; `.grad` replaced by the average over
the ranks, lazily, so the optimizer's step realizes the collectives with its own kernels (and a TinyJit around the
step captures them).

Buckets: the gradients are grouped per device and dtype in buckets of about DIST_BUCKET_MB, each gradient computed
(scaled by 1/world) into a buffer of its own, and each bucket summed by one collective (`all_reduce_coalesced`: the
gradients copied end to end into a send buffer, reduced into its output); the parameters' grads become views of it.
Fewer, larger messages than one collective per parameter.

Overlap with the backward: xgrad is lazy, so `backward()` computes nothing; the gradients are computed when the step
is realized, in one schedule that the engine runs in order on one thread. What can overlap is a bucket's collective
with the kernels of the gradients that follow it in that schedule. So the buckets are cut in reverse parameter order
(the last layers' gradients come first in a backward), and every bucket but the last is split in two steps: a start
(`all_reduce_coalesced_start`), which posts the MPI call and returns, and a wait (`collective_wait`), which completes
it and copies the result into the gradients' buffer (one memcpy of the bucket). Each start is made to come after the
previous bucket's start (`after=`), and the schedule is a depth-first order of the graph, so it runs: bucket 0's
gradients, its start, bucket 1's gradients (while MPI reduces bucket 0), its start, ..., the last bucket (whole), then
the optimizer's kernels, each bucket's wait just before the first kernel that reads it. A thread of the communicator
drives MPI while the kernels run (Open MPI moves a collective only inside MPI calls). The last bucket has nothing
left to overlap with and stays one step; with a single bucket (a model under DIST_BUCKET_MB) nothing changes.
`DataParallel(overlap=False)` keeps every bucket one step, in parameter order.

Checkpoints: `save_checkpoint` writes safetensors on rank 0 only; `load_checkpoint` reads them on rank 0 and
broadcasts every tensor, so the other ranks need no access to the file.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from xgrad.distributed.collectives import (
    all_reduce_coalesced,
    all_reduce_coalesced_start,
    barrier,
    broadcast_coalesced,
    collective_wait,
)
from xgrad.distributed.launch import DistributedError, rank, world_size
from xgrad.helpers import DIST_BUCKET_MB, dedup
from xgrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save
from xgrad.tensor import Tensor


def buckets(tensors: list[Tensor], bucket_bytes: int) -> list[list[Tensor]]:
    """`tensors` grouped per (device, dtype) in their order, each group cut into runs of about `bucket_bytes` (a
    tensor larger than that is a bucket of its own)."""
    groups: dict[tuple[Any, Any], list[list[Tensor]]] = {}
    sizes: dict[tuple[Any, Any], int] = {}
    for t in tensors:
        key = (t.device, t.dtype)
        nbytes = t.numel() * t.dtype.itemsize
        runs = groups.setdefault(key, [[]])
        if runs[-1] and sizes[key] + nbytes > bucket_bytes:
            runs.append([])
            sizes[key] = 0
        runs[-1].append(t)
        sizes[key] = sizes.get(key, 0) + nbytes
    return [run for runs in groups.values() for run in runs if run]


def _pieces(flat: Tensor, ts: list[Tensor]) -> Iterator[tuple[Tensor, Tensor]]:
    """Each tensor of `ts` with its part of `flat` (the tensors laid end to end), in its shape."""
    start = 0
    for t in ts:
        n = t.numel()
        yield t, flat.shrink(((start, start + n),)).reshape(t.shape)
        start += n


def broadcast_state(obj: Any, root: int = 0, bucket_mb: float | None = None) -> None:
    """Every tensor of `obj` (parameters, buffers, optimizer state) takes rank `root`'s values, one broadcast per
    bucket; realized on return."""
    tensors = dedup(get_state_dict(obj).values())
    if not tensors:
        return
    Tensor.realize(*tensors)
    size = int((DIST_BUCKET_MB.value if bucket_mb is None else bucket_mb) * 2**20)
    assigned: list[Tensor] = []
    for bucket in buckets(tensors, size):
        got = broadcast_coalesced(bucket, root)
        assigned.extend(t.assign(piece) for t, piece in _pieces(got, bucket))
    Tensor.realize(*assigned)


class DataParallel:
    """Wrap `model` for data-parallel training across the ranks of an MPI job.

    At construction every tensor of the model takes rank `root`'s values (`broadcast_state`). Call the wrapper as the
    model; after `loss.backward()` call `average_gradients()` (or `backward(loss)`, which does both), then step any
    `xgrad.nn.optim` optimizer as usual. Each rank feeds its own part of the batch (see `DistributedSampler`); with
    the loss a mean over the local batch and equal local batch sizes, the update equals one process's on the whole
    batch. With `overlap` (the default) each bucket but the last reduces while the next buckets' gradients are
    computed (see the module's notes); `overlap=False` reduces every bucket after the whole backward.

    >>> # under `mpirun -n 2`:
    >>> # dp = DataParallel(model); opt = Adam(get_parameters(model))
    >>> # opt.zero_grad(); dp.backward(loss_fn(dp(x), y)); opt.step()
    """

    def __init__(
        self,
        model: Any,
        bucket_mb: float | None = None,
        root: int = 0,
        broadcast_params: bool = True,
        overlap: bool = True,
    ):
        self.model = model
        self.overlap = overlap
        self.world = world_size()
        self.bucket_bytes = int((DIST_BUCKET_MB.value if bucket_mb is None else bucket_mb) * 2**20)
        if self.bucket_bytes <= 0:
            raise DistributedError(f"DataParallel bucket_mb={bucket_mb}: give a positive size in MB (default 25)")
        self.params = dedup(get_parameters(model))
        if broadcast_params:
            broadcast_state(model, root, self.bucket_bytes / 2**20)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def backward(self, loss: Tensor) -> Tensor:
        """`loss.backward()`, then `average_gradients()`; returns `loss`."""
        loss.backward()
        self.average_gradients()
        return loss

    def average_gradients(self) -> None:
        """Replace each parameter's `.grad` by its mean over the ranks (lazy: one all_reduce per bucket, each but the
        last started before the gradients of the next are computed: see the module's notes). Every rank must have
        gradients for the same parameters."""
        grads = [p for p in self.params if p.grad is not None]
        if not grads:
            raise DistributedError(
                "DataParallel.average_gradients() found no gradients; call it after loss.backward(), before the "
                "optimizer step"
            )
        cut = buckets(grads[::-1] if self.overlap else grads, self.bucket_bytes)
        started: Tensor | None = None  # the previous bucket's start: the next one runs after it
        for i, bucket in enumerate(cut):
            # 1/world in the kernel that computes each gradient: exact for a power-of-two world, the sum is the mean
            scaled = [p.grad * (1.0 / self.world) for p in bucket if p.grad is not None]
            # ordered after the previous start when both are one device's (buckets are cut per device and dtype)
            same_group = started is not None and (started.device, started.dtype) == (scaled[0].device, scaled[0].dtype)
            after = started if same_group else None
            if self.overlap and i < len(cut) - 1:
                started = all_reduce_coalesced_start(scaled, "sum", after=after)
                summed = collective_wait(started)
            else:
                summed = all_reduce_coalesced(scaled, "sum", after=after)
            for p, piece in _pieces(summed, bucket):
                p.grad = piece


class DistributedSampler:
    """Indices of a data set of `n` samples for this rank: a permutation (seeded by `seed` and the epoch, the same on
    every rank) padded by repeating its start to a multiple of the world size, and every world-th index from this
    rank's on. `drop_last=True` drops the tail instead of padding. `set_epoch(e)` reshuffles."""

    def __init__(
        self,
        n: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank_: int | None = None,
        world: int | None = None,
    ):
        self.n, self.shuffle, self.seed, self.drop_last = n, shuffle, seed, drop_last
        self.rank = rank() if rank_ is None else rank_
        self.world = world_size() if world is None else world
        if not 0 <= self.rank < self.world:
            raise DistributedError(f"DistributedSampler: rank {self.rank} is not in 0..{self.world - 1}")
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle for `epoch` (call at the start of each epoch, the same on every rank)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // self.world if self.drop_last else -(-self.n // self.world)

    def indices(self) -> np.ndarray:
        """This rank's sample indices for the current epoch."""
        order = (
            np.random.default_rng((self.seed, self.epoch)).permutation(self.n) if self.shuffle else np.arange(self.n)
        )
        total = len(self) * self.world
        if total > self.n:  # pad with the start of the order (wrapping round if needed)
            order = np.concatenate([order, np.resize(order, total - self.n)])
        return order[:total][self.rank :: self.world]

    def __iter__(self) -> Iterator[int]:
        return iter(int(i) for i in self.indices())


def save_checkpoint(obj: Any, path: str | pathlib.Path, root: int = 0) -> None:
    """Rank `root` writes every tensor of `obj` (a model, or e.g. `{"model": model, "opt": opt}`) to `path` as
    safetensors; the other ranks wait until it is written."""
    state = get_state_dict(obj)
    if rank() == root:
        safe_save(state, str(path))
    barrier()


def load_checkpoint(obj: Any, path: str | pathlib.Path, root: int = 0) -> None:
    """Resume every rank from the checkpoint `save_checkpoint` wrote: rank `root` reads `path` into `obj`, then every
    tensor of `obj` is broadcast from it (the other ranks need not see the file)."""
    if rank() == root:
        load_state_dict(obj, safe_load(str(path)), verbose=False)
    broadcast_state(obj, root)


__all__ = ["DataParallel", "DistributedSampler", "broadcast_state", "buckets", "load_checkpoint", "save_checkpoint"]
