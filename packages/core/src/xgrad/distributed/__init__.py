"""Training across processes and hosts on MPI: `mpirun -n 4 python train.py`.

Why in core, with mpi4py optional: a collective is a step of core's schedule (the COLLECTIVE op, run by the realize
engine and captured by TinyJit like a COPY), and data-parallel training wraps core's optimizers and TinyJit, so the
code lives beside them; core's dependencies stay numpy and pluggy because mpi4py is imported only when a collective
first runs (`xgrad.distributed.comm`), never by `import xgrad` or `import xgrad.distributed`. Install it with
`pip install mpi4py` next to an MPI library (CI: Open MPI 4.1 from Debian, mpi4py 4.1.2 from PyPI).

- `launch`: `rank()`, `world_size()`, `local_rank()` from the launcher's environment.
- `collectives`: `all_reduce`, `broadcast`, `all_gather`, `reduce_scatter` (lazy Tensors), `barrier()`, and an
  all_reduce split in a start and a wait step (`all_reduce_coalesced_start`, `collective_wait`).
- `comm`: the communicator and the watchdog (DIST_TIMEOUT) that turns a dead rank into a `RankFailedError`.
- `data_parallel`: `DataParallel` (gradients averaged in buckets), `DistributedSampler`, checkpoints.
"""

from __future__ import annotations

from xgrad.distributed.collectives import (
    all_gather,
    all_reduce,
    all_reduce_coalesced,
    all_reduce_coalesced_start,
    barrier,
    broadcast,
    broadcast_coalesced,
    collective_wait,
    reduce_scatter,
    split_rows,
)
from xgrad.distributed.comm import MPIMissingError, RankFailedError
from xgrad.distributed.data_parallel import DataParallel, DistributedSampler, load_checkpoint, save_checkpoint
from xgrad.distributed.launch import DistributedError, NotLaunchedError, is_launched, local_rank, rank, world_size

__all__ = [
    "DataParallel",
    "DistributedError",
    "DistributedSampler",
    "MPIMissingError",
    "NotLaunchedError",
    "RankFailedError",
    "all_gather",
    "all_reduce",
    "all_reduce_coalesced",
    "all_reduce_coalesced_start",
    "barrier",
    "broadcast",
    "broadcast_coalesced",
    "collective_wait",
    "is_launched",
    "load_checkpoint",
    "local_rank",
    "rank",
    "reduce_scatter",
    "save_checkpoint",
    "split_rows",
    "world_size",
]
