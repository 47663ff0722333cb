import math
import os
import signal
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from xgrad.errors import XgradError
from xgrad.helpers import Context
from xgrad_cpu.allocator import CPUAllocator, CPUBuffer
from xgrad_cpu.compiler import CCompiler
from xgrad_cpu.program import CPUProgram

HEADER = "#define _GNU_SOURCE\n#include <math.h>\n#include <sched.h>\n#include <unistd.h>\n#include <sys/syscall.h>\n"
KERNELS = (
    HEADER
    + """
void add(void** restrict bufs, const int* restrict vars, int start, int end) {
  float* out = bufs[0]; const float* a = bufs[1]; const float* b = bufs[2];
  for (int i = start; i < end; i++) out[i] = a[i] + b[i];
}
void affine(void** restrict bufs, const int* restrict vars, int start, int end) {
  int* out = bufs[0]; const int* a = bufs[1];
  for (int i = start; i < end; i++) out[i] = a[i] * vars[0] + vars[1];
}
void expsin(void** restrict bufs, const int* restrict vars, int start, int end) {
  float* out = bufs[0]; const float* a = bufs[1];
  for (int i = start; i < end; i++) out[i] = expf(a[i]) + sinf(a[i]);
}
/* bufs[0]: per-index hit counts; bufs[1]: [ncalls, start0, end0, start1, end1, ...]; bufs[2]: thread id per call */
void cover(void** restrict bufs, const int* restrict vars, int start, int end) {
  int* hits = bufs[0]; int* calls = bufs[1]; long* tids = bufs[2];
  int c = __atomic_fetch_add(&calls[0], 1, __ATOMIC_SEQ_CST);
  calls[1 + 2 * c] = start; calls[2 + 2 * c] = end;
  tids[c] = syscall(SYS_gettid);
  if (hits) for (int i = start; i < end; i++) __atomic_fetch_add(&hits[i], 1, __ATOMIC_SEQ_CST);
}
void empty(void** restrict bufs, const int* restrict vars, int start, int end) {}
/* bufs[0]: the thread that ran each index; bufs[1]: set once the second half (a worker's share) has begun. That half
 * runs slowly (2 ms a call); the first waits for it to begin, so the caller is free to help only once it has. */
void lopsided(void** restrict bufs, const int* restrict vars, int start, int end) {
  long* who = bufs[0]; int* begun = bufs[1];
  if (start >= vars[0]) { __atomic_store_n(begun, 1, __ATOMIC_SEQ_CST); usleep(2000); }
  else for (long spins = 0; !__atomic_load_n(begun, __ATOMIC_SEQ_CST) && spins < 2000000000L; spins++) {}
  for (int i = start; i < end; i++) who[i] = syscall(SYS_gettid);
}
/* bufs[0]: [ncalls, tid0, cpu0, tid1, cpu1, ...]: the thread and core that ran each chunk */
void where(void** restrict bufs, const int* restrict vars, int start, int end) {
  long* out = bufs[0];
  long c = __atomic_fetch_add(&out[0], 1, __ATOMIC_SEQ_CST);
  out[1 + 2 * c] = syscall(SYS_gettid);
  out[2 + 2 * c] = sched_getcpu();
}
"""
)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    with Context(XGRAD_CACHE_DIR=str(tmp_path_factory.mktemp("cache"))):
        return CCompiler().compile(KERNELS)


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path: Path) -> Iterator[None]:
    with Context(XGRAD_CACHE_DIR=str(tmp_path)):
        yield


alloc = CPUAllocator()


def buffer_from(arr: np.ndarray) -> CPUBuffer:
    buf = alloc.alloc(arr.nbytes)
    alloc.copyin(buf, memoryview(np.ascontiguousarray(arr).tobytes()))
    return buf


def read(buf: CPUBuffer, dtype: type, count: int) -> np.ndarray:
    return np.frombuffer(alloc.as_memoryview(buf), dtype=dtype, count=count).copy()


def run_cover(lib: bytes, global_size: int, threads: int) -> tuple[np.ndarray, list[tuple[int, int]], list[int]]:
    hits = alloc.alloc(4 * max(global_size, 1))
    alloc.copyin(hits, memoryview(bytes(hits.nbytes)))
    calls = buffer_from(np.zeros(1 + 2 * 512, np.int32))
    tids = buffer_from(np.zeros(512, np.int64))
    with Context(NUM_CPU_THREADS=threads):
        CPUProgram("cover", lib)(hits, calls, tids, global_size=global_size)
    c = read(calls, np.int32, 1 + 2 * 512)
    chunks = sorted((int(c[1 + 2 * i]), int(c[2 + 2 * i])) for i in range(int(c[0])))
    return read(hits, np.int32, global_size), chunks, [int(t) for t in read(tids, np.int64, int(c[0]))]


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_add_kernel_matches_numpy_any_thread_count(lib: bytes, threads: int) -> None:
    rng = np.random.default_rng(threads)
    a, b = rng.standard_normal(1001, dtype=np.float32), rng.standard_normal(1001, dtype=np.float32)
    out = alloc.alloc(a.nbytes)
    with Context(NUM_CPU_THREADS=threads):
        CPUProgram("add", lib)(out, buffer_from(a), buffer_from(b), global_size=a.size)
    np.testing.assert_array_equal(read(out, np.float32, a.size), a + b)


