"""BEAM search: choose a kernel's optimizer actions by compiling candidates and timing them on the device.

IR in: a kernel AST from the scheduler (what `full_rewrite` takes). Out: a list of `Opt` for
`full_rewrite(ast, renderer, opts)`; the AST itself is not changed here.

The search starts from no actions, from the heuristic's actions and from those before its PACK, extends every entry of
the beam by each legal next action, renders all new candidates, compiles them on a thread pool (the C compiler runs as
a subprocess, so threads compile in parallel; `PARALLEL` workers), times each on scratch buffers of the kernel's sizes
(best of `BEAM_RUNS`, slow ones dropped early) and keeps the `width` fastest. It stops when a step finds nothing faster
or after `BEAM_MAX_STEPS` steps. The pick is never slower than the heuristic beyond noise (`final_pick`): the
finalists, the final beam and always the heuristic's own program, must agree with the heuristic's outputs on the same
random inputs and are timed again in turn, best of several launches each; the fastest wins, another than the heuristic
only by a margin. Results are cached on disk, one JSON file per key (kernel AST, device type, target, beam width, the
knobs declared to change generated code or its build, the codegen sources), unless `CACHELEVEL=0`;
`IGNORE_BEAM_CACHE=1` searches again and overwrites the entry.

A candidate that does not apply (`OptError`, `CompileError`: `NOT_APPLICABLE`) is dropped; any other exception is a
bug, counted in `stats.crashed` and raised under `SPEC=1` (the tests' setting), so a crash never passes for a rejected
action.

Kernels whose addresses depend on loaded data (gathers) or that divide loaded integers are not searched: random
inputs could read out of bounds or divide by zero. They keep the heuristic's actions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import pathlib
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from xgrad.dtype import DType, dtypes, to_np_dtype
from xgrad.errors import CompileError
from xgrad.helpers import (
    BEAM,
    BEAM_MAX_STEPS,
    BEAM_RUNS,
    BEAM_TIMEOUT_SEC,
    BEAM_UPCAST_MAX,
    CACHELEVEL,
    DEBUG,
    IGNORE_BEAM_CACHE,
    NOOPT,
    SPEC,
    Effect,
    cache_dir,
    knobs_key,
    write_atomic,
)
from xgrad.uop.ops import AxisType, KernelInfo, Ops, UOp
from xgrad_codegen import opt as opt_module
from xgrad_codegen.device import CompiledDevice, CompiledProgram, program_info, submit_compile
from xgrad_codegen.gpu_opt import apply_opts, gpu_candidates, optimize_for
from xgrad_codegen.opt import Opt, OptError, apply_opt, kernel_ranges, range_size
from xgrad_codegen.pipeline import before_optimize, full_rewrite
from xgrad_codegen.program_cache import codegen_sources_hash, module_hash

if TYPE_CHECKING:
    from xgrad_codegen.renderer import Renderer

# bump when the search or the cache format changes meaning (3: an Opt's axis is a range id, no longer a position;
# 4: picks are verified on ties too, so a cached pick checked on random floats alone is searched again)
SEARCH_VERSION = 4
SPLIT_AMOUNTS = (2, 3, 4, 8, 16)
PAD_MULTIPLES = (4, 6, 8)
# the finalists (the final beam and the heuristic's program) are timed again in turn, best of this many launches
# each, and one other than the heuristic wins only by this margin (timing noise on a shared machine is several
# percent: a "win" smaller than that is as likely a loss)
CONFIRM_MARGIN = 0.02
CONFIRM_RUNS = 5
# the errors that mean "this candidate does not apply" (an action illegal here, source the compiler rejects): the
# candidate is dropped. Any other exception is a bug in codegen or a backend: counted in `stats.crashed`, raised
# under SPEC=1 (the tests' setting), else the candidate is dropped too
NOT_APPLICABLE: tuple[type[Exception], ...] = (OptError, CompileError)
MAX_SCRATCH_BYTES = 1 << 31  # kernels needing more scratch memory than this are not searched


@dataclass
class SearchStats:
    """Counters over this process, for tests and DEBUG output."""

    searches: int = 0  # searches run (cache misses)
    cache_hits: int = 0  # results read from the disk cache
    compiled: int = 0  # candidate programs compiled
    timed: int = 0  # candidate programs timed
    rejected: int = 0  # candidates whose outputs disagreed with the heuristic's at the final check
    crashed: int = 0  # exceptions other than NOT_APPLICABLE (raised under SPEC=1)
    retimed: int = 0  # finalists timed again for the final pick
    skipped: int = 0  # kernels not searched (data-dependent addresses, too big, nothing to try)
    render_s: float = 0.0  # seconds spent rendering candidates (Python, in the calling thread)
    compile_wait_s: float = 0.0  # seconds spent waiting for the compile pool after rendering, and loading
    run_s: float = 0.0  # seconds spent launching candidates

    def reset(self) -> None:
        for name, f in self.__dataclass_fields__.items():
            setattr(self, name, f.default)


stats = SearchStats()


@dataclass(frozen=True)
class SearchKnobs:
    """The search's knobs, read once per search (declared CODEGEN: they are part of every program cache's key)."""

    max_steps: int
    lanes_max: int
    timeout_s: float
    runs: int

    @staticmethod
    def read() -> SearchKnobs:
        return SearchKnobs(
            max_steps=int(BEAM_MAX_STEPS.value),
            lanes_max=int(BEAM_UPCAST_MAX.value),
            timeout_s=float(BEAM_TIMEOUT_SEC.value),
            runs=max(1, int(BEAM_RUNS.value)),
        )


def beam_opts(ast: UOp, device: CompiledDevice, width: int | None = None) -> list[Opt] | None:
    """The actions BEAM search picks for `ast` on `device` (from the disk cache when it holds them), or None when
    the kernel is not searched (then the caller uses the heuristic). `width` defaults to the BEAM knob."""
    width = BEAM.value if width is None else width
    if width <= 0 or NOOPT.value:
        return None
    base = before_optimize(ast)  # the kernel as full_rewrite hands it to optimize: the actions name its ranges
    knobs = SearchKnobs.read()
    key = cache_key(base, device, width)
    if CACHELEVEL.value > 0 and not IGNORE_BEAM_CACHE.value and (hit := _read_cache(key)) is not None:
        if _applies(base, hit):  # opt.py may have changed what an action means since the entry was written
            stats.cache_hits += 1
            return hit
    if (reason := _unsearchable(base)) is not None:
        stats.skipped += 1
        if DEBUG.value >= 3:
            print(f"BEAM skips {_kernel_name(base)}: {reason}")
        return None
    try:
        result = _search(base, device, width, knobs)
    except Exception as e:
        if SPEC.value:  # a crash: the candidate's own handler counted it (or it came from outside one)
            raise
        # SPEC=0: BEAM may only make a kernel faster, never break it: fall back to the heuristic
        stats.crashed += 1
        if DEBUG.value >= 1:
            print(f"BEAM {_kernel_name(base)}: search failed ({type(e).__name__}: {e}); using the heuristic")
        result = None
    if result is None:
        stats.skipped += 1
        return None
    opts, record = result
    if CACHELEVEL.value > 0:
        _write_cache(key, opts, record)
    return opts


# ---- which kernels are searched, and which actions are legal ----
def _kernel_name(ast: UOp) -> str:
    return ast.arg.name if isinstance(ast.arg, KernelInfo) else "kernel"


def _unsearchable(ast: UOp) -> str | None:
    """Why timing `ast` on random data is unsafe or pointless, or None."""
    for u in ast.toposort:
        if u.op is Ops.INDEX and any(x.op is Ops.LOAD for x in u.src[1].toposort):
            return "an address depends on loaded data"
        if u.op in (Ops.IDIV, Ops.MOD) and u.dtype != dtypes.index and any(x.op is Ops.LOAD for x in u.src[1].toposort):
            return "it divides by loaded integers"
    if not kernel_ranges(ast):
        return "no loops"
    return None


def _applies(ast: UOp, opts: list[Opt]) -> bool:
    try:
        for o in opts:
            ast = apply_opt(ast, o)
    except OptError:
        return False
    except Exception as e:
        _crashed(e, opts, "applying a cached result")
        return False
    return True


def _crashed(e: Exception, opts: list[Opt], doing: str) -> None:
    """A candidate failed with an error that is not NOT_APPLICABLE: a bug. Count it; raise it under SPEC=1 (the
    tests' setting), else report it under DEBUG and let the caller drop the candidate."""
    stats.crashed += 1
    if SPEC.value:
        e.add_note(f"BEAM candidate {_opts_text(opts)} crashed while {doing} (SPEC=0 drops such a candidate)")
        raise e
    if DEBUG.value >= 1:
        print(f"BEAM candidate {_opts_text(opts)} crashed while {doing}: {type(e).__name__}: {e}")


def _lanes(ast: UOp) -> int:
    """Straight-line copies of the biggest loop body: per STORE, the UPCAST ranges its address depends on times the
    UNROLL ranges the reductions in its value combine (separate loop nests, e.g. a PACK copy, do not multiply)."""
    most = 1
    for st in ast.toposort:
        if st.op is not Ops.STORE:
            continue
        ups = {r for r in st.src[0].toposort if r.op is Ops.RANGE and r.arg[1] is AxisType.UPCAST}
        unrolls = {
            r
            for red in st.src[1].toposort
            if red.op is Ops.REDUCE
            for r in red.src[1:]
            if r.op is Ops.RANGE and r.arg[1] is AxisType.UNROLL
        }
        most = max(most, math.prod(range_size(r) or 1 for r in ups | unrolls))
    return most


def own_candidates(ast: UOp) -> list[Opt]:
    """Next actions for an AST with some actions applied: split any loop (UPCAST) or reduction (UNROLL) of constant
    size by an amount that divides it, or pad a loop to a multiple of 4, 6 or 8 so it can be split."""
    out: list[Opt] = []
    for r in kernel_ranges(ast):
        i, kind = r.arg
        size = range_size(r)
        if size is None or size <= 1 or kind not in (AxisType.LOOP, AxisType.REDUCE):
            continue
        op = "UPCAST" if kind is AxisType.LOOP else "UNROLL"
        out.extend(Opt(op, i, amount) for amount in SPLIT_AMOUNTS if amount <= size and size % amount == 0)
        if kind is AxisType.LOOP:
            out.extend(Opt("PADTO", i, m) for m in PAD_MULTIPLES if size % m != 0 and size > m)
    return out


def candidates(ast: UOp, renderer: Renderer) -> list[Opt]:
    """The legal next actions: opt.py's `candidate_opts(ast, renderer)` when it offers one, else `own_candidates`.
    An action that then fails to apply is skipped by the caller."""
    if (fn := getattr(opt_module, "candidate_opts", None)) is not None:
        return list(fn(ast, renderer)) + gpu_candidates(ast, renderer)
    return own_candidates(ast) + gpu_candidates(ast, renderer)


def heuristic(ast: UOp, renderer: Renderer) -> list[Opt]:
    """What the device uses without BEAM (a seed of the search and the reference of the verification): the actions
    `optimize` records in the kernel's KernelInfo when it chooses them itself, exactly as `full_rewrite` calls it
    (after the same passes)."""
    out = optimize_for(before_optimize(ast), renderer)
    return list(out.arg.opts) if isinstance(out.arg, KernelInfo) else []


# ---- the disk cache ----
def cache_key(ast: UOp, device: CompiledDevice, width: int) -> str:
    """The key of a search result: kernel AST, device type, target, the beam width, the knobs declared to change
    generated code or its build (the search's own knobs among them), the sources of codegen and of the device's
    renderer."""
    parts = (
        f"beam v{SEARCH_VERSION}",
        repr(ast),
        device.name.split(":")[0],
        device.target(),
        knobs_key(Effect.CODEGEN | Effect.COMPILE),
        f"width={width}",
        codegen_sources_hash(),
        module_hash(type(device.renderer).__module__),
    )
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _cache_path(key: str) -> pathlib.Path:
    return cache_dir() / "beam" / f"{key}.json"


def _read_cache(key: str) -> list[Opt] | None:
    try:
        data = json.loads(_cache_path(key).read_text())
        return [Opt(str(op), int(axis), int(amount)) for op, axis, amount in data["opts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(key: str, opts: list[Opt], record: dict[str, Any]) -> None:
    data = json.dumps({"opts": [[o.op, o.axis, o.amount] for o in opts], **record})
    with contextlib.suppress(OSError):  # a cache that cannot be written costs a search next time, nothing more
        write_atomic(_cache_path(key), data.encode())


# ---- scratch buffers of the kernel's sizes ----
@dataclass
class Scratch:
    """Buffers for timing: `handles[i]` stands for PARAM i, `initial[i]` is its starting content; `ties[i]` is a
    second content for checking outputs, whose floats take a few values only, so that comparisons meet equal values
    (random floats never tie: a kernel that mishandles `x == max(x)` for two equal maxima agrees on them)."""

    device: CompiledDevice
    dtypes: list[DType]
    handles: list[Any]
    initial: list[bytes]
    vals: dict[str, int]
    ties: list[bytes]

    def reset(self, contents: list[bytes] | None = None) -> None:
        for h, data in zip(self.handles, self.initial if contents is None else contents):
            self.device.allocator.copyin(h, memoryview(data))

    def read(self, i: int) -> np.ndarray[Any, Any]:
        out = bytearray(len(self.initial[i]))
        self.device.allocator.copyout(memoryview(out), self.handles[i])
        npdt = to_np_dtype(self.dtypes[i])
        return np.frombuffer(bytes(out), dtype=npdt if npdt is not None else np.uint8)


TIE_VALUES = (-2.0, -1.0, -0.5, 0.5, 1.0, 2.0)  # the floats of `Scratch.ties`: never zero (kernels may divide by it)


def _random_bytes(dt: DType, n: int, rng: np.random.Generator, ties: bool = False) -> bytes:
    npdt = to_np_dtype(dt)
    if npdt is None:
        return bytes(n * dt.itemsize)  # no numpy type (bfloat16, fp8): zeros
    if dtypes.is_float(dt):
        return (rng.choice(TIE_VALUES, n) if ties else rng.uniform(-1.0, 1.0, n)).astype(npdt).tobytes()
    if dt == dtypes.bool:
        return rng.integers(0, 2, n).astype(npdt).tobytes()
    return rng.integers(1, 5, n).astype(npdt).tobytes()  # never zero: kernels may divide by it


def make_scratch(ast: UOp, device: CompiledDevice, seed: int = 0) -> Scratch | None:
    """Buffers for every PARAM of `ast`, each as big as the largest index that reaches it (from the symbolic bounds
    of the index), filled with random data; None when they would be too big. Variables take their maximum."""
    params: dict[int, DType] = {}
    sizes: dict[int, int] = {}
    vals: dict[str, int] = {}
    for u in ast.toposort:
        if u.op is Ops.PARAM:
            params[int(u.arg)] = u.dtype.scalar()
        elif u.op is Ops.INDEX and u.src[0].op is Ops.PARAM:
            n = int(u.src[1].vmax) + 1
            sizes[int(u.src[0].arg)] = max(sizes.get(int(u.src[0].arg), 1), n)
        elif u.op is Ops.DEFINE_VAR:
            vals[str(u.arg[0])] = int(u.arg[2])
    if not params or sum(sizes.get(i, 1) * dt.itemsize for i, dt in params.items()) > MAX_SCRATCH_BYTES:
        return None
    rng = np.random.default_rng(seed)
    dts = [params.get(i, dtypes.uint8) for i in range(max(params) + 1)]
    initial = [_random_bytes(dt, sizes.get(i, 1), rng) for i, dt in enumerate(dts)]
    ties = [_random_bytes(dt, sizes.get(i, 1), rng, ties=True) for i, dt in enumerate(dts)]
    handles = [device.allocator.alloc(len(data)) for data in initial]
    scratch = Scratch(device, dts, handles, initial, vals, ties)
    scratch.reset()
    return scratch


def free_scratch(scratch: Scratch) -> None:
    for h, data in zip(scratch.handles, scratch.initial):
        scratch.device.allocator.free(h, len(data))


# ---- compiling and timing candidates ----
@dataclass
class Candidate:
    opts: list[Opt]
    applied: UOp  # the AST with `opts` applied (for the next step's actions and for dropping duplicates)
    seconds: float = math.inf
    program: CompiledProgram | None = None


def _render(base: UOp, device: CompiledDevice, opts: list[Opt]) -> tuple[list[UOp], str]:
    uops = full_rewrite(base, device.renderer, opts)
    return uops, device.renderer.render(_kernel_name(base), uops)


def _load(device: CompiledDevice, name: str, uops: list[UOp], src: str, lib: bytes) -> CompiledProgram:
    if type(device).build is CompiledDevice.build:
        raw = device.program_factory(name, lib)  # the bytes compiled on the pool; don't compile them again
    else:
        raw = device.build(name, uops, src)  # a device that builds its own way (PYTHON, WEBGPU)
    return CompiledProgram(device, raw, program_info(name, uops, src))


def compile_all(base: UOp, device: CompiledDevice, cands: list[Candidate]) -> list[tuple[Candidate, CompiledProgram]]:
    """Render each candidate here (Python) while the compile pool (`submit_compile`) compiles the ones already
    rendered; a candidate that fails to render, compile or load is dropped."""
    pending: list[tuple[Candidate, list[UOp], str, Future[bytes]]] = []
    start = time.perf_counter()
    for c in cands:
        try:
            uops, src = _render(base, device, c.opts)
        except NOT_APPLICABLE as e:  # an action the pipeline refuses here: not a candidate
            _dropped(c, e)
            continue
        except Exception as e:
            _crashed(e, c.opts, "rendering")
            continue
        pending.append((c, uops, src, submit_compile(device.compiler, src)))
    rendered = time.perf_counter()
    stats.render_s += rendered - start
    out = []
    for c, uops, src, fut in pending:
        try:
            prg = _load(device, _kernel_name(base), uops, src, fut.result())
        except NOT_APPLICABLE as e:  # source the compiler rejects (too many registers, ...)
            _dropped(c, e)
            continue
        except Exception as e:
            _crashed(e, c.opts, "compiling and loading")
            continue
        stats.compiled += 1
        c.program = prg
        out.append((c, prg))
    stats.compile_wait_s += time.perf_counter() - rendered
    return out


def _dropped(c: Candidate, e: Exception) -> None:
    if DEBUG.value >= 5:
        print(f"BEAM drops {_opts_text(c.opts)}: {type(e).__name__}: {e}")


def time_program(prg: CompiledProgram, scratch: Scratch, runs: int, cutoff_s: float) -> float:
    """Best of `runs` launches on the scratch buffers; stops repeating once a launch is slower than `cutoff_s`."""
    best = math.inf
    first = time.perf_counter()
    for _ in range(runs):
        start = time.perf_counter()
        elapsed = prg(scratch.handles, scratch.vals, wait=True)
        prg.device.synchronize()
        seconds = elapsed if elapsed is not None else time.perf_counter() - start
        best = min(best, seconds)
        if seconds > cutoff_s:
            break
    stats.timed += 1
    stats.run_s += time.perf_counter() - first
    return best


def _time_all(
    base: UOp,
    device: CompiledDevice,
    cands: list[Candidate],
    scratch: Scratch,
    knobs: SearchKnobs,
    best: float = math.inf,
    seeds: bool = False,
) -> list[Candidate]:
    """Compile all (in parallel), then time one at a time (nothing else compiling meanwhile). `best` is the fastest
    time known so far: a launch slower than 3x the fastest ends that candidate's timing early; one slower than
    BEAM_TIMEOUT_SEC drops the candidate (not a seed: a slow kernel is still searched from the heuristic)."""
    programs = compile_all(base, device, cands)
    timed = []
    for c, prg in programs:
        try:
            c.seconds = time_program(prg, scratch, knobs.runs, min(knobs.timeout_s, 3 * best))
        except Exception as e:  # a program that compiled but fails to run: a bug of codegen or the device
            _crashed(e, c.opts, "running")
            continue
        if c.seconds > knobs.timeout_s and not seeds:
            continue
        best = min(best, c.seconds)
        timed.append(c)
    return timed


def _apply_all(ast: UOp, opts: list[Opt], renderer: Renderer) -> UOp:
    return apply_opts(ast, opts, renderer)  # TC (the heuristic's tensor cores) needs the renderer


def _search(
    base: UOp, device: CompiledDevice, width: int, knobs: SearchKnobs
) -> tuple[list[Opt], dict[str, Any]] | None:
    start = time.perf_counter()
    scratch = make_scratch(base, device)
    if scratch is None:
        return None
    stats.searches += 1
    try:
        return _search_with(base, device, width, knobs, scratch, start)
    finally:
        free_scratch(scratch)


def _search_with(
    base: UOp,
    device: CompiledDevice,
    width: int,
    knobs: SearchKnobs,
    scratch: Scratch,
    start: float,
) -> tuple[list[Opt], dict[str, Any]] | None:
    before = (stats.render_s, stats.compile_wait_s, stats.run_s)
    heur = heuristic(base, device.renderer)
    heur_c = Candidate(heur, _apply_all(base, heur, device.renderer))
    seeds = [heur_c]  # timed first: its time cuts off a slow start from no actions after one launch
    if (cut := next((i for i, o in enumerate(heur) if o.op == "PACK"), 0)) > 0:
        # no action may follow a PACK (see Opt), so the heuristic's own entry cannot grow: search from its actions
        # before the PACK too, where PACK is again one of the candidate actions
        seeds.append(Candidate(heur[:cut], _apply_all(base, heur[:cut], device.renderer)))
    if heur:
        seeds.append(Candidate([], base))
    seen = {c.applied for c in seeds}
    beam = _keep(_time_all(base, device, seeds, scratch, knobs, seeds=True), width)
    if heur_c.program is None or not beam:  # the heuristic's own program did not build: nothing to compare with
        return None
    tried = len(seeds)
    for step in range(knobs.max_steps):
        fresh: list[Candidate] = []
        for entry in beam:
            for action in candidates(entry.applied, device.renderer):
                try:
                    applied = _apply_all(entry.applied, [action], device.renderer)  # TC needs the renderer
                except OptError:
                    continue  # not legal here
                except Exception as e:
                    _crashed(e, [*entry.opts, action], "applying the action")
                    continue
                if applied in seen or _lanes(applied) > knobs.lanes_max:
                    continue
                seen.add(applied)
                fresh.append(Candidate([*entry.opts, action], applied))
        if not fresh:
            break
        tried += len(fresh)
        timed = _time_all(base, device, fresh, scratch, knobs, beam[0].seconds)
        merged = _keep(beam + timed, width)
        if DEBUG.value >= 3:
            print(
                f"BEAM step {step}: {len(fresh)} new, best {merged[0].seconds * 1e6:.1f} us "
                f"{_opts_text(merged[0].opts)}"
            )
        if merged[0].seconds >= beam[0].seconds:
            beam = merged
            break  # nothing faster this step
        beam = merged
    chosen = final_pick(base, beam, heur_c, scratch, knobs)
    heur_s = heur_c.seconds
    record = {"heuristic_s": _finite(heur_s), "chosen_s": _finite(chosen.seconds), "tried": tried}
    if DEBUG.value >= 2:
        print(
            f"BEAM {_kernel_name(base):32s} {heur_s * 1e6:9.1f} us -> {chosen.seconds * 1e6:9.1f} us "
            f"({heur_s / chosen.seconds if chosen.seconds else 0:.2f}x) with {_opts_text(chosen.opts)}, "
            f"{tried} tried in {time.perf_counter() - start:.1f} s (render {stats.render_s - before[0]:.1f}, "
            f"compile wait {stats.compile_wait_s - before[1]:.1f}, runs {stats.run_s - before[2]:.1f})"
        )
    return chosen.opts, record


def _keep(cands: list[Candidate], width: int) -> list[Candidate]:
    """The `width` fastest, less any over 3x slower than the fastest (not worth expanding: their children cost
    seconds to time and rarely catch up within the step limit)."""
    ranked = sorted(cands, key=lambda c: c.seconds)[:width]
    return [c for c in ranked if c is ranked[0] or c.seconds <= 3 * ranked[0].seconds]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _opts_text(opts: list[Opt]) -> str:
    return "[" + ", ".join(map(str, opts)) + "]"


# ---- verification ----
def verify(base: UOp, device: CompiledDevice, opts: list[Opt], reference: list[Opt], scratch: Scratch) -> bool:
    """Run the program for `opts` and the one for `reference` from the same random buffer contents, then from the
    same contents with ties (see `Scratch`); every buffer either writes must come out the same (floats within a
    tolerance that allows reordered sums)."""
    a, b = (_build(base, device, o) for o in (opts, reference))
    return same_outputs(a, b, scratch)


def _build(base: UOp, device: CompiledDevice, opts: list[Opt]) -> CompiledProgram:
    uops, src = _render(base, device, opts)
    return _load(device, _kernel_name(base), uops, src, device.compiler.compile(src))


def same_outputs(prg: CompiledProgram, reference: CompiledProgram, scratch: Scratch) -> bool:
    """Whether both programs write the same outputs from the scratch's random contents and from its ties."""
    for contents in (scratch.initial, scratch.ties):
        results = []
        for p in (prg, reference):
            scratch.reset(contents)
            p(scratch.handles, scratch.vals, wait=True)
            p.device.synchronize()
            results.append({i: scratch.read(i) for i in p.info.outs})
        got, want = results
        if got.keys() != want.keys() or not all(_close(got[i], want[i], scratch.dtypes[i]) for i in want):
            scratch.reset()
            return False
    scratch.reset()
    return True


def final_pick(base: UOp, beam: list[Candidate], heur: Candidate, scratch: Scratch, knobs: SearchKnobs) -> Candidate:
    """The search's result: the finalists (the final beam and the heuristic's program, which is always one) whose
    outputs agree with the heuristic's (see `verify`) are timed again in turn, best of at least CONFIRM_RUNS launches
    each without a cutoff, so a candidate the search timed fast once by chance, or a machine that got busier, cannot
    pick a slower kernel; the fastest wins, one other than the heuristic only by CONFIRM_MARGIN. Updates their
    times."""
    device = scratch.device
    assert heur.program is not None  # _search_with returns early when the heuristic's program did not build
    finalists = [heur]
    for c in beam:
        if c is heur or c.applied is heur.applied:
            continue
        try:
            prg = c.program or _build(base, device, c.opts)
            agrees = same_outputs(prg, heur.program, scratch)
        except NOT_APPLICABLE as e:
            _dropped(c, e)
            continue
        except Exception as e:
            _crashed(e, c.opts, "checking its outputs")
            continue
        if not agrees:
            stats.rejected += 1
            if DEBUG.value >= 1:
                print(f"BEAM {_kernel_name(base)}: {_opts_text(c.opts)} disagrees with the heuristic; dropped it")
            continue
        c.program = prg
        finalists.append(c)
    if len(finalists) == 1:
        return heur
    best = [math.inf] * len(finalists)
    for _ in range(max(knobs.runs, CONFIRM_RUNS)):
        for i, c in enumerate(finalists):  # in turn: a slow spell of the machine hits every finalist alike
            assert c.program is not None
            best[i] = min(best[i], time_program(c.program, scratch, 1, math.inf))
    stats.retimed += len(finalists)
    for c, seconds in zip(finalists, best):
        c.seconds = seconds
    winner = min(finalists, key=lambda c: c.seconds)
    return winner if winner.seconds < heur.seconds * (1 - CONFIRM_MARGIN) else heur


def _close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], dt: DType) -> bool:
    if not dtypes.is_float(dt) or to_np_dtype(dt) is None:
        return bool(np.array_equal(got, want))
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    finite = np.isfinite(w)
    scale = float(np.abs(w[finite]).max()) if finite.any() else 1.0
    tol = 2e-2 if dt.itemsize <= 2 else 1e-3
    return bool(np.allclose(g, w, rtol=tol, atol=tol * max(scale, 1.0), equal_nan=True))
