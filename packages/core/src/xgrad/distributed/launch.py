"""Who this process is among the processes a launcher started: rank, world size and rank on this host.

In: the environment the MPI launcher gives each process (`mpirun -n 4 python train.py`). Out: `rank()`,
`world_size()`, `local_rank()`; a `NotLaunchedError` naming the fix when no launcher set them. Nothing here imports
mpi4py or starts MPI: reading who we are costs nothing, and the communicator (`xgrad.distributed.comm`) checks on
first use that MPI agrees.

These variables are the launchers' own, not xgrad knobs (those are declared in `xgrad.helpers`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from xgrad.errors import XgradError


class DistributedError(XgradError, RuntimeError):
    """A failure of training across processes (the base of the errors of `xgrad.distributed`)."""


class NotLaunchedError(DistributedError):
    """A distributed call in a process that no MPI launcher started."""


@dataclass(frozen=True)
class LauncherVars:
    """The environment variables one launcher sets: the rank, the number of processes, the rank on this host and the
    number of processes on this host."""

    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str


# first match wins: Open MPI's mpirun, MPICH's (and Intel MPI's) Hydra mpiexec, a PMIx launcher, Slurm's srun
LAUNCHERS = (
    LauncherVars(
        "Open MPI",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    LauncherVars("MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    LauncherVars("PMIx", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),
    LauncherVars("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)


def launcher() -> LauncherVars | None:
    """The launcher that started this process (by the variables it set), None when none did."""
    for vars_ in LAUNCHERS:
        if vars_.rank in os.environ and vars_.size in os.environ:
            return vars_
    return None


def is_launched() -> bool:
    """Whether an MPI launcher started this process."""
    return launcher() is not None


def _read(what: str, pick: str) -> int:
    found = launcher()
    if found is None:
        raise NotLaunchedError(
            f"{what}() needs a process started by an MPI launcher, and none set this one's rank "
            f"({', '.join(v.rank for v in LAUNCHERS)} are unset); run the program under one: "
            "`mpirun -n N python script.py` (Open MPI; as root add --allow-run-as-root) or `mpiexec -n N python "
            "script.py` (MPICH)"
        )
    name = getattr(found, pick)
    raw = os.environ.get(name)
    if raw is None and pick == "local_rank":  # a launcher that does not say: one process per host
        return 0
    try:
        return int(raw or "")
    except ValueError:
        raise NotLaunchedError(
            f"{found.name} launcher variable {name}={raw!r} is not an integer; start the program with the launcher "
            "itself (`mpirun -n N python script.py`) instead of setting it by hand"
        ) from None


def local_size() -> int | None:
    """How many processes of the job run on this host, None when the launcher does not say (or none started this
    process)."""
    found = launcher()
    raw = os.environ.get(found.local_size, "") if found is not None else ""
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def shares_cores() -> bool:
    """Whether this host runs more of the job's processes than it has cores (or the launcher does not say how many
    run here): then a rank waiting in a collective must yield its core to the rank it waits for."""
    here = local_size()
    return here is None or here > (os.cpu_count() or 1)


def rank() -> int:
    """This process's rank: 0 .. world_size() - 1."""
    return _read("rank", "rank")


def world_size() -> int:
    """How many processes the launcher started."""
    return _read("world_size", "size")


def local_rank() -> int:
    """This process's rank among the processes on its host (to pick a device per process)."""
    return _read("local_rank", "local_rank")


__all__ = [
    "DistributedError",
    "LAUNCHERS",
    "LauncherVars",
    "NotLaunchedError",
    "is_launched",
    "launcher",
    "local_rank",
    "local_size",
    "rank",
    "shares_cores",
    "world_size",
]