def test_vars_kernel_uses_symbolic_ints_in_order(lib: bytes) -> None:
    a = np.arange(-50, 50, dtype=np.int32)
    out = alloc.alloc(a.nbytes)
    CPUProgram("affine", lib)(out, buffer_from(a), global_size=a.size, vals=(3, -7))
    assert read(out, np.int32, a.size).tolist() == [x * 3 - 7 for x in range(-50, 50)]


def test_math_kernel_links_libm_functions(lib: bytes) -> None:
    xs = [0.0, 0.5, -1.25, 3.0]
    out = alloc.alloc(16)
    CPUProgram("expsin", lib)(out, buffer_from(np.array(xs, np.float32)), global_size=4)
    got = struct.unpack("4f", alloc.as_memoryview(out))
    for x, y in zip(xs, got, strict=True):
        assert math.isclose(y, math.exp(x) + math.sin(x), rel_tol=1e-5)


GRAINS_PER_SHARE = 16  # as _pool.c: each thread's share runs in grains of about 1/16 of it


def grain_of(global_size: int, threads: int) -> int:
    per_share = global_size // max(1, min(threads, global_size))
    return -(-per_share // GRAINS_PER_SHARE) if per_share > GRAINS_PER_SHARE else 1


def assert_tiles(chunks: list[tuple[int, int]], total: int, grain: int) -> None:
    """The chunks (sorted) cover [0, total) in order, without gaps or overlaps, each non-empty and at most a grain."""
    edges = [0]
    for start, end in chunks:
        assert start == edges[-1] and (0 < end - start <= grain or total == 0)
        edges.append(end)
    assert edges[-1] == total


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("global_size", [0, 1, 2, 3, 5, 7, 8, 16, 100, 1001])
def test_split_covers_every_index_once_any_size_and_threads(lib: bytes, global_size: int, threads: int) -> None:
    hits, chunks, _ = run_cover(lib, global_size, threads)
    assert hits.tolist() == [1] * global_size
    if threads == 1 or global_size <= 1:
        assert chunks == [(0, global_size)]  # inline, one call
    else:
        assert_tiles(chunks, global_size, grain_of(global_size, threads))


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_split_chunk_bounds_exact_when_global_size_near_int_max(lib: bytes, threads: int) -> None:
    total = 2**31 - 1  # "cover" with a NULL hits buffer only records bounds, so this is fast
    calls = buffer_from(np.zeros(1 + 2 * 512, np.int32))
    tids = buffer_from(np.zeros(512, np.int64))
    null = CPUBuffer(0, 0, memoryview(b""))
    with Context(NUM_CPU_THREADS=threads):
        CPUProgram("cover", lib)(null, calls, tids, global_size=total)
    c = read(calls, np.int32, 1 + 2 * 512)
    chunks = sorted((int(c[1 + 2 * i]), int(c[2 + 2 * i])) for i in range(int(c[0])))
    assert_tiles(chunks, total, grain_of(total, threads))
    # every share starts exactly where the int64 arithmetic puts it (no 32-bit overflow on the way)
    assert {total * i // threads for i in range(threads)} <= {start for start, _ in chunks}


def test_inline_runs_in_caller_thread_when_one_thread(lib: bytes) -> None:
    _, chunks, tids = run_cover(lib, 100, 1)
    assert chunks == [(0, 100)]
    assert tids == [threading.get_native_id()]


def test_inline_runs_in_caller_thread_when_global_size_1(lib: bytes) -> None:
    _, chunks, tids = run_cover(lib, 1, 8)
    assert chunks == [(0, 1)]
    assert tids == [threading.get_native_id()]


def test_pool_runs_chunks_on_distinct_threads_caller_included(lib: bytes) -> None:
    for _ in range(3):  # again once the workers exist
        hits, chunks, tids = run_cover(lib, 64, 4)
        assert hits.tolist() == [1] * 64
        assert len(set(tids)) == 4  # every thread runs at least its share's first grain
        assert threading.get_native_id() in tids


def test_idle_threads_help_with_a_slow_share_from_its_back(lib: bytes) -> None:
    # the worker's share runs slowly (another tenant's load on its core): the caller, done with its own, takes grains
    # from the back of the worker's share instead of waiting for it
    who = buffer_from(np.zeros(64, np.int64))
    begun = buffer_from(np.zeros(1, np.int32))
    CPUProgram("lopsided", lib)(who, begun, global_size=64, vals=(32,), threads=2)
    tids = read(who, np.int64, 64).tolist()
    me = threading.get_native_id()
    assert all(t == me for t in tids[:32])
    worker = {t for t in tids[32:]} - {me}
    assert len(worker) == 1 and tids[32] in worker  # the worker ran the front of its share
    helped = [i for i in range(32, 64) if tids[i] == me]
    assert helped and helped == list(range(64 - len(helped), 64))  # the caller took its back, in one piece


def run_where(lib: bytes, threads: int) -> list[tuple[int, int]]:
    """(thread id, core) of each chunk of a `threads`-thread launch."""
    out = buffer_from(np.zeros(1 + 2 * 64, np.int64))
    CPUProgram("where", lib)(out, global_size=threads, threads=threads)
    got = read(out, np.int64, 1 + 2 * 64)
    return [(int(got[1 + 2 * i]), int(got[2 + 2 * i])) for i in range(int(got[0]))]


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs Linux and 2 cores"
)
def test_worker_keeps_off_the_callers_core_unless_threads_outnumber_cores(lib: bytes) -> None:
    # a worker woken on the caller's core would share it for the whole kernel (half speed)
    allowed = os.sched_getaffinity(0)
    me = threading.get_native_id()
    run_where(lib, 2)  # the worker exists, with this thread's whole affinity set
    try:
        for core in sorted(allowed)[:2] * 2:  # the caller moves: the worker's set follows
            os.sched_setaffinity(0, {core})  # pins this thread only
            chunks = run_where(lib, 2)
            assert sorted(tid == me for tid, _ in chunks) == [False, True]
            ((worker, worker_core),) = [(tid, c) for tid, c in chunks if tid != me]
            assert worker_core != core
            assert os.sched_getaffinity(worker) == allowed - {core}
        # more threads than cores: every worker may use every core again
        workers = {tid for tid, _ in run_where(lib, len(allowed) + 1)} - {me}
        assert all(os.sched_getaffinity(tid) == allowed for tid in workers)
    finally:
        os.sched_setaffinity(0, allowed)


def test_wait_returns_elapsed_seconds_only_when_asked(lib: bytes) -> None:
    prg = CPUProgram("empty", lib)
    buf = alloc.alloc(4)
    with Context(NUM_CPU_THREADS=2):
        assert prg(buf, global_size=8) is None
        elapsed = prg(buf, global_size=8, wait=True)
    assert isinstance(elapsed, float) and 0.0 <= elapsed < 10.0


def test_same_bytes_load_library_once(lib: bytes) -> None:
    assert CPUProgram("add", lib)._dll is CPUProgram("empty", lib)._dll


def test_different_bytes_load_distinct_libraries() -> None:
    src = "int value(void) { return %d; }\n"
    c = CCompiler()
    one, two = CPUProgram("value", c.compile(src % 1)), CPUProgram("value", c.compile(src % 2))
    assert one._dll is not two._dll and one.fxn_ptr != two.fxn_ptr


def test_missing_function_raises_xgrad_error(lib: bytes) -> None:
    with pytest.raises(XgradError, match="no_such_kernel"):
        CPUProgram("no_such_kernel", lib)


def test_pool_correct_when_python_threads_launch_concurrently(lib: bytes) -> None:
    n = 4096
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        ba, bb, out = buffer_from(a), buffer_from(b), alloc.alloc(a.nbytes)
        prg = CPUProgram("add", lib)
        for _ in range(200):
            prg(out, ba, bb, global_size=n)
        if not np.array_equal(read(out, np.float32, n), a + b):
            errors.append(f"thread {seed} got a wrong result")

    with Context(NUM_CPU_THREADS=3):
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_works_in_forked_child_after_parent_used_it(lib: bytes) -> None:
    hits, _, _ = run_cover(lib, 50, 4)  # the parent's pool has workers now
    assert hits.tolist() == [1] * 50
    pid = os.fork()
    if pid == 0:
        try:
            child_hits, _, tids = run_cover(lib, 50, 4)
            os._exit(0 if child_hits.tolist() == [1] * 50 and len(set(tids)) == 4 else 1)
        except BaseException:
            os._exit(2)
    for _ in range(300):  # a deadlocked child must fail the test, not hang it
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("forked child did not finish within 30 s (pool deadlocked after fork?)")
    assert os.waitstatus_to_exitcode(status) == 0
