"""Small shared helpers and the one registry of environment knobs.

Every environment variable xgrad reads is declared here once with `knob(...)`: name, default (its type is the
knob's type), one line of help, and what it affects (an `Effect`). Every cache key, in memory and on disk, takes the
knobs it depends on from `knobs_key(*effects)`, so a knob changed with `Context` never meets a result cached under
its old value.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import gc
import getpass
import math
import os
import pathlib
import platform
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from xgrad.errors import KnobError

T = TypeVar("T")
KnobValue = TypeVar("KnobValue", int, str, float)


def _parse(name: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            return raw.lower() not in ("", "0", "false", "no", "off")
        return type(default)(raw)
    except ValueError:
        raise KnobError(
            f"environment variable {name}={raw!r} is not a valid {type(default).__name__}; "
            f"unset it or give a value like {default!r}"
        ) from None


class ContextVar(Generic[KnobValue]):
    """A knob: initial value from the environment (typed like its default), changeable with `Context`."""

    def __init__(self, key: str, default: KnobValue):
        self.key = key
        self.default: KnobValue = default
        raw = os.environ.get(key)
        self.value: KnobValue = default if raw is None else _parse(key, raw, default)

    def __setattr__(self, name: str, value: Any) -> None:
        # reads stay plain attribute reads (hot paths read knobs); a write forgets the cache keys built from values
        object.__setattr__(self, name, value)
        if name == "value":
            _keys.clear()

    def __bool__(self) -> bool:
        return bool(self.value)

    def __ge__(self, x: Any) -> bool:
        return bool(self.value >= x)

    def __gt__(self, x: Any) -> bool:
        return bool(self.value > x)

    def __le__(self, x: Any) -> bool:
        return bool(self.value <= x)

    def __lt__(self, x: Any) -> bool:
        return bool(self.value < x)

    def __eq__(self, x: object) -> bool:
        return bool(self.value == x)

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"{self.key}={self.value!r}"


class Effect(enum.IntFlag):
    """What a knob changes, and so which cache keys hold its value (`knobs_key`). A cache asks for the union of what
    its entries depend on (`Effect.CODEGEN | Effect.COMPILE`); an int flag hashes at C speed on hot paths."""

    NONE = 0  # acts before any cache (on the tensor graph, which every key holds) or on no result: in no key
    SCHEDULE = 1  # the kernels and copies a graph becomes: the schedule cache's key
    CODEGEN = 2  # the source generated for a kernel AST: the keys of every program cache and of BEAM's
    COMPILE = 4  # how a source becomes a binary: the program caches' keys and the compiler's own disk cache
    RUNTIME = 8  # how programs are run (threads, JIT replay, buffer reuse): read at each use, in no key


@dataclass(frozen=True)
class Knob:
    name: str
    default: Any
    help: str
    affects: Effect
    var: ContextVar[Any]


KNOBS: dict[str, Knob] = {}
_keys: dict[Effect, str] = {}  # knobs_key's answers; emptied by every knob write and declaration


def knob(name: str, default: KnobValue, help: str, affects: Effect) -> ContextVar[KnobValue]:
    """Declare an environment knob once, with what it affects; returns its ContextVar."""
    return _declare(ContextVar(name, default), help, affects)


V = TypeVar("V", bound=ContextVar[Any])


def _declare(var: V, help: str, affects: Effect) -> V:
    assert var.key not in KNOBS, f"knob {var.key} declared twice"
    KNOBS[var.key] = Knob(var.key, var.default, help, affects, var)
    _keys.clear()
    return var


@dataclass(frozen=True)
class DeviceTarget:
    """One entry of the DEV knob, `[INTERFACE+]TYPE[:index][:RENDERER[:ARCH]]`: "MOCK+AMD:HIP:gfx1100" has interface
    "MOCK", device "AMD", renderer "HIP", arch "gfx1100". Absent parts are "" (so `DEV.arch.startswith(...)` works)."""

    interface: str
    device: str  # the device name without the interface: "AMD:HIP:gfx1100", what Device.DEFAULT opens
    type: str  # "AMD"
    index: int
    renderer: str
    arch: str


@functools.cache
def parse_dev(raw: str) -> tuple[DeviceTarget, ...]:
    """The `;`-separated targets of a DEV value (empty for ""). The device part is checked by `Device`, not here."""
    targets = []
    for entry in (e.strip() for e in raw.split(";")):
        if not entry:
            continue
        interface, plus, device = entry.rpartition("+")
        if plus and not device:
            raise KnobError(f"DEV={raw!r} names an interface but no device after '+'; write it like MOCK+AMD")
        typ, *parts = device.split(":")
        index = int(parts.pop(0)) if parts and parts[0].isdigit() else 0
        renderer = parts[0] if parts else ""
        arch = ":".join(parts[1:])  # AMD targets carry ':' (gfx90a:xnack-)
        targets.append(DeviceTarget(interface.upper(), device, typ.upper(), index, renderer, arch))
    return tuple(targets)


class DeviceKnob(ContextVar[str]):
    """The DEV knob: a string knob (`DEV.value`, `Context(DEV=...)`) that also reads as its parsed first target, as
    tinygrad code reads it: `DEV.interface` ("MOCK" for "MOCK+AMD"), `DEV.device` (the name without interface),
    `DEV.type`, `DEV.renderer`, `DEV.arch` ("" where absent); `DEV.targets` holds every `;`-separated entry."""

    @property
    def targets(self) -> tuple[DeviceTarget, ...]:
        return parse_dev(self.value)

    def _first(self) -> DeviceTarget:
        targets = parse_dev(self.value)
        return targets[0] if targets else DeviceTarget("", "", "", 0, "", "")

    @property
    def interface(self) -> str:
        return self._first().interface

    @property
    def device(self) -> str:
        return self._first().device

    @property
    def type(self) -> str:
        return self._first().type

    @property
    def renderer(self) -> str:
        return self._first().renderer

    @property
    def arch(self) -> str:
        return self._first().arch


def changed_knobs() -> dict[str, Any]:
    """Knobs whose current value differs from the default (shown by `xgrad info`)."""
    return {k.name: k.var.value for k in KNOBS.values() if k.var.value != k.default}


def knobs_key(effects: Effect) -> str:
    """The one cache-key fragment of knobs: `NAME=value` of every knob declared to affect any of `effects`, by name.
    Each cache passes what its entries depend on (the schedule cache SCHEDULE; program caches CODEGEN | COMPILE; a
    compiler's cache COMPILE). The string is remembered until a knob changes, so a hot path pays one dict lookup."""
    if (key := _keys.get(effects)) is None:
        chosen = sorted(k.name for k in KNOBS.values() if k.affects & effects)
        key = _keys[effects] = ",".join(f"{name}={KNOBS[name].var.value!r}" for name in chosen)
    return key


class Context:
    """Temporarily set knobs by name: `with Context(DEBUG=2): ...`, also usable as a decorator."""

    def __init__(self, **kwargs: Any):
        unknown = [k for k in kwargs if k not in KNOBS]
        if unknown:
            raise KnobError(f"unknown knob(s) {unknown}; known knobs: {sorted(KNOBS)}")
        self.kwargs = kwargs
        self.saved: list[dict[str, Any]] = []

    def __enter__(self) -> Context:
        self.saved.append({k: KNOBS[k].var.value for k in self.kwargs})
        for k, v in self.kwargs.items():
            KNOBS[k].var.value = v
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.pop().items():
            KNOBS[k].var.value = v

    def __call__(self, fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            with Context(**self.kwargs):
                return fn(*args, **kwargs)

        return wrapper


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
    """A cached plain environment read, typed like `default` (for rarely used switches)."""
    raw = os.environ.get(key)
    return default if raw is None else _parse(key, raw, default)


# ---- the knobs (keep this list short; each line is the documentation) ----
DEBUG = knob(
    "DEBUG", 0, "1 kernel counts, 2 per-kernel time/GFLOPS/GB/s, 3 schedule, 4 generated source, 5+ graphs", Effect.NONE
)
DEV = _declare(
    DeviceKnob("DEV", ""),
    "default device [INTERFACE+]TYPE[:index][:RENDERER[:ARCH]], e.g. CPU, NULL:CUDA:sm_90 (compile only), MOCK+NV",
    Effect.NONE,
)
BEAM = knob("BEAM", 0, "beam width for kernel optimization search (0 = heuristics)", Effect.CODEGEN)
BEAM_MAX_STEPS = knob("BEAM_MAX_STEPS", 8, "most actions BEAM adds to a kernel (steps of the search)", Effect.CODEGEN)
BEAM_UPCAST_MAX = knob(
    "BEAM_UPCAST_MAX", 256, "most straight-line lanes a BEAM candidate's loop body may hold", Effect.CODEGEN
)
BEAM_TIMEOUT_SEC = knob(
    "BEAM_TIMEOUT_SEC", 10.0, "BEAM drops a candidate whose launch takes longer (seconds)", Effect.CODEGEN
)
BEAM_RUNS = knob("BEAM_RUNS", 3, "launches BEAM times each candidate (best of); its finalists get more", Effect.CODEGEN)
JITBEAM = knob(
    "JITBEAM", -1, "BEAM width for the kernels a TinyJit captures (-1 = BEAM's); reaches keys as BEAM", Effect.NONE
)
IGNORE_BEAM_CACHE = knob(
    "IGNORE_BEAM_CACHE", 0, "1 = search again even when the BEAM disk cache has a result", Effect.NONE
)
PARALLEL = knob(
    "PARALLEL",
    0,
    "compile workers: BEAM's candidates, a schedule's new kernels (0 = the cores this process may use)",
    Effect.RUNTIME,
)
NOOPT = knob("NOOPT", 0, "1 = skip kernel optimizations (plain loops)", Effect.CODEGEN)
TRANSCENDENTAL = knob(
    "TRANSCENDENTAL",
    1,
    "1 software exp2/log2/sin only where the renderer lacks them, 2 always (to test them)",
    Effect.CODEGEN,
)
JIT = knob("JIT", 1, "0 turns TinyJit off, 1 captures and replays", Effect.RUNTIME)
DEFAULT_FLOAT = knob("DEFAULT_FLOAT", "float32", "dtype of Python floats and float results of int ops", Effect.NONE)
DEFAULT_INT = knob("DEFAULT_INT", "int32", "dtype of Python ints", Effect.NONE)
TRAINING = knob("TRAINING", 0, "training mode: optimizer steps, dropout, BatchNorm statistics", Effect.NONE)
OPTIM_DTYPE = knob("OPTIM_DTYPE", "float32", "dtype of optimizer state (momentum, Adam moments)", Effect.NONE)
CONST_LR = knob("CONST_LR", 0, "1 = the learning rate is a constant in the update kernels, not a buffer", Effect.NONE)
SPEC = knob(
    "SPEC", 1, "1 check the IR at stage boundaries and let search crashes raise, 0 skip and count them", Effect.NONE
)
REWRITE_STACK_LIMIT = knob(
    "REWRITE_STACK_LIMIT", 250000, "graph_rewrite's stack limit (steps: 8x), then it raises", Effect.NONE
)
CACHELEVEL = knob(
    "CACHELEVEL", 2, "0 disables the on-disk caches (compiled binaries, rendered programs, BEAM results)", Effect.NONE
)
XGRAD_CACHE_DIR = knob("XGRAD_CACHE_DIR", "", "directory of the on-disk caches (default ~/.cache/xgrad)", Effect.NONE)
SCACHE = knob("SCACHE", 1, "0 disables the in-memory schedule cache", Effect.NONE)
FUSE_OPTIM = knob("FUSE_OPTIM", 0, "1 = optimizers update all parameters as one flat vector by default", Effect.NONE)
SPLIT_REDUCEOP = knob(
    "SPLIT_REDUCEOP", 1, "1 splits a big reduction to few outputs into two kernels (parallel first)", Effect.SCHEDULE
)
MAX_KERNEL_BUFFERS = knob(
    "MAX_KERNEL_BUFFERS", 0, "most buffers one kernel may bind (0 = the device's own limit)", Effect.SCHEDULE
)
NO_MEMORY_PLANNER = knob("NO_MEMORY_PLANNER", 0, "1 disables buffer reuse inside a schedule", Effect.RUNTIME)
DISALLOW_BROADCAST = knob("DISALLOW_BROADCAST", 0, "1 makes implicit broadcasting an error", Effect.NONE)
CC = knob("CC", "", "C compiler for the CPU backend (default: clang if present, else gcc)", Effect.COMPILE)
CPU_MARCH = knob(
    "CPU_MARCH",
    "native",
    "-march of the CPU backend's kernels, e.g. x86-64-v3 (AVX2) on an AVX-512 host",
    Effect.COMPILE,
)
NUM_CPU_THREADS = knob("NUM_CPU_THREADS", 0, "CPU worker threads (0 = the cores this process may use)", Effect.RUNTIME)
XGRAD_DISABLE_PLUGIN_AUTOLOAD = knob("XGRAD_DISABLE_PLUGIN_AUTOLOAD", 0, "1 = load no entry-point plugins", Effect.NONE)
XGRAD_PLUGINS = knob("XGRAD_PLUGINS", "", "comma list of modules to load as plugins explicitly", Effect.NONE)
XGRAD_BLOCK_PLUGINS = knob(
    "XGRAD_BLOCK_PLUGINS",
    "",
    "comma list of plugins not to load: entry-point, module or distribution names",
    Effect.NONE,
)
XGRAD_PLUGIN_OVERRIDE = knob(
    "XGRAD_PLUGIN_OVERRIDE",
    "",
    "comma list of plugins whose devices and renderers win name clashes with xgrad's bundled ones (e.g. CPU)",
    Effect.NONE,
)
MOCKGPU = knob(
    "MOCKGPU",
    0,
    "1 runs the NV and AMD backends on in-process mocks of their driver libraries; their emulators (a PTX interpreter,"
    " an RDNA3 emulator) execute the kernels, so the whole runtime path runs without a GPU",
    Effect.COMPILE,  # the mock loads PTX where a GPU would load a cubin: the binaries differ
)
RING = knob(
    "RING", 1, "multi-device allreduce: 0 never ring, 1 ring above RING_ALLREDUCE_THRESHOLD, 2 always", Effect.SCHEDULE
)
RING_ALLREDUCE_THRESHOLD = knob(
    "RING_ALLREDUCE_THRESHOLD", 256_000, "elements from which allreduce uses the ring", Effect.SCHEDULE
)
DIST_TIMEOUT = knob(
    "DIST_TIMEOUT", 300.0, "seconds a collective across processes waits, then names the ranks gone", Effect.NONE
)
DIST_BUCKET_MB = knob("DIST_BUCKET_MB", 25.0, "DataParallel: MB of gradients averaged by one collective", Effect.NONE)
# tinygrad's knobs that have nothing to act on in xgrad: declared so that tinygrad code setting or importing them runs
# (`Context(IMAGE=0)`, `from xgrad.helpers import CHECK_OOB`); each help line says why it does nothing
IMAGE = knob("IMAGE", 0, "tinygrad's Qualcomm image/texture path; no effect: xgrad has no image dtypes", Effect.NONE)
CHECK_OOB = knob(
    "CHECK_OOB", 0, "tinygrad's z3 proof of index bounds; no effect: xgrad does not run z3 on kernels", Effect.NONE
)
EMULATED_DTYPES = knob(
    "EMULATED_DTYPES",
    "",
    "tinygrad's comma list of dtypes to emulate; no effect: xgrad emulates every dtype a renderer lacks (bfloat16, "
    "fp8) and only those, see renderer.supported_dtypes()",
    Effect.NONE,
)
ALLREDUCE_CAST = knob(
    "ALLREDUCE_CAST",
    1,
    "tinygrad's allreduce in bf16/half for upcast values; no effect: xgrad's allreduce sums in the tensor's dtype",
    Effect.NONE,
)

# ---- platform constants tinygrad code imports from helpers ----
OSX = platform.system() == "Darwin"
WIN = sys.platform == "win32"
CI = os.environ.get("CI", "") != ""


class GlobalCounters:
    """Totals since the last `reset()`: kernels run, operations, bytes moved, kernel seconds (DEBUG>=2); `mem_used`
    is the bytes of device memory allocated now (all devices; per device in `mem_used_per_device`), which `reset()`
    keeps, as tinygrad's does."""

    global_ops: int = 0
    global_mem: int = 0
    time_sum_s: float = 0.0
    kernel_count: int = 0
    mem_used: int = 0
    mem_used_per_device: dict[str, int] = {}  # noqa: RUF012 (a class-level counter, like the ints)

    @staticmethod
    def reset() -> None:
        GlobalCounters.global_ops = GlobalCounters.global_mem = GlobalCounters.kernel_count = 0
        GlobalCounters.time_sum_s = 0.0


def temp(name: str, append_user: bool = False) -> str:
    """A path named `name` in the system's temporary directory (with `.<user>` appended when `append_user`)."""
    return str(pathlib.Path(tempfile.gettempdir()) / (f"{name}.{getpass.getuser()}" if append_user else name))


def polyN(x: T, coefficients: Sequence[float]) -> T:  # noqa: N802 (the tinygrad spelling)
    """The polynomial with `coefficients` (highest power first) at `x`, by Horner's rule; `x` may be a number, a
    Tensor or a UOp.

    >>> polyN(2.0, [1.0, 0.0, -3.0])
    1.0
    """
    acc: Any = 0.0
    for c in coefficients:
        acc = acc * x + c
    return acc  # type: ignore[no-any-return]


class disable_gc(contextlib.ContextDecorator):  # noqa: N801 (the tinygrad spelling)
    """Turn Python's cyclic garbage collector off inside a `with` block or a decorated function, and back on after
    (only if it was on)."""

    def __enter__(self) -> disable_gc:
        self._was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            gc.enable()


def cache_dir() -> pathlib.Path:
    base = XGRAD_CACHE_DIR.value or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "xgrad"
    )
    path = pathlib.Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either no file or the whole file (parallel processes share caches)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def disk_cached(folder: str, name: str, build: Callable[[], bytes]) -> bytes:
    """`<cache dir>/<folder>/<name>` when it is there, else `build()` written there (atomically) and returned; with
    `CACHELEVEL=0`, `build()` alone. The compilers' binary caches: the caller's `name` hashes all the output depends
    on."""
    if CACHELEVEL.value <= 0:
        return build()
    path = cache_dir() / folder / name
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    out = build()
    write_atomic(path, out)
    return out


# ---- small generic helpers ----
class KeyedRef(weakref.ref[T]):
    """A weak reference that carries the key of the table entry holding it, for a callback shared by the whole table
    (set after creation: a subclass with its own `__init__`, like `weakref.KeyedRef`, costs a Python-level call per
    reference, and a `functools.partial` callback per entry twice that)."""

    __slots__ = ("key",)
    key: Any


def prod(xs: Iterable[Any], start: Any = 1) -> Any:
    return functools.reduce(lambda a, b: a * b, xs, start)


def all_same(xs: Sequence[Any]) -> bool:
    return all(x == xs[0] for x in xs)


def dedup(xs: Iterable[T]) -> list[T]:
    return list(dict.fromkeys(xs))


def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
    return [x for xs in xss for x in xs]


def argsort(xs: Sequence[Any]) -> list[int]:
    return sorted(range(len(xs)), key=xs.__getitem__)


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceildiv(a, b) * b


def make_tuple(x: int | Sequence[int], n: int) -> tuple[int, ...]:
    return (x,) * n if isinstance(x, int) else tuple(x)


def argfix(*x: Any) -> tuple[Any, ...]:
    """Accept both f(1, 2) and f((1, 2)) / f([1, 2])."""
    if x and x[0].__class__ in (tuple, list):
        if len(x) != 1:
            raise ValueError(f"pass the sizes either as one sequence or as separate arguments, not both: {x}")
        return tuple(x[0])
    return x


def is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def log2_int(x: int) -> int:
    return int(math.log2(x))


def pairwise(xs: Sequence[T]) -> Iterator[tuple[T, T]]:
    return zip(xs, xs[1:])
