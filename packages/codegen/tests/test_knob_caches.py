"""Every registered knob, changed between two realizes of the same graph with every cache on (the schedule cache, the
in-memory program caches, the rendered-program, BEAM and compiler disk caches), is followed: the result is right and
the kernels and copies that run are those a process with nothing cached makes under the new value. A knob declared to
change schedules or generated code must change them here; one declared to act at run time or before any cache must
leave them alone; the few that cannot be changed meaningfully inside a process say why. Together these tests hold the
knob registry's declarations (`xgrad.helpers.Effect`) to what the knobs do."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from kernel_helpers import data

from xgrad import Tensor
from xgrad.device import Device
from xgrad.engine import realize
from xgrad.helpers import KNOBS, Context, Effect
from xgrad_codegen import search

A, B = data(8, 12), data(12, 8, seed=1)
BIG = data(1 << 16, seed=2)
PARTS = [data(4, 4, seed=i) for i in range(6)]
SHARDED = data(8, 16, seed=9)
D4 = ("CPU", "CPU:1", "CPU:2", "CPU:3")
Graph = tuple[Callable[[], Tensor], Callable[[], np.ndarray]]

MATMUL_EXP: Graph = (lambda: (Tensor(A) @ Tensor(B)).exp(), lambda: np.exp(A @ B))
BIG_SUM: Graph = (lambda: Tensor(BIG).sum(), lambda: BIG.sum(dtype=np.float64))
MANY_INPUTS: Graph = (lambda: sum((Tensor(p) for p in PARTS[1:]), Tensor(PARTS[0])), lambda: sum(PARTS))  # type: ignore[return-value]
ALLREDUCE: Graph = (lambda: Tensor(SHARDED).shard(D4, 0).sum(0), lambda: SHARDED.sum(0))
ELEMENTWISE: Graph = (lambda: (Tensor(A) * Tensor(A) + 1).exp(), lambda: np.exp(A * A + 1))
# a small search: one step, one timing run (every base and toggle of a BEAM knob starts from these)
SMALL_BEAM = {"BEAM_MAX_STEPS": 1, "BEAM_RUNS": 1}


@dataclass(frozen=True)
class Followed:
    """A knob declared SCHEDULE or CODEGEN: `value` on top of `base` must change what runs for `graph` (unless
    `changes` is False: then why it need not)."""

    value: Any
    graph: Graph
    base: dict[str, Any] = field(default_factory=dict)
    changes: bool = True
    why_same: str = ""


FOLLOWED: dict[str, Followed] = {
    "SPLIT_REDUCEOP": Followed(0, BIG_SUM),
    "MAX_KERNEL_BUFFERS": Followed(4, MANY_INPUTS),
    "RING": Followed(2, ALLREDUCE),
    "RING_ALLREDUCE_THRESHOLD": Followed(16, ALLREDUCE),
    "NOOPT": Followed(1, MATMUL_EXP),
    "TRANSCENDENTAL": Followed(2, MATMUL_EXP),
    "BEAM": Followed(1, MATMUL_EXP, SMALL_BEAM),
    "BEAM_MAX_STEPS": Followed(
        2, BIG_SUM, {**SMALL_BEAM, "BEAM": 1}
    ),  # a small matmul's second step finds nothing longer
    "BEAM_UPCAST_MAX": Followed(2, MATMUL_EXP, {**SMALL_BEAM, "BEAM": 1}),
    "BEAM_TIMEOUT_SEC": Followed(1e-9, MATMUL_EXP, {**SMALL_BEAM, "BEAM": 1}),
    "BEAM_RUNS": Followed(
        2,
        MATMUL_EXP,
        {**SMALL_BEAM, "BEAM": 1},
        changes=False,
        why_same="it changes how often candidates are timed; with deterministic timings the pick is the same, "
        "so only the search running again (not its cached result) is checked",
    ),
}

# knobs declared RUNTIME or NONE: changed, they must leave the kernels and the result alone (they act at each use,
# or on the tensor graph before any cache, and this graph does not use them)
UNCHANGED: dict[str, Any] = {
    "DEBUG": 2,
    "DEV": "CPU:1",
    "JITBEAM": 2,
    "IGNORE_BEAM_CACHE": 1,
    "PARALLEL": 1,
    "JIT": 0,
    "DEFAULT_FLOAT": "float16",
    "DEFAULT_INT": "int64",
    "TRAINING": 1,
    "OPTIM_DTYPE": "float16",
    "CONST_LR": 1,
    "SPEC": 0,
    "REWRITE_STACK_LIMIT": 200_000,
    "CACHELEVEL": 0,
    "XGRAD_CACHE_DIR": "<another directory>",
    "SCACHE": 0,
    "FUSE_OPTIM": 1,
    "NO_MEMORY_PLANNER": 1,
    "DISALLOW_BROADCAST": 1,  # (on the elementwise graph: matmul broadcasts implicitly inside)
    "NUM_CPU_THREADS": 1,
    "DIST_TIMEOUT": 5.0,  # xgrad.distributed: read when a collective across processes waits
    "DIST_BUCKET_MB": 1.0,  # xgrad.distributed: read by DataParallel
    # tinygrad's knobs accepted with no effect in xgrad
    "IMAGE": 1,
    "CHECK_OOB": 1,
    "EMULATED_DTYPES": "bfloat16,float16",
    "ALLREDUCE_CAST": 0,
}

# knobs that cannot be changed meaningfully inside one process, with their declared effect and why
NOT_TOGGLED: dict[str, str] = {
    "CC": "COMPILE, read when a CPU device opens: its compiler (path, version, flags) is fixed then and is part of "
    "the device's target, of the program caches' keys and of the compiler's disk key; test_compiler opens devices "
    "under other values",
    "CPU_MARCH": "COMPILE, read when a CPU device opens (it sets the -march flag and the renderer's vector width "
    "there); the CPU devices keep one program cache per target and test_compiler opens devices under each value",
    "MOCKGPU": "COMPILE, read when an NV or AMD device opens: it picks the mocked driver (whose programs are PTX for "
    "the interpreter, or code objects for the emulator) for that device's life; the backends' tests open devices under "
    "it",
    "XGRAD_DISABLE_PLUGIN_AUTOLOAD": "NONE, read when the plugin registry is built, before any device opens; changing "
    "it means a new registry and new devices (tests/ and test_plugin cover it)",
    "XGRAD_PLUGINS": "NONE, read when the plugin registry is built (see XGRAD_DISABLE_PLUGIN_AUTOLOAD)",
    "XGRAD_BLOCK_PLUGINS": "NONE, read when the plugin registry is built (see XGRAD_DISABLE_PLUGIN_AUTOLOAD)",
    "XGRAD_PLUGIN_OVERRIDE": "NONE, read when the plugin registry is built (see XGRAD_DISABLE_PLUGIN_AUTOLOAD)",
}


# knobs other packages declare when they are imported (present in KNOBS only in a process that imported them)
PACKAGE_KNOBS = {"XGRAD_TORCH_STRICT": "NONE, read by the torch bridge (xgrad_torch) when an aten op has no kernel"}


def test_every_knob_is_covered_as_its_declared_effect_says() -> None:
    covered = set(FOLLOWED) | set(UNCHANGED) | set(NOT_TOGGLED)
    assert covered == set(KNOBS) - set(PACKAGE_KNOBS)
    for name in set(PACKAGE_KNOBS) & set(KNOBS):
        assert PACKAGE_KNOBS[name].startswith(KNOBS[name].affects.name), f"{name}: declared {KNOBS[name].affects.name}"
    assert not (set(FOLLOWED) & set(UNCHANGED) or set(FOLLOWED) & set(NOT_TOGGLED) or set(UNCHANGED) & set(NOT_TOGGLED))
    for name, k in KNOBS.items():
        if k.affects in (Effect.SCHEDULE, Effect.CODEGEN):
            assert name in FOLLOWED, f"{name} is declared {k.affects.name}: show that every cache follows it"
        elif name in FOLLOWED:
            pytest.fail(f"{name} changes kernels here but is declared {k.affects.name}: declare what it affects")
        if name in NOT_TOGGLED:
            assert NOT_TOGGLED[name].startswith(k.affects.name), f"{name}: the reason must name its declared effect"


# ---- recording what runs ----
Trace = list[tuple[str, Any]]


@pytest.fixture
def traces(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> Iterator[list[Trace]]:
    """Every cache on, the disk caches in a fresh directory, deterministic BEAM timings (a longer program counts as
    faster: the pick differs from the heuristic's and is the same in every search); each realize appends what it
    runs: ("kernel", source) or ("copy", elements)."""
    got: list[Trace] = []
    run_schedule = realize.run_schedule

    def recording(items: list[Any], var_vals: dict[str, int] | None = None) -> None:
        got.append(
            [
                ("copy", it.bufs[0].size) if it.is_copy else ("kernel", Device[it.device].compile(it.ast).info.src)
                for it in items
            ]
        )
        run_schedule(items, var_vals)

    def timing(prg: Any, scratch: Any, runs: int, cutoff: float) -> float:
        return 1.0 / len(prg.info.src)

    monkeypatch.setattr(realize, "run_schedule", recording)
    monkeypatch.setattr(search, "time_program", timing)
    with Context(SCACHE=1, CACHELEVEL=2, XGRAD_CACHE_DIR=str(tmp_path / "cache"), IGNORE_BEAM_CACHE=0):
        yield got


@contextlib.contextmanager
def nothing_in_memory() -> Iterator[None]:
    """The in-memory program caches of the CPU devices empty for the block, as in a new process; refilled after."""
    from xgrad_cpu.device import _PROGRAMS

    saved = {target: dict(programs) for target, programs in _PROGRAMS.items()}
    for programs in _PROGRAMS.values():
        programs.clear()
    try:
        yield
    finally:
        for target, programs in _PROGRAMS.items():
            programs.update(saved.get(target, {}))


def run(graph: Graph, got: list[Trace]) -> Trace:
    build, want = graph
    result = build().numpy()
    np.testing.assert_allclose(result, want(), rtol=2e-4, atol=2e-4)
    return got[-1]


@pytest.mark.parametrize("name", list(FOLLOWED))
def test_knob_declared_to_change_kernels_is_followed_by_every_cache(name: str, traces: list[Trace]) -> None:
    case = FOLLOWED[name]
    with Context(**case.base):
        before = run(case.graph, traces)  # fills every cache under the knob's value before
        searches = search.stats.searches
        with Context(**{name: case.value}):
            after = run(case.graph, traces)  # every cache on: none may answer with what it held for the old value
            searched_again = search.stats.searches > searches
            with nothing_in_memory():  # a new process: the disk caches answer (or must not)
                after_disk = run(case.graph, traces)
            with Context(SCACHE=0, CACHELEVEL=0), nothing_in_memory():
                fresh = run(case.graph, traces)  # nothing cached anywhere
        with nothing_in_memory():  # the old value again, in a new process: its disk entries were not overwritten
            back = run(case.graph, traces)
    assert after == fresh, f"{name}={case.value!r}: a cache answered with what it held for {name}={KNOBS[name].default}"
    assert after_disk == fresh, f"{name}={case.value!r}: a disk cache answered with an entry of the old value"
    assert back == before, f"{name}: a disk cache entry of the old value was replaced by one of {case.value!r}"
    if case.changes:
        assert after != before, f"{name}={case.value!r} changed nothing on this graph: pick one it changes"
    else:
        assert case.why_same and searched_again


@pytest.mark.parametrize("name", list(UNCHANGED))
def test_knob_declared_not_to_change_kernels_leaves_them_alone(
    name: str, traces: list[Trace], tmp_path: pathlib.Path
) -> None:
    value = str(tmp_path / "other") if name == "XGRAD_CACHE_DIR" else UNCHANGED[name]
    graph = ELEMENTWISE if name == "DISALLOW_BROADCAST" else MATMUL_EXP
    before = run(graph, traces)
    with Context(**{name: value}):
        after = run(graph, traces)
    assert after == before
    assert KNOBS[name].affects in (Effect.RUNTIME, Effect.NONE)


def test_not_toggled_knobs_have_reasons() -> None:
    for name, why in NOT_TOGGLED.items():
        assert len(why) > len(KNOBS[name].affects.name) + 20, name
