"""`CompiledDevice`: the base of devices that compile kernels. A backend gives it an allocator, a renderer, a compiler
and a program loader; this class runs the codegen pipeline, caches programs per kernel AST and launches them."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from xgrad.buffer import Allocator, ProgramInfo
from xgrad.dtype import dtypes
from xgrad.helpers import BEAM, CACHELEVEL, DEBUG, PARALLEL, Effect, dedup, knobs_key, prod
from xgrad.uop.ops import AxisType, GroupOp, KernelInfo, Ops, UOp
from xgrad_codegen.opt import OptError
from xgrad_codegen.pipeline import full_rewrite
from xgrad_codegen.program_cache import load_program, program_key, store_program
from xgrad_codegen.pygpu import launch_sizes
from xgrad_codegen.renderer import Renderer

H = TypeVar("H")


class Compiler(Protocol):
    """Source -> binary. Optional attribute `concurrent: bool`: True where `compile` may run on several threads at
    once (each call its own subprocess or otherwise thread-safe), so a schedule's kernels build in parallel
    (`CompiledDevice.compile_ahead`)."""

    def compile(self, src: str) -> bytes: ...


RawProgram = Any
ProgramFactory = Callable[[str, bytes], RawProgram]
# what a program depends on besides its AST: the knobs declared to change generated code or its build (NOOPT, BEAM,
# CC, ...); a module global, since reading an Enum member off its class costs ~100 ns on every launch
PROGRAM_KNOBS = Effect.CODEGEN | Effect.COMPILE


def program_info(name: str, uops: list[UOp], src: str) -> ProgramInfo:
    """Estimated operations and bytes moved (trip counts times ops), the parallel size and the variables."""
    ops = mem = 0
    trips: list[int] = []
    global_size: Any = 1
    var_names: list[str] = []
    for u in uops:
        mult = int(prod(trips))
        if u.op is Ops.RANGE:
            end = u.src[0]
            size = int(end.arg) if end.op is Ops.CONST else 1
            if u.arg[1] is AxisType.GLOBAL and global_size == 1:
                global_size = size if end.op is Ops.CONST else end
            trips.append(size)
        elif u.op is Ops.END:
            trips.pop()
        elif u.op is Ops.DEFINE_VAR:
            var_names.append(str(u.arg[0]))
        elif u.op in GroupOp.ALU and u.dtype.scalar() != dtypes.index and u.dtype.scalar() != dtypes.bool:
            ops += mult * u.dtype.count
        elif u.op in (Ops.LOAD, Ops.STORE):
            dt = u.dtype if u.op is Ops.LOAD else u.src[1].dtype
            mem += mult * dt.itemsize
    # stores to scratch arrays (PARAMs with a negative arg, e.g. a packed panel) are not outputs
    stored = [u.src[0].src[0] for u in uops if u.op is Ops.STORE]
    outs = tuple(sorted({p.arg for p in stored if p.op is Ops.PARAM and p.arg >= 0}))
    extra: dict[str, Any] = {}
    if any(u.op is Ops.SPECIAL for u in uops):  # a GPU program: per-thread counts times the threads launched
        groups, threads = launch_sizes(uops)
        extra["launch"] = (groups, threads)
        extra["shared"] = sum(int(u.arg[1]) * u.dtype.itemsize for u in uops if u.op is Ops.DEFINE_LOCAL)  # bytes
        global_size = groups[0] * groups[1] * groups[2]
        if isinstance(global_size, int):
            ops, mem = ops * global_size * prod(threads), mem * global_size * prod(threads)
    return ProgramInfo(name, src, ops, mem, global_size, tuple(var_names), outs, extra)


@dataclass(frozen=True)
class Lowered:
    """A kernel AST through codegen: its uops (empty when read from the disk program cache), source and info (which
    names it); `disk_key` where the program is to be stored in the disk program cache once it builds."""

    uops: list[UOp]
    src: str
    program: ProgramInfo
    disk_key: str | None


_pool: tuple[tuple[int, int], ThreadPoolExecutor] | None = None


def compile_pool() -> ThreadPoolExecutor:
    """The threads `CompiledDevice.compile_ahead` compiles on: `PARALLEL` of them (0 = the cores this process may
    use), made again when the knob changes and in a forked child (which has none of its parent's threads)."""
    global _pool
    key = (PARALLEL.value if PARALLEL.value > 0 else len(os.sched_getaffinity(0)), os.getpid())
    if _pool is None or _pool[0] != key:
        if _pool is not None and _pool[0][1] == key[1]:
            _pool[1].shutdown(wait=False)
        _pool = (key, ThreadPoolExecutor(max_workers=key[0], thread_name_prefix="xgrad-compile"))
    return _pool[1]


def submit_compile(compiler: Compiler, src: str) -> Future[bytes]:
    """`compiler.compile(src)` on the compile pool, in a copy of this thread's `Context` (the compiler reads knobs:
    CACHELEVEL, DEBUG, ...)."""
    return compile_pool().submit(copy_context().run, compiler.compile, src)


class CompiledProgram:
    """A kernel ready to launch: the backend's raw program plus its `ProgramInfo`."""

    def __init__(self, device: CompiledDevice, raw: RawProgram, info: ProgramInfo):
        self.device = device
        self.raw = raw
        self.info = info

    def __call__(self, bufs: list[Any], vals: dict[str, int], wait: bool = False) -> float | None:
        return self.device.launch(self.raw, bufs, self.info, vals, wait)


class CompiledDevice:
    """A device that runs generated kernels. Subclasses set the parts; `compile` and `launch` do the rest."""

    # tinygrad's device-graph class (batched kernel launches), None where there is none: xgrad's TinyJit replays the
    # captured launches directly on every device, so no device has one
    graph: Any = None

    def __init__(
        self, name: str, allocator: Allocator, renderer: Renderer, compiler: Compiler, program_factory: ProgramFactory
    ):
        self.name = name
        self.allocator = allocator
        self.renderer = renderer
        self.compiler = compiler
        self.program_factory = program_factory
        self._programs: dict[Any, CompiledProgram] = {}
        self.compiled_count = 0  # programs built (cache misses): tests prove one kernel serves every variable value
        # `compile_ahead` builds in parallel for a compiler safe on several threads, on a device that compiles and
        # builds the way this class does (a device that does its own keeps it)
        self._compiles_ahead = (
            getattr(compiler, "concurrent", False) is True
            and type(self).build is CompiledDevice.build
            and type(self).compile is CompiledDevice.compile
        )

    def compile(self, ast: UOp) -> CompiledProgram:
        key = (ast, knobs_key(PROGRAM_KNOBS))  # `Context(NOOPT=1)` must not find the program built without it
        if (hit := self._programs.get(key)) is not None:
            return hit
        lowered = self._lower(ast)
        return self._keep(key, lowered, self.build(lowered.program.name, lowered.uops, lowered.src))

    def compile_ahead(self, asts: Sequence[UOp]) -> None:
        """Build the programs of `asts` (the kernels one schedule runs next) that are not built yet, several at once:
        codegen renders each here while a pool of `PARALLEL` threads runs the compiler on the sources already
        rendered (a C compiler is a subprocess, so they run in parallel). `compile` then finds them. Only for a
        compiler that declares `concurrent = True` on a device that builds from the source alone with this class's
        `compile`; not under BEAM, whose timings want a quiet machine. A failure raises here, before any of the
        kernels ran."""
        if not self._compiles_ahead or BEAM.value >= 1:
            return
        knobs = knobs_key(PROGRAM_KNOBS)
        missing = dedup(key for ast in asts if (key := (ast, knobs)) not in self._programs)
        if len(missing) < 2:
            return  # built inline by `compile`: a thread would only add its hand-off
        pending: list[tuple[tuple[UOp, str], Lowered, Future[bytes]]] = []
        for key in missing:
            lowered = self._lower(key[0])
            pending.append((key, lowered, submit_compile(self.compiler, lowered.src)))
        for key, lowered, fut in pending:
            self._keep(key, lowered, self.program_factory(lowered.program.name, fut.result()))

    def _lower(self, ast: UOp) -> Lowered:
        """`ast` through codegen to source and its `ProgramInfo` (or both from the disk program cache)."""
        info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
        opts = None
        if BEAM.value >= 1:  # search the actions (or read them from the BEAM disk cache); None = not searched
            from xgrad_codegen.search import beam_opts

            opts = beam_opts(ast, self)
        # a device that builds from the source alone can reuse a program rendered by an earlier process
        disk_key = self._disk_key(ast, opts) if CACHELEVEL and type(self).build is CompiledDevice.build else None
        if disk_key is not None and (stored := load_program(disk_key)) is not None:
            src, program = stored
            return Lowered([], src, program, None)  # this device's build reads only the source
        try:
            uops = full_rewrite(ast, self.renderer, opts)
        except OptError:  # only "this action does not apply here": any other failure is a bug and raises
            if opts is None:
                raise
            uops = full_rewrite(ast, self.renderer)  # a cached BEAM result that no longer applies: the heuristic
        src = self.renderer.render(info.name, uops)
        return Lowered(uops, src, program_info(info.name, uops, src), disk_key)

    def _keep(self, key: tuple[UOp, str], lowered: Lowered, raw: RawProgram) -> CompiledProgram:
        """Remember the program built from `lowered` (on disk too, once it built)."""
        if lowered.disk_key is not None:
            store_program(lowered.disk_key, lowered.src, lowered.program)
        if DEBUG >= 4:
            print(lowered.src)
        prg = CompiledProgram(self, raw, lowered.program)
        self._programs[key] = prg
        self.compiled_count += 1
        return prg

    def _disk_key(self, ast: UOp, opts: Any) -> str:
        return program_key(ast, opts, self.name.split(":")[0], self.target(), type(self.renderer).__module__)

    def target(self) -> str:
        """What generated code depends on besides the AST and the knobs: the renderer and its vector width and, when
        the compiler has a cache key, its key of empty source (compiler, version, flags, the machine `-march=native`
        targets); for a GPU renderer its arch and workgroup limits.
        Part of the BEAM cache key; a backend whose target depends on more overrides this."""
        compiler_key = getattr(self.compiler, "cache_key", None)
        width = self.renderer.max_vector_width
        parts = [type(self.renderer).__name__, f"w{width}", type(self.compiler).__name__]
        if callable(compiler_key):
            parts.append(str(compiler_key("")))
        if self.renderer.has_local:  # workgroup limits shape GPU kernels (PYTHON::sm_90 and PYTHON::gfx942 differ)
            r = self.renderer
            parts.append(f"{r.arch}:g{r.global_max}:l{r.local_max}:t{r.max_threads}:s{r.shared_max}")
            parts.append(f"o{r.group_max_outputs}:m{r.min_local}")  # the heuristic's preferences
        return ":".join(parts)

    def build(self, name: str, uops: list[UOp], src: str) -> RawProgram:
        """Rendered source -> a program the device can launch (compile it, load it)."""
        return self.program_factory(name, self.compiler.compile(src))

    def launch(
        self, raw: RawProgram, bufs: list[Any], info: ProgramInfo, vals: dict[str, int], wait: bool
    ) -> float | None:
        """Default launch: the raw program takes buffers, the parallel size and the variable values."""
        gs, args = launch_args(info, vals)
        result: float | None = raw(*bufs, global_size=gs, vals=args, wait=wait)
        return result

    def synchronize(self) -> None:
        pass


def launch_args(info: ProgramInfo, vals: dict[str, int]) -> tuple[int, tuple[int, ...]]:
    """The parallel size of one launch of `info` and its variables' values in the kernel's order, under `vals`."""
    gs = info.global_size if type(info.global_size) is int else eval_size(info.global_size, vals)
    return gs, tuple([vals[n] for n in info.var_names]) if info.var_names else ()


def launch_dims(info: ProgramInfo, vals: dict[str, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(workgroups, threads per workgroup) of one launch of the GPU program `info` under `vals`: the sizes of its
    gidx/lidx SPECIALs (one workgroup of one thread for a program without them)."""
    launch = info.extra.get("launch") if info.extra else None
    if launch is None:
        return (1, 1, 1), (1, 1, 1)
    groups, threads = launch
    g = [x if isinstance(x, int) else eval_size(x, vals) for x in groups]
    return (g[0], g[1], g[2]), (int(threads[0]), int(threads[1]), int(threads[2]))


class BlockCache(Generic[H]):
    """Freed device blocks kept for reuse by size: up to `limit` bytes, the least recently freed size given back
    first (`put` returns what no longer fits, for the caller to release). A GPU allocator's free list."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.nbytes = 0
        self._blocks: OrderedDict[int, list[H]] = OrderedDict()

    def take(self, nbytes: int) -> H | None:
        """The most recently freed block of `nbytes`, or None."""
        if (blocks := self._blocks.get(nbytes)) is None:
            return None
        block = blocks.pop()
        if not blocks:
            del self._blocks[nbytes]
        self.nbytes -= nbytes
        return block

    def put(self, block: H, nbytes: int) -> list[H]:
        """Keep `block`; the blocks to release now: itself when bigger than the limit, else the oldest past it."""
        if nbytes > self.limit:
            return [block]
        self._blocks.setdefault(nbytes, []).append(block)
        self._blocks.move_to_end(nbytes)
        self.nbytes += nbytes
        evicted = []
        while self.nbytes > self.limit:
            size, blocks = next(iter(self._blocks.items()))
            evicted.append(blocks.pop(0))
            if not blocks:
                del self._blocks[size]
            self.nbytes -= size
        return evicted

    def clear(self) -> list[H]:
        """Forget every block; returns them for the caller to release."""
        out = [b for blocks in self._blocks.values() for b in blocks]
        self._blocks.clear()
        self.nbytes = 0
        return out


def eval_size(expr: UOp, vals: dict[str, int]) -> int:
    from xgrad.uop.symbolic import sym_infer

    return int(sym_infer(expr, vals))
