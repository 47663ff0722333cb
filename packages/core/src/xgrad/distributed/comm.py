"""The MPI communicator and the watchdog every collective waits under.

In: MPI requests of nonblocking collectives (`Iallreduce`, `Ibcast`, ...). Out: the request completed, or, when it
has not within DIST_TIMEOUT seconds, a `RankFailedError` that names the ranks that are gone.

Why a watchdog: when a rank dies, MPI itself either aborts the whole job (Open MPI's mpirun by default, on a non-zero
exit) or leaves the others waiting forever in the collective (shared memory and TCP notice nothing). So no collective
here blocks inside MPI: each is started nonblocking and polled with `Test()` (which also drives MPI's progress) until
it completes or its deadline passes. Then this rank asks every other rank whether it is alive: a PING answered by a
PONG, on COMM_WORLD (`ctl`) with tags of their own, while the collectives run on a duplicate of it (`comm`). Every
rank answers PINGs while it waits in a collective (after the first second, see PATIENCE), so the ranks that do not
answer within GRACE seconds are the ones that exited or hang outside xgrad's collectives, and the error names them.
The communicator is then broken: every later collective raises the same error at once.

Not covered: a rank that dies before MPI starts in it (before the first collective imports mpi4py) leaves the others
inside MPI_Init, which cannot be watched; Open MPI's mpirun then ends the job itself (its default) or waits.

mpi4py is imported here, on first use (importing it starts MPI): `import xgrad` and `xgrad.distributed.launch` do
not need it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xgrad.distributed.launch import DistributedError, NotLaunchedError, launcher, rank, shares_cores, world_size
from xgrad.helpers import DIST_TIMEOUT

# a wait polls busily for its first SPIN seconds, then (a rank that is late, e.g. writing a checkpoint) sleeps
# POLL_SLEEP between polls. The busy polls yield the core every YIELD_EVERY polls, so that the rank waited for can
# run, after YIELD_AFTER seconds, or from the start where the job's ranks on this host outnumber its cores
# (`shares_cores`). Why not always (Open MPI's blocking calls yield only when oversubscribed): a yield per 16 polls
# cost a 1 MB all_reduce ~90 sched_yield calls, 0.32 vs 0.24 ms, with a core per rank. Why not never: on a host
# loaded by other processes, a rank spinning without yielding delays the rank it waits for (a DataParallel step of
# 16 MB of gradients on 2 ranks at load 12 on 2 cores: 200-800 ms spinning, 150 ms yielding).
SPIN = 0.25
YIELD_EVERY = 16
YIELD_AFTER = 0.0005
POLL_SLEEP = 0.00005
PATIENCE = 1.0  # seconds of waiting after which a wait also answers PINGs
GRACE = 3.0  # seconds a rank that timed out waits for the others' PONGs
PING, PONG = 7861, 7862  # tags on `ctl`


class RankFailedError(DistributedError):
    """A collective did not complete within DIST_TIMEOUT; `ranks` are the ranks that did not answer (exited or hung)."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()):
        super().__init__(message)
        self.ranks = ranks


class MPIMissingError(DistributedError, ImportError):
    """mpi4py (the optional dependency of `xgrad.distributed`) is not installed."""


# Open MPI runs nonblocking allreduces in its libnbc component, which picks a binomial tree (a reduce to one rank,
# then a broadcast) below 4 ranks, whatever the size. Its ring (a reduce-scatter, then an all-gather: each rank
# reduces 1/world of the data) measured 1.2-1.9x faster from 64 KB to 64 MB on 2 ranks (1 MB 0.12 vs 0.23 ms, 64 MB
# 54 vs 64 ms) and 2x at 1-16 MB on 4; it costs latency for small messages among more ranks (2*(world-1) steps
# against 2*log2(world): 0.064 vs 0.050 ms at 64 KB on 4 ranks). So xgrad asks for it, unless the user chose (set
# the variable to 0 for Open MPI's own choice). MPI reads it when it starts: a program that imports mpi4py before
# xgrad's first collective sets it itself.
LIBNBC_IALLREDUCE = ("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1")


def mpi() -> Any:
    """The `mpi4py.MPI` module (importing it initialises MPI, under Open MPI with LIBNBC_IALLREDUCE's ring)."""
    if "mpi4py.MPI" not in sys.modules:
        os.environ.setdefault(*LIBNBC_IALLREDUCE)
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise MPIMissingError(
            f"xgrad.distributed runs collectives through MPI and needs mpi4py ({e}); install it with "
            "`pip install mpi4py` next to an MPI library (Debian: apt install openmpi-bin libopenmpi-dev)"
        ) from None
    return MPI


