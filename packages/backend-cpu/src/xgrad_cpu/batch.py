"""A TinyJit replay's CPU kernels launched by one C call.

Replaying a captured step launches each kernel through Python (its arguments, the worker pool's ctypes call): a few
microseconds each, which a decode step of a language model (hundreds of small kernels) pays hundreds of times.
`CPUBatch` builds every launch's arguments once, as `_pool.c`'s xgrad_launch structs, and a replay patches in what
changes (the input buffers' pointers, the variables' values, iteration counts that depend on them) and makes one
call to `xgrad_pool_run_list`, which runs the kernels in order on the worker pool with the GIL released.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from xgrad.buffer import ProgramInfo
from xgrad_codegen.device import launch_args
from xgrad_cpu.program import Launch, get_pool, num_threads

# below this much work (estimated operations + bytes moved) a kernel runs in the calling thread: handing chunks to
# the worker pool costs more than it saves
SMALL_KERNEL = 1 << 16


def is_small(info: ProgramInfo) -> bool:
    """Whether a kernel is too little work to share between threads."""
    work = info.ops + info.mem
    return isinstance(work, int) and work < SMALL_KERNEL


class CPUBatch:
    """Kernels to run in order: `launches` holds, per kernel, (program, buffer handles with None where an input goes,
    (handle position, input index) pairs, the variable values it was captured with). Calling it with the inputs'
    handles and the variables' new values runs them all."""

    def __init__(self, launches: Sequence[tuple[Any, list[Any], tuple[tuple[int, int], ...], dict[str, int]]]):
        self.launches = (Launch * len(launches))()
        self._arrays: list[Any] = []  # the argument arrays the structs point into, kept alive
        self._inputs: list[tuple[Any, int, int]] = []  # (pointer array, position, input index)
        self._vars: list[tuple[Any, int, str]] = []  # (int array, position, variable name)
        self._sized: list[tuple[int, ProgramInfo, dict[str, int]]] = []  # launches whose size depends on variables
        self._shared: list[int] = []  # launches worth all threads
        for i, (program, handles, from_inputs, var_vals) in enumerate(launches):
            info: ProgramInfo = program.info
            ptrs = (ctypes.c_void_p * max(len(handles), 1))(*[0 if h is None else h.ptr for h in handles])
            self._inputs += [(ptrs, k, s) for k, s in from_inputs]
            gs, vals = launch_args(info, var_vals)
            ints = (ctypes.c_int * max(len(vals), 1))(*vals)
            self._vars += [(ints, j, name) for j, name in enumerate(info.var_names)]
            if type(info.global_size) is not int:
                self._sized.append((i, info, var_vals))
            if not is_small(info):
                self._shared.append(i)
            self.launches[i] = Launch(program.raw.fxn_ptr, ptrs, ints, gs, 1)
            self._arrays += [ptrs, ints]
        self._threads = 0
        self._run = get_pool().run_list

    def __call__(self, inputs: list[Any], var_vals: dict[str, int]) -> None:
        for ptrs, k, s in self._inputs:
            ptrs[k] = inputs[s].ptr
        if var_vals:
            for ints, j, name in self._vars:
                if name in var_vals:
                    ints[j] = var_vals[name]
            for i, info, captured in self._sized:
                self.launches[i].total = launch_args(info, {**captured, **var_vals})[0]
        if (threads := num_threads()) != self._threads:  # NUM_CPU_THREADS may change between replays
            for i in self._shared:
                self.launches[i].nthreads = threads
            self._threads = threads
        self._run(self.launches, len(self.launches))
