"""Load compiled kernels and run them on all cores.

Kernel ABI (emitted by the C renderer):
    void <name>(void** restrict bufs, const int* restrict vars, int start, int end)
`bufs[i]` is buffer i's data pointer, `vars[j]` the j-th symbolic int, `[start, end)` the slice of the outermost
parallel loop one call runs. A launch splits `range(global_size)` into contiguous shares, one per thread, and runs
them on the persistent pthread pool of `_pool.c` with a single ctypes call (ctypes drops the GIL for its duration);
a thread done with its share helps with the others' (see `_pool.c`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from xgrad.errors import XgradError
from xgrad.helpers import NUM_CPU_THREADS, cache_dir
from xgrad_cpu.allocator import CPUBuffer
from xgrad_cpu.compiler import CCompiler

KERNEL_ARGTYPES: list[Any] = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]

# Loading: the bytes go to a file that ctypes.CDLL (dlopen) maps, and the file is unlinked right after; the mapping
# outlives it. We use the system dynamic loader rather than our own ELF loader so relocations, libm, TLS and symbol
# lookup behave exactly as for any shared library, on every libc. The file lives in the cache dir, not /tmp, because
# /tmp is often mounted noexec. Its name starts with the sha256 of the bytes: dlopen returns an already loaded library
# when the path matches, so different bytes must never reuse a name; identical bytes are loaded once per process
# (`_loaded`), which also shares one copy of a kernel between programs.
_loaded: dict[str, ctypes.CDLL] = {}
_load_lock = threading.Lock()


def load_library(lib: bytes) -> ctypes.CDLL:
    """dlopen the shared object `lib` (bytes); the same bytes give the same handle."""
    digest = hashlib.sha256(lib).hexdigest()
    with _load_lock:
        if (handle := _loaded.get(digest)) is not None:
            return handle
        folder = cache_dir() / "cpu" / "load"
        folder.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(dir=folder, prefix=f"{digest}-", suffix=".so")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(lib)
            handle = ctypes.CDLL(path)
        except OSError as e:
            raise XgradError(
                f"cannot load a compiled CPU kernel: {e}; check that {folder} allows executables"
            ) from None
        finally:
            pathlib.Path(path).unlink(missing_ok=True)
        _loaded[digest] = handle
        return handle


class Launch(ctypes.Structure):
    """`_pool.c`'s xgrad_launch: one kernel of a list that `xgrad_pool_run_list` runs in order."""

    _fields_ = [
        ("fn", ctypes.c_void_p),
        ("bufs", ctypes.POINTER(ctypes.c_void_p)),
        ("vars", ctypes.POINTER(ctypes.c_int)),
        ("total", ctypes.c_int),
        ("nthreads", ctypes.c_int),
    ]


class _Pool:
    """The C worker pool (`_pool.c`), compiled once like a kernel and cached on disk."""

    def __init__(self) -> None:
        src = (pathlib.Path(__file__).parent / "_pool.c").read_text()
        lib = load_library(CCompiler(extra_flags=("-pthread",)).compile(src))
        self.run = lib.xgrad_pool_run
        self.run.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
            ctypes.c_int,
        ]
        self.run.restype = ctypes.c_int
        self.run_list = lib.xgrad_pool_run_list
        self.run_list.argtypes = [ctypes.POINTER(Launch), ctypes.c_int]
        self.run_list.restype = None
        self.max_threads: int = lib.xgrad_pool_max_threads()


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def get_pool() -> _Pool:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = _Pool()
    return _pool


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_CORES = _usable_cores()


def num_threads() -> int:
    """NUM_CPU_THREADS, or the number of cores this process may run on (read once at import)."""
    return NUM_CPU_THREADS.value if NUM_CPU_THREADS.value > 0 else _CORES


class CPUProgram:
    """A kernel loaded from shared-object bytes; calling it runs `[0, global_size)` over the worker pool."""

    def __init__(self, name: str, lib: bytes) -> None:
        self.name = name
        self.lib = lib
        self._dll = load_library(lib)
        try:
            self.fxn = self._dll[name]  # a fresh function object: programs sharing a library keep their own argtypes
        except AttributeError:
            raise XgradError(
                f"compiled CPU kernel has no function {name!r}; the rendered source must define it"
            ) from None
        self.fxn.argtypes = KERNEL_ARGTYPES
        self.fxn.restype = None
        self.fxn_ptr: int = ctypes.cast(self.fxn, ctypes.c_void_p).value or 0

    def __repr__(self) -> str:
        return f"CPUProgram({self.name!r})"

    def __call__(
        self,
        *bufs: CPUBuffer,
        global_size: int = 1,
        vals: tuple[int, ...] = (),
        wait: bool = False,
        threads: int | None = None,
    ) -> float | None:
        return self.launch(bufs, global_size, vals, wait, threads)

    def launch(
        self, bufs: Sequence[CPUBuffer], global_size: int, vals: tuple[int, ...], wait: bool, threads: int | None
    ) -> float | None:
        """Run the kernel over `[0, global_size)` on `threads` threads (None: `num_threads()`; a kernel with fewer
        parallel iterations uses fewer). Returns the seconds it took if `wait`."""
        assert 0 <= global_size <= 0x7FFFFFFF, f"global_size {global_size} does not fit the kernel ABI's int"
        ptrs = (ctypes.c_void_p * len(bufs))(*[b.ptr for b in bufs])
        ints = (ctypes.c_int * len(vals))(*vals) if vals else None
        if threads is None:
            threads = num_threads()
        st = time.perf_counter() if wait else 0.0
        if threads <= 1 or global_size <= 1:
            self.fxn(ptrs, ints, 0, global_size)  # inline: no thread handoff at all
        else:
            (_pool or get_pool()).run(self.fxn_ptr, ptrs, ints, global_size, min(threads, global_size))
        return time.perf_counter() - st if wait else None
