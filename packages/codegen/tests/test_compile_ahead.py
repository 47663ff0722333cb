"""`CompiledDevice.compile_ahead`: the kernels one schedule runs are built before the first runs, several compiles at
once on a thread pool that sees the caller's knobs; a failing compile raises its `CompileError`; and a realize hands
each device its kernels in order."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from kernel_helpers import data, kernel_asts

from xgrad import Device, Tensor
from xgrad.engine import realize
from xgrad.errors import CompileError
from xgrad.helpers import CACHELEVEL, Context
from xgrad.uop.ops import UOp
from xgrad_codegen.device import CompiledDevice


class MeetingCompiler:
    """The CPU compiler, whose first two compiles wait for each other at a barrier: they return only if both run at
    once, so building kernels one after the other fails (`BrokenBarrierError` after the timeout)."""

    concurrent = True

    def __init__(self, inner: object, fail_on: str = "") -> None:
        self.inner = inner
        self.fail_on = fail_on
        self.barrier = threading.Barrier(2, timeout=30)
        self.cachelevels: list[int] = []
        self.lock = threading.Lock()

    def compile(self, src: str) -> bytes:
        with self.lock:
            self.cachelevels.append(CACHELEVEL.value)
            first_two = len(self.cachelevels) <= 2
        if first_two:
            self.barrier.wait()
        if self.fail_on and self.fail_on in src:
            raise CompileError("this kernel does not build", source=src, log="")
        return self.inner.compile(src)  # type: ignore[attr-defined,no-any-return]


def _device(compiler: object) -> CompiledDevice:
    cpu = Device["CPU"]
    return CompiledDevice("CPU", cpu.allocator, cpu.renderer, compiler, cpu.program_factory)  # type: ignore[arg-type]


def _two_asts() -> list[UOp]:
    a, b = data(8, 16), data(16, 4, seed=1)
    asts = kernel_asts(lambda: (Tensor(a) @ Tensor(b)).relu().sum(axis=0) + Tensor(a).max())
    assert len(asts) >= 2
    return asts


@pytest.fixture
def fresh_programs() -> Iterator[None]:
    with Context(CACHELEVEL=0):  # every kernel is rendered and compiled here, none read from a disk cache
        yield


def test_a_schedules_kernels_compile_at_once_in_the_callers_context(fresh_programs: None) -> None:
    asts = _two_asts()
    compiler = MeetingCompiler(Device["CPU"].compiler)
    dev = _device(compiler)
    with Context(PARALLEL=2):
        dev.compile_ahead(asts)  # two compiles meet at the barrier: one at a time would time out
    assert dev.compiled_count == len(set(asts))
    assert compiler.cachelevels == [0] * len(set(asts))  # the workers saw this thread's Context(CACHELEVEL=0)
    count = dev.compiled_count
    assert all(dev.compile(ast) is dev.compile(ast) for ast in asts)
    assert dev.compiled_count == count  # `compile` found them built


def test_a_kernel_that_fails_to_compile_raises_from_compile_ahead(fresh_programs: None) -> None:
    asts = _two_asts()
    name = asts[1].arg.name
    dev = _device(MeetingCompiler(Device["CPU"].compiler, fail_on=f" {name}("))
    with Context(PARALLEL=2), pytest.raises(CompileError, match="does not build"):
        dev.compile_ahead(asts)


def test_one_kernel_or_a_beam_search_compiles_inline(fresh_programs: None) -> None:
    asts = _two_asts()
    compiler = MeetingCompiler(Device["CPU"].compiler)
    dev = _device(compiler)
    dev.compile_ahead(asts[:1])  # a single kernel is left to `compile`
    with Context(BEAM=1):
        dev.compile_ahead(asts)  # BEAM times candidates: nothing else may compile meanwhile
    assert compiler.cachelevels == [] and dev.compiled_count == 0


def test_a_realize_hands_the_device_its_kernels_in_order_before_running_them(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = Device["CPU"]
    events: list[tuple[str, object]] = []
    ahead = cpu.compile_ahead
    run_kernel = realize.run_kernel

    def spy_ahead(asts: list[UOp]) -> None:
        events.append(("ahead", list(asts)))
        ahead(asts)

    def spy_run(item: realize.ScheduleItem, vals: dict[str, int]) -> object:
        events.append(("run", item.ast))
        return run_kernel(item, vals)

    monkeypatch.setattr(cpu, "compile_ahead", spy_ahead)
    monkeypatch.setattr(realize, "run_kernel", spy_run)
    a, b = data(8, 16), data(16, 4, seed=1)
    out = ((Tensor(a) @ Tensor(b)).relu().sum(axis=0) + Tensor(a).max()).numpy()
    np.testing.assert_allclose(out, np.maximum(a @ b, 0).sum(axis=0) + a.max(), rtol=1e-5, atol=1e-5)
    assert events[0][0] == "ahead"
    ran = [ast for kind, ast in events if kind == "run"]
    assert events[0][1] == ran and len(ran) >= 2


def _compile_fresh(asts: list[UOp]) -> None:
    dev = _device(Device["CPU"].compiler)
    dev.compile_ahead(asts)
    assert dev.compiled_count == len(set(asts))


def test_a_forked_child_compiles_ahead_on_threads_of_its_own(fresh_programs: None) -> None:
    asts = _two_asts()
    with Context(PARALLEL=2):
        _compile_fresh(asts)  # the parent's pool has its threads now; a forked child has none of them
        child = multiprocessing.get_context("fork").Process(target=_compile_fresh, args=(asts,))
        child.start()
        child.join(timeout=120)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0  # not None: a child that submitted to its parent's pool would wait forever