def _exit_without_finalize() -> None:
    """At the exit of a process whose job lost a rank: flush and end with status 1, skipping the MPI_Finalize that
    mpi4py would run after Python's exit handlers (with a rank gone it can block forever, the hang the watchdog is
    there to prevent)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(1)


@dataclass(eq=False)  # compared by identity: two entries are never the same collective
class InFlight:
    """A collective started by one step of the schedule and completed by a later one: its request, and what to run
    once it completed (hand back its send buffer)."""

    request: Any
    what: str
    on_done: Callable[[], None]
    done: bool = False
    error: Exception | None = None


class Communicator:
    """The processes of the job: `comm` (a duplicate of COMM_WORLD) carries the collectives, `ctl` (COMM_WORLD)
    the watchdog's PING/PONG."""

    def __init__(self) -> None:
        if launcher() is None:
            rank()  # raises NotLaunchedError with the fix
        MPI = mpi()  # noqa: N806  (the module's own name)
        self.MPI = MPI
        world = MPI.COMM_WORLD
        self.rank: int = world.Get_rank()
        self.size: int = world.Get_size()
        if (self.rank, self.size) != (rank(), world_size()):
            raise NotLaunchedError(
                f"MPI says rank {self.rank} of {self.size}, the launcher's environment rank {rank()} of "
                f"{world_size()}: "
                "the program was started by another MPI's launcher than the one mpi4py was built for; launch it with "
                "that MPI's mpirun (python -c 'import mpi4py; print(mpi4py.get_config())' names it)"
            )
        self.ctl = world  # the watchdog's PING/PONG (tags of its own); the collectives go on a duplicate
        self.ctl.Set_errhandler(MPI.ERRORS_RETURN)  # an MPI error raises in Python instead of aborting the job
        self.failed: RankFailedError | None = None
        self._pongs: list[Any] = []  # PONG sends in flight
        self._token = bytearray(1)
        self.yields = shares_cores()
        # started collectives by the memory they write; the progress thread polls those no wait has taken yet
        self.in_flight: dict[tuple[int, int], InFlight] = {}
        self._polled: list[InFlight] = []
        self._lock = threading.Condition()
        self._progress: threading.Thread | None = None
        # the thread may call MPI only if MPI was started for threads (mpi4py's default; a program can lower it)
        self.threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        # duplicating is itself a collective: nonblocking too, so a rank that died before it is named as well
        self.comm, request = world.Idup()
        self.wait(request, "the first collective (making xgrad's communicator)")
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)

    # ---- waiting with a deadline ----
    def wait(self, request: Any, what: str) -> None:
        """Poll `request` until it completes; after DIST_TIMEOUT seconds raise a RankFailedError naming the ranks
        that do not answer."""
        if self.failed is not None:
            raise self.failed
        test = request.Test
        try:
            if test():  # the common case of a small message: done at once, no clock read
                return
        except self.MPI.Exception as e:
            self._fail(f"rank {self.rank}: {what} failed in MPI ({e})", self._silent_ranks())
        timeout = float(DIST_TIMEOUT.value)
        start = time.perf_counter()
        polls = 0
        while True:
            try:
                if test():
                    return
            except self.MPI.Exception as e:
                self._fail(f"rank {self.rank}: {what} failed in MPI ({e})", self._silent_ranks())
            polls += 1
            if polls % YIELD_EVERY:
                continue
            waited = time.perf_counter() - start
            if waited > timeout:
                silent = self._silent_ranks()
                if silent:
                    names = ", ".join(map(str, silent))
                    gone = f"rank{'s' if len(silent) > 1 else ''} {names} did not answer: exited or hung"
                else:
                    gone = (
                        "every rank answered, so all are alive but not all in this collective (a rank skipped it or "
                        "runs another one), or it is slower than the timeout"
                    )
                self._fail(
                    f"rank {self.rank}: {what} did not complete within {timeout:g} s; {gone}. The job cannot go on: "
                    "restart it from the last checkpoint (raise DIST_TIMEOUT if ranks legitimately wait longer)",
                    silent,
                )
            if waited > PATIENCE:  # a long wait: let the others' watchdogs know this rank is alive
                self.answer_pings()
            if waited > SPIN:
                time.sleep(POLL_SLEEP)
            elif self.yields or waited > YIELD_AFTER:
                os.sched_yield()

    # ---- collectives that run while the schedule goes on ----
    def start(self, key: tuple[int, int], request: Any, what: str, on_done: Callable[[], None]) -> None:
        """Hand a posted request to the progress thread, which drives MPI (Test() every POLL_SLEEP) while the steps
        after it run, until `finish(key)`. Why a thread: Open MPI moves a nonblocking collective only inside MPI calls
        of the process (no progress of its own over shared memory or TCP), and the engine runs kernels in between."""
        if self.failed is not None:
            raise self.failed
        if (old := self.in_flight.pop(key, None)) is not None:  # its wait never ran (its tensor was dropped unread)
            self.finish_abandoned(old)
        entry = InFlight(request, what, on_done)
        self.in_flight[key] = entry
        if not self.threaded:  # then MPI moves it only when its wait polls it
            return
        with self._lock:
            self._polled.append(entry)
            if self._progress is None:
                self._progress = threading.Thread(target=self._drive, name="xgrad-mpi-progress", daemon=True)
                self._progress.start()
            self._lock.notify()

    def finish(self, key: tuple[int, int], what: str) -> None:
        """Wait (under the watchdog) for the collective started into `key`'s memory."""
        entry = self.in_flight.pop(key, None)
        if entry is None:
            raise DistributedError(
                f"{what}: no collective was started into its source; its start step must run first (build it with "
                "collective_wait(all_reduce_coalesced_start(...)))"
            )
        with self._lock:  # from here this thread polls it: MPI forbids testing one request from two threads at once
            if entry in self._polled:
                self._polled.remove(entry)
        try:
            if entry.error is not None:
                self._fail(f"rank {self.rank}: {what} failed in MPI ({entry.error})", self._silent_ranks())
            if not entry.done:
                self.wait(entry.request, what)
        finally:
            entry.on_done()

    def finish_abandoned(self, entry: InFlight) -> None:
        """Complete a started collective whose wait step never ran (under the watchdog: the other ranks posted it
        too), and release what it holds."""
        with self._lock:
            if entry in self._polled:
                self._polled.remove(entry)
        try:
            if not entry.done and entry.error is None:
                self.wait(entry.request, entry.what)
        finally:
            entry.on_done()

    def _drive(self) -> None:
        """The progress thread: Test() every started request that no wait has taken, until it completes."""
        while True:
            with self._lock:
                while not self._polled:
                    self._lock.wait()
                for entry in list(self._polled):
                    try:
                        entry.done = bool(entry.request.Test())
                    except self.MPI.Exception as e:
                        entry.error = e
                    if entry.done or entry.error is not None:
                        self._polled.remove(entry)
            time.sleep(POLL_SLEEP)

    def _fail(self, message: str, silent: tuple[int, ...]) -> None:
        if self.failed is None:  # MPI_Finalize at exit can wait forever for the dead rank: leave without it
            atexit.register(_exit_without_finalize)
        self.failed = RankFailedError(message, silent)
        raise self.failed

    def answer_pings(self) -> None:
        """Answer every PING that arrived (the watchdog of a rank that timed out asks who is alive)."""
        MPI = self.MPI  # noqa: N806
        status = MPI.Status()
        while self.ctl.Iprobe(source=MPI.ANY_SOURCE, tag=PING, status=status):
            src = status.Get_source()
            self.ctl.Recv([self._token, MPI.BYTE], source=src, tag=PING)
            self._pongs.append(self.ctl.Isend([self._token, MPI.BYTE], dest=src, tag=PONG))
        self._pongs = [r for r in self._pongs if not r.Test()]

    def _silent_ranks(self) -> tuple[int, ...]:
        """The ranks that do not answer a PING within GRACE seconds."""
        MPI = self.MPI  # noqa: N806
        peers = [p for p in range(self.size) if p != self.rank]
        sends, recvs = [], {}
        for p in peers:
            try:
                sends.append(self.ctl.Isend([bytearray(1), MPI.BYTE], dest=p, tag=PING))
                recvs[p] = self.ctl.Irecv([bytearray(1), MPI.BYTE], source=p, tag=PONG)
            except MPI.Exception:
                continue  # MPI knows the peer is gone: it stays silent
        end = time.perf_counter() + GRACE
        answered: set[int] = set()
        while len(answered) < len(recvs) and time.perf_counter() < end:
            self.answer_pings()
            for p, r in recvs.items():
                try:
                    if p not in answered and r.Test():
                        answered.add(p)
                except MPI.Exception:
                    pass
            time.sleep(0.001)
        for p, r in recvs.items():
            if p not in answered:
                try:
                    r.Cancel()
                except MPI.Exception:
                    pass
        return tuple(p for p in peers if p not in answered)


_world: list[Communicator] = []


def communicator() -> Communicator:
    """The job's communicator, made (and MPI started) on first use."""
    if not _world:
        _world.append(Communicator())
    return _world[0]


__all__ = ["Communicator", "MPIMissingError", "RankFailedError", "communicator", "mpi"]
