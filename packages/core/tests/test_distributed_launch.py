"""xgrad.distributed without a launcher: rank/world from each launcher's environment, the error outside one, the lazy
import of mpi4py, and the COLLECTIVE step in the schedule (no MPI call is made here: see test_distributed.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from xgrad import Tensor, dtypes
from xgrad.distributed import (
    NotLaunchedError,
    all_gather,
    all_reduce,
    all_reduce_coalesced,
    broadcast,
    local_rank,
    rank,
    reduce_scatter,
    split_rows,
    world_size,
)
from xgrad.distributed.data_parallel import DistributedSampler, buckets
from xgrad.distributed.launch import LAUNCHERS, is_launched, local_size, shares_cores
from xgrad.uop.ops import Ops

LAUNCH_VARS = [name for v in LAUNCHERS for name in (v.rank, v.size, v.local_rank, v.local_size)]


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("fn", [rank, world_size, local_rank])
def test_rank_outside_a_launcher_raises_naming_mpirun(no_launcher: pytest.MonkeyPatch, fn: object) -> None:
    assert not is_launched()
    with pytest.raises(NotLaunchedError, match=r"mpirun -n N python script.py"):
        fn()  # type: ignore[operator]


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=lambda v: v.name)
def test_rank_world_and_local_rank_come_from_each_launchers_variables(
    no_launcher: pytest.MonkeyPatch, launcher: object
) -> None:
    vars_ = launcher
    no_launcher.setenv(vars_.rank, "3")  # type: ignore[attr-defined]
    no_launcher.setenv(vars_.size, "8")  # type: ignore[attr-defined]
    no_launcher.setenv(vars_.local_rank, "1")  # type: ignore[attr-defined]
    assert (rank(), world_size(), local_rank()) == (3, 8, 1)


def test_garbled_launcher_variable_raises(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("OMPI_COMM_WORLD_RANK", "zero")
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(NotLaunchedError, match="OMPI_COMM_WORLD_RANK='zero' is not an integer"):
        rank()


def test_import_xgrad_distributed_does_not_import_mpi4py() -> None:
    code = "import sys, xgrad, xgrad.distributed; from xgrad import Tensor; print('mpi4py' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_collective_is_one_schedule_item_reading_the_input_buffer(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("OMPI_COMM_WORLD_RANK", "0")
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "2")
    x = Tensor(np.arange(6, dtype=np.float32)).realize()
    y = (all_reduce(x, "sum") + 1).schedule_linear()
    kinds = [it.ast.op for it in y.src]
    assert kinds == [Ops.COLLECTIVE, Ops.SINK], kinds  # the collective, then the kernel adding 1
    step = y.src[0]
    assert step.bufs[1] is x.uop.base.__dict__["buffer"]  # MPI reads the tensor's own buffer: no copy before it
    assert step.ast.arg.name == "all_reduce(sum)" and not step.is_kernel and step.bufs[0].size == 6


def test_collective_of_a_lazy_view_realizes_it_first(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("OMPI_COMM_WORLD_RANK", "1")
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "4")
    x = Tensor(np.ones((3, 4), np.float32)).realize()
    items = broadcast(x.T * 2, root=2).schedule_linear().src
    assert [it.ast.op for it in items] == [Ops.SINK, Ops.COLLECTIVE]
    assert items[1].bufs[1] is items[0].bufs[0]


def test_coalesced_all_reduce_is_one_item_reading_every_source_buffer(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("OMPI_COMM_WORLD_RANK", "0")
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "2")
    a, b = Tensor(np.ones((2, 3), np.float32)).realize(), Tensor(np.ones(5, np.float32)).realize()
    items = all_reduce_coalesced([a, b * 2]).schedule_linear().src
    assert [it.ast.op for it in items] == [Ops.SINK, Ops.COLLECTIVE]  # b * 2 computed first, into its own buffer
    step = items[1]
    assert step.bufs[1] is a.uop.base.__dict__["buffer"] and step.bufs[2] is items[0].bufs[0]
    assert step.bufs[0].size == 11


def test_output_shapes_of_gather_and_uneven_reduce_scatter(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("OMPI_COMM_WORLD_RANK", "1")
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "3")
    x = Tensor(np.zeros((7, 2), np.float32))
    assert all_gather(x).shape == (21, 2)
    assert reduce_scatter(x).shape == (2, 2)  # rows 3..5 of 7 on rank 1 of 3 (7 = 3 + 2 + 2)
    assert split_rows(7, 3) == [(0, 3), (3, 5), (5, 7)] and split_rows(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_bad_collective_arguments_raise(no_launcher: pytest.MonkeyPatch) -> None:
    from xgrad.distributed import DistributedError
    from xgrad.errors import DTypeError

    no_launcher.setenv("OMPI_COMM_WORLD_RANK", "0")
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(DistributedError, match="op='prod'"):
        all_reduce(Tensor([1.0]), "prod")
    with pytest.raises(DTypeError, match="use op='sum'"):
        all_reduce(Tensor([1, 2]), "mean")
    with pytest.raises(DTypeError, match="cast it first"):
        all_reduce(Tensor([1.0]).cast(dtypes.fp8e4m3))
    with pytest.raises(DistributedError, match="ranks are 0..1"):
        broadcast(Tensor([1.0]), root=2)


def test_sampler_splits_every_index_once_across_ranks() -> None:
    for n, world in [(10, 3), (9, 3), (5, 4)]:
        parts = [DistributedSampler(n, seed=1, rank_=r, world=world).indices() for r in range(world)]
        assert len({len(p) for p in parts}) == 1  # equal shares: every rank runs the same number of steps
        assert set(np.concatenate(parts).tolist()) == set(range(n))
        dropped = [DistributedSampler(n, seed=1, drop_last=True, rank_=r, world=world).indices() for r in range(world)]
        flat = np.concatenate(dropped)
        assert len(flat) == n // world * world and len(set(flat.tolist())) == len(flat)
    a, b = DistributedSampler(10, rank_=0, world=2), DistributedSampler(10, rank_=0, world=2)
    b.set_epoch(1)
    assert a.indices().tolist() != b.indices().tolist()


def test_buckets_group_by_dtype_and_size() -> None:
    ts = [Tensor.zeros(256), Tensor.zeros(256), Tensor.zeros(10, dtype="float64"), Tensor.zeros(512), Tensor.zeros(1)]
    got = [[t.numel() for t in b] for b in buckets(ts, bucket_bytes=2048)]
    assert got == [[256, 256], [512], [1], [10]]


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=lambda v: v.name)
def test_shares_cores_when_the_ranks_on_this_host_outnumber_its_cores(
    no_launcher: pytest.MonkeyPatch, launcher: object
) -> None:
    vars_ = launcher
    no_launcher.setenv(vars_.rank, "0")  # type: ignore[attr-defined]
    no_launcher.setenv(vars_.size, "64")  # type: ignore[attr-defined]
    no_launcher.setattr(os, "cpu_count", lambda: 4)
    no_launcher.setenv(vars_.local_size, "4")  # type: ignore[attr-defined]
    assert local_size() == 4 and not shares_cores()  # a core per rank: a waiting rank spins
    no_launcher.setenv(vars_.local_size, "5")  # type: ignore[attr-defined]
    assert local_size() == 5 and shares_cores()  # more ranks than cores: a waiting rank yields
    no_launcher.delenv(vars_.local_size)  # type: ignore[attr-defined]
    assert local_size() is None and shares_cores()  # the launcher does not say: yield, to be safe


def test_local_size_outside_a_launcher_is_unknown(no_launcher: pytest.MonkeyPatch) -> None:
    assert local_size() is None


def test_data_parallel_starts_each_bucket_before_the_next_buckets_gradients(no_launcher: pytest.MonkeyPatch) -> None:
    from xgrad import Context, nn
    from xgrad.distributed import DataParallel
    from xgrad.nn.optim import Adam
    from xgrad.nn.state import get_parameters

    no_launcher.setenv("OMPI_COMM_WORLD_RANK", "0")
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "2")
    layers = [nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 4)]
    dp = DataParallel(layers, bucket_mb=5000 / 2**20, broadcast_params=False)  # ~1250 floats a bucket: 3 buckets
    opt = Adam(get_parameters(layers))
    x = Tensor(np.ones((8, 16), np.float32))
    with Context(TRAINING=1):
        for layer in layers[:-1]:
            x = layer(x).relu()
        loss = layers[-1](x).sum()
        loss.backward()
        dp.average_gradients()
        steps = Tensor.schedule_linear(loss, *opt.schedule_step()).src  # scheduled only: nothing runs MPI here
    kinds = ["kernel" if it.is_kernel else it.ast.arg.name for it in steps]
    starts = [i for i, k in enumerate(kinds) if k == "all_reduce(sum) start"]
    whole = kinds.index("all_reduce(sum)")
    waits = [i for i, k in enumerate(kinds) if k == "all_reduce(sum) wait"]
    assert len(starts) == len(waits) == 2 and kinds.count("all_reduce(sum)") == 1, kinds
    # between a start and the next start (or the last bucket's step): the next bucket's gradient kernels
    for a, b in zip(starts, [*starts[1:], whole]):
        assert "kernel" in kinds[a + 1 : b], kinds
    assert all(w > whole for w in waits), kinds  # each wait after every bucket was started
    # cut in reverse parameter order: the first bucket started holds the last layer's gradients
    cut = buckets(get_parameters(layers)[::-1], 5000)
    assert any(p is layers[-1].weight for p in cut[0]) and steps[starts[0]].bufs[0].size == sum(
        p.numel() for p in cut[0]
    )


def test_staging_keeps_as_many_send_buffers_as_were_in_use_at_once() -> None:
    from xgrad.distributed.collectives import give_staging, take_staging

    first = [take_staging(1000 + i) for i in range(12)]  # 12 buckets in flight at once
    for b in first:
        give_staging(b)
    again = [take_staging(1000 + i) for i in range(12)]  # the next step: every one reused, none allocated
    assert sorted(map(id, again)) == sorted(map(id, first))
    assert all(len(b) >= 1000 + i for i, b in enumerate(again))
    for b in again:
        give_staging(b)
