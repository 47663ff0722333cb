"""TinyJit: run a function once, capture the kernels it runs the second time, replay them afterwards.

Replay launches the captured programs on the new inputs' buffers directly: no graph building, no scheduling, no
compiling. Inputs are the Tensors among the arguments (and one level inside lists, tuples and dicts), positional
ones first, then keyword ones by name (so the order of keyword arguments does not matter); lazy ones are realized
first, and on replay each must match the capture in shape, dtype, device and view, and be passed the same way.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from xgrad.buffer import Buffer
from xgrad.device import Device
from xgrad.engine.capture import capturing, record, start_capture, stop_capture
from xgrad.engine.memory import share_buffers
from xgrad.engine.multi import input_buffers
from xgrad.engine.realize import all_tensors, run_transfer
from xgrad.engine.schedule import ScheduleItem
from xgrad.errors import JitError, ShapeError
from xgrad.helpers import BEAM, DEBUG, JIT, JITBEAM, Context
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops, UOp, sint
from xgrad.uop.symshape import bound_values, graph_binds, rebind, unbind_graph

R = TypeVar("R")


@dataclass(frozen=True)
class InputSpec:
    """What a captured input looked like: replays must match it."""

    shape: tuple[sint, ...]  # symbolic sizes hold the unbound variables
    dtype: Any
    device: str
    view: UOp  # the input's graph with its buffer replaced by a placeholder
    plain: bool  # the whole buffer, only reshaped


@dataclass
class _Step:
    item: ScheduleItem
    program: Any  # compiled program, None for copies and collectives
    slots: tuple[int | None, ...]  # per buffer: the input it comes from, or None (captured buffer)
    var_vals: dict[str, int]
    handles: list[Any] | None = None  # kernels: the captured buffers' handles, input positions filled per replay
    from_inputs: tuple[tuple[int, int], ...] = ()  # (position among the handles, input index)


def _plain_int_buffer(u: UOp) -> bool:
    """A whole single buffer (maybe reshaped) with a concrete shape: no view and no variable to check or unbind."""
    if u.op is Ops.RESHAPE:
        return u.src[0].op is Ops.BUFFER and all(type(s) is int for s in u.arg)
    return u.op is Ops.BUFFER


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The arguments in the order inputs are numbered: positional ones, then keyword ones sorted by name."""
    return (*args, *(kwargs[k] for k in sorted(kwargs))) if kwargs else args


def _arg_names(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int | str]:
    """How the Tensor arguments were passed (position or keyword name), as tinygrad compares them on replay."""
    names: list[int | str] = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    return names + sorted(k for k, a in kwargs.items() if isinstance(a, Tensor))


def _input_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    found: list[Tensor] = []
    for a in _arguments(args, kwargs):
        inner = a.values() if isinstance(a, dict) else a if isinstance(a, (list, tuple)) else (a,)
        found.extend(x for x in inner if isinstance(x, Tensor))
    return found


_deref: Callable[[weakref.ref[UOp]], UOp | None] = weakref.ref.__call__
_uop_of = operator.attrgetter("uop")


def _watched_uops(jit: TinyJit[Any], args: tuple[Any, ...]) -> list[weakref.ref[UOp]]:
    """Weak refs to the Tensor args' UOps for `jit._last`. When one of them dies, `_last` goes if it still holds
    these refs: its buffer handles would otherwise keep a freed input's memory until the next replay. (The callback
    holds the jit weakly and the list by id: no reference cycle.)"""
    owner = weakref.ref(jit)
    refs: list[weakref.ref[UOp]] = []
    key = id(refs)

    def dropped(_: weakref.ref[UOp]) -> None:
        if (j := owner()) is not None and j._last is not None and id(j._last[0]) == key:
            j._last = None

    refs.extend(weakref.ref(a.uop, dropped) for a in args)
    return refs


def _same_uops(refs: list[weakref.ref[UOp]], args: tuple[Any, ...]) -> bool:
    """Whether `args` are Tensors whose UOps are the live referents of `refs`, in order (a dead ref never matches).
    Every replay of a step asks this: map over C callables runs no Python bytecode per argument."""
    return set(map(type, args)) <= {Tensor} and list(map(_deref, refs)) == list(map(_uop_of, args))


def _passes_variables(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a UOp (a bound Variable) is among the arguments (one level inside lists, tuples and dicts too)."""
    for a in _arguments(args, kwargs):
        inner = a.values() if isinstance(a, dict) else a if isinstance(a, (list, tuple)) else (a,)
        if any(isinstance(x, UOp) for x in inner):
            return True
    return False


def _bound_vars(args: tuple[Any, ...], kwargs: dict[str, Any], inputs: list[Tensor]) -> dict[str, int]:
    """Values of the bound Variables passed in: directly (one level inside lists, tuples and dicts too) or in the
    symbolic shapes of the input tensors. They are runtime values: a replay passes the new ones to the kernels."""
    binds: list[UOp] = []
    for a in _arguments(args, kwargs):
        inner = a.values() if isinstance(a, dict) else a if isinstance(a, (list, tuple)) else (a,)
        binds.extend(x for x in inner if isinstance(x, UOp) and x.op is Ops.BIND)
    binds.extend(graph_binds(t.uop for t in inputs if not _plain_int_buffer(t.uop)))
    try:
        return bound_values(binds)
    except ShapeError as e:
        raise JitError(f"TinyJit arguments: {e}") from None


def _lazy(u: UOp) -> bool:
    """An input still to be computed (a realize gives it a buffer); a constant stays one (see `_spec_of`)."""
    return u.op is Ops.ASSIGN or (u.base.op is not Ops.BUFFER and u.base.op is not Ops.CONST)


def _spec_of(t: Tensor, index: int) -> InputSpec:
    if t.uop.base.op is not Ops.BUFFER or t.uop.op is Ops.ASSIGN:
        raise JitError(
            f"TinyJit input {index} is not a buffer (it is a {t.uop.base.op.name}); "
            "pass .contiguous().realize() of a constant, or a .clone()"
        )
    u = unbind_graph([t.uop])[0][0]  # symbolic views compare without their values
    placeholder = UOp(Ops.BUFFER, t.dtype, u.base.src, (-1, u.base.arg[1]))
    view = _replace_base(u, placeholder)
    plain = u.plain_buffer
    assert u.shape is not None
    return InputSpec(tuple(u.shape), t.dtype, t.device, view, plain)


def _replace_base(u: UOp, new: UOp) -> UOp:
    return new if u.op is Ops.BUFFER else u.replace(src=(_replace_base(u.src[0], new), *u.src[1:]))


def _returned_tensors(ret: Any, check: bool) -> list[Tensor]:
    """The Tensors in a jitted function's return value (inside lists, tuples and dicts too). With `check`, anything
    else but None raises: a replay returns the captured value, so a Python value in it would never change."""
    if isinstance(ret, Tensor):
        return [ret]
    if isinstance(ret, (list, tuple, dict)):
        return [t for x in (ret.values() if isinstance(ret, dict) else ret) for t in _returned_tensors(x, check)]
    if check and ret is not None:
        raise JitError(
            f"the jitted function returned a {type(ret).__name__}, not a Tensor: a replay returns what the capture "
            "returned, so it would never change; return Tensors (in lists, tuples or dicts) or None"
        )
    return []


def _swap_tensors(ret: Any, new: dict[int, Tensor]) -> Any:
    """`ret` (Tensors in lists, tuples and dicts) with the Tensors whose id is in `new` replaced."""
    if isinstance(ret, tuple) and hasattr(ret, "_fields"):  # a namedtuple
        return type(ret)(*(_swap_tensors(x, new) for x in ret))
    if isinstance(ret, (list, tuple)):
        return type(ret)(_swap_tensors(x, new) for x in ret)
    if isinstance(ret, dict):
        return {k: _swap_tensors(v, new) for k, v in ret.items()}
    return new.get(id(ret), ret)


def _written_slots(item: ScheduleItem) -> tuple[int, ...]:
    """The positions among `item.bufs` that it writes: the copy's (or collective's) destination, or the kernel's
    stored PARAMs (one for a scheduled kernel, several for a custom kernel with several outputs)."""
    if not item.is_kernel:
        return (0,)
    targets = [u.src[0] for u in item.ast.toposort if u.op is Ops.STORE and u.src[0].op is Ops.INDEX]
    stored = {t.src[0].arg for t in targets if t.src[0].op is Ops.PARAM}
    return tuple(sorted(stored)) or (0,)


def _prune(steps: list[_Step]) -> list[_Step]:
    """The steps that depend on an input (`TinyJit(prune=True)`): the others computed, during the capture, values
    that stay the same, so a replay skips them. A skipped step whose output buffer a kept step writes (the memory
    planner may have handed one buffer to both) is kept, or a replay would read the overwritten value."""
    needed: set[int] = set()
    kept = [False] * len(steps)
    for i, st in enumerate(steps):
        ids = {id(b) for b in st.item.bufs}
        if any(s is not None for s in st.slots) or not ids.isdisjoint(needed):
            kept[i] = True
            needed |= ids
    changed = True
    while changed:
        written = {id(st.item.bufs[j]) for st, k in zip(steps, kept) if k for j in _written_slots(st.item)}
        changed = False
        for i, st in enumerate(steps):
            if not kept[i] and any(id(st.item.bufs[j]) in written for j in _written_slots(st.item)):
                kept[i] = changed = True
    return [st for st, k in zip(steps, kept) if k]


def _batched(steps: list[_Step]) -> list[_Step | Callable[[list[Any], dict[str, int]], None]]:
    """The steps as replay runs them: consecutive kernels on a device that can launch a list of kernels in one call
    (an optional `batch(launches)` method of the device, e.g. the CPU's) become one such call; copies and the
    kernels of other devices stay steps."""
    runs: list[_Step | Callable[[list[Any], dict[str, int]], None]] = []
    group: list[_Step] = []

    def flush() -> None:
        batch = getattr(Device[group[0].item.device], "batch", None) if len(group) > 1 else None
        if batch is None:
            runs.extend(group)
        else:
            runs.append(batch([(st.program, st.handles, st.from_inputs, st.var_vals) for st in group]))
        group.clear()

    for st in steps:
        if group and (st.handles is None or st.item.device != group[0].item.device):
            flush()
        if st.handles is None:
            runs.append(st)
        else:
            group.append(st)
    if group:
        flush()
    return runs


def _held_buffers(ret: Any) -> set[int]:
    """Ids of the buffers a live tensor (or the returned value) reads: state the replays must keep to themselves."""
    held: set[int] = set()
    for t in [*all_tensors.members(), *_returned_tensors(ret, False)]:
        for n in t.uop.toposort:
            if n.op is Ops.BUFFER and (b := n.__dict__.get("buffer")) is not None:
                held.add(id(b))
    return held


def _share_intermediates(steps: list[_Step], held: set[int]) -> bool:
    """A replay keeps every captured buffer allocated, so without sharing a step's memory is the sum of all its
    intermediates (a language model's prefill: each layer's). Buffers that only carry values from one captured
    kernel to later ones (no input or output, held by no live tensor) share memory by lifetime (`share_buffers`).
    Single-device steps of kernels only, for now. Returns whether any buffer was replaced."""
    if len({st.item.device for st in steps}) != 1 or any(st.handles is None for st in steps):
        return False
    planned = share_buffers([st.item for st in steps], lambda b: id(b) not in held)
    changed = False
    for st, item in zip(steps, planned):
        if item is not st.item:
            st.item, changed = item, True
            st.handles = [b.handle if s is None else None for b, s in zip(item.bufs, st.slots)]
    return changed


def _copy_of(b: Buffer) -> Buffer:
    """A new buffer holding `b`'s values."""
    return Buffer(b.device, b.size, b.dtype).ensure_allocated().copyin(b.as_bytes())


@dataclass(frozen=True)
class CapturedLinear:
    """The captured steps in tinygrad's spelling (`captured.linear.src`): here ScheduleItems, not CALL UOps."""

    src: tuple[ScheduleItem, ...]


@dataclass(frozen=True)
class CapturedJit:
    """What a TinyJit captured (`jit.captured`, None before the capture): the returned value `ret`, the replayed
    steps, how the Tensor arguments were passed (`expected_names`: positions, then keyword names) and what each
    input looked like (`expected_input_info`)."""

    ret: Any
    steps: tuple[_Step, ...]
    expected_names: tuple[int | str, ...]
    expected_input_info: tuple[InputSpec, ...]

    @property
    def linear(self) -> CapturedLinear:
        """The replayed kernels and copies, in order (`len(jit.captured.linear.src)` counts them)."""
        return CapturedLinear(tuple(st.item for st in self.steps))


class TinyJit(Generic[R]):
    """Capture a function's kernels and replay them. `JIT=0` turns it off (the function just runs).

    The first call runs the function, the second captures the kernels it runs, later calls replay them. The returned
    Tensors (in lists, tuples and dicts too) are realized; returning anything else raises a JitError at the capture,
    as does a function that runs no kernel. `prune=True` (`@TinyJit(prune=True)` as a decorator) leaves out of the
    replay the kernels that do not depend on an input. `captured` is the `CapturedJit` (None before the capture).

    >>> from xgrad import Tensor
    >>> f = TinyJit(lambda a, b: (a * b + 1).realize())
    >>> for i in range(3): out = f(Tensor([1.0, 2.0]).realize(), Tensor([float(i), 1.0]).realize())
    >>> out.tolist(), len(f.captured.linear.src)
    ([3.0, 3.0], 1)
    """

    def __init__(self, fxn: Callable[..., R] | None = None, *, prune: bool = False):
        self.fxn = fxn
        self.prune = prune
        self.calls = 0
        self.steps: list[_Step] = []
        self.runs: list[_Step | Callable[[list[Any], dict[str, int]], None]] = []  # the steps, batched per device
        self.specs: tuple[InputSpec, ...] = ()
        self.names: list[int | str] = []  # how the Tensor arguments were passed at the capture
        self.result: R | None = None
        self.var_vals: dict[str, int] = {}  # the bound Variables of the capture (their values change per replay)
        self._fast = False  # see _capture
        self._written: set[int] = set()  # the captured buffers a replay writes (an input aliasing one is copied)
        self._returned_inputs: dict[int, int] = {}  # id of a returned tensor that was an input -> its input index
        # the last fast replay's inputs (weak refs to their UOps) and their buffers' handles: a replay whose inputs are
        # those same UOps (parameters, optimizer states, a caller's captured outputs passed back) reuses the handles
        self._last: tuple[list[weakref.ref[UOp]], list[Any]] | None = None
        self._kernels_only = False  # the replay runs kernels only (no copy or collective, which take the Buffers)
        if fxn is not None:
            functools.update_wrapper(self, fxn)

    def reset(self) -> None:
        """Forget the capture: the next call runs the function, the one after captures again."""
        self.calls = 0
        self.steps = []
        self.runs = []
        self.specs = ()
        self.names = []
        self.result = None
        self.var_vals = {}
        self._fast = False
        self._written = set()
        self._returned_inputs = {}
        self._last = None
        self._kernels_only = False

    @property
    def captured(self) -> CapturedJit | None:
        """The capture (its returned value, steps and expected inputs), or None before it."""
        if self.calls < 2:
            return None
        return CapturedJit(self.result, tuple(self.steps), tuple(self.names), self.specs)

    @property
    def cnt(self) -> int:
        """tinygrad's name for `calls`: 0 before the first call, 1 before the capture, 2 after it."""
        return self.calls

    def __get__(self, obj: Any, objtype: Any = None) -> Callable[..., R]:
        return functools.partial(self.__call__, obj)  # methods: bind self

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if self.fxn is None:  # `@TinyJit(prune=True)`: this call hands over the function
            if len(args) != 1 or kwargs or not callable(args[0]):
                raise JitError("TinyJit(...) without a function is a decorator: apply it to the function to jit")
            self.fxn = args[0]
            functools.update_wrapper(self, args[0])
            return self  # type: ignore[return-value]  # the decorated function, not a result
        if not JIT:
            return self.fxn(*args, **kwargs)
        if self._fast and not kwargs:  # the common replay: only whole-buffer tensors passed
            if (last := self._last) is not None and _same_uops(last[0], args):
                return self._run(last[1], {})  # the same buffers as the last replay: nothing to check again
            if (bufs := self._plain_args(args)) is not None:
                return self._launch(bufs, {}, _watched_uops(self, args) if self._kernels_only else None)
        inputs = _input_tensors(args, kwargs)
        if len({id(t) for t in inputs}) != len(inputs):
            raise JitError("the same Tensor is passed to a TinyJit twice; pass it once (or pass a .clone())")
        if self.calls and (lazy := [t for t in inputs if _lazy(t.uop)]):
            lazy[0].realize(*lazy[1:])  # as tinygrad: an unrealized input is computed first, outside the capture
        if self.calls == 0:
            self.calls = 1
            return self._realized(self.fxn(*args, **kwargs))
        if self.calls == 1:
            return self._capture(inputs, args, kwargs)
        if (names := _arg_names(args, kwargs)) != self.names:
            raise JitError(
                f"TinyJit was captured with tensor inputs passed as {self.names} (positions, then keyword names), "
                f"now as {names}; pass the same tensors the same way (positionally or by keyword) as at the capture"
            )
        if self._fast and (bufs := self._plain_inputs(inputs)) is not None and not _passes_variables(args, kwargs):
            return self._launch(bufs, {})
        return self._replay(inputs, _bound_vars(args, kwargs, inputs))

    def _plain_args(self, args: tuple[Any, ...]) -> list[Buffer] | None:
        """`_plain_inputs` when every argument is a Tensor and none is passed twice; None otherwise."""
        if not all(type(a) is Tensor for a in args) or len(set(map(id, args))) != len(args):
            return None
        return self._plain_inputs(list(args))

    def _plain_inputs(self, inputs: list[Tensor]) -> list[Buffer] | None:
        """The inputs' buffers when every input is the same kind of whole buffer as at capture; None otherwise (the
        generic path then checks them and says what changed)."""
        if len(inputs) != len(self.specs):
            return None
        bufs: list[Buffer] = []
        for t, spec in zip(inputs, self.specs):
            u = t.uop
            if not _plain_int_buffer(u) or u.dtype != spec.dtype or u.shape != spec.shape:
                return None
            base = u.src[0] if u.op is Ops.RESHAPE else u
            if base.src[0].arg != spec.device or "multi" in base.__dict__:
                return None
            bufs.append(base.__dict__["buffer"])
        return bufs

    def _realized(self, ret: R, check: bool = False) -> R:
        if outs := _returned_tensors(ret, check):
            outs[0].realize(*outs[1:])
        return ret

    def _capture(self, inputs: list[Tensor], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        if capturing():
            raise JitError("TinyJit calls cannot be nested: a jitted function called another jitted function")
        self.specs = tuple(_spec_of(t, i) for i, t in enumerate(inputs))
        passed = _bound_vars(args, kwargs, inputs)
        input_bufs = {id(b): i for i, b in enumerate(b for t in inputs for b in input_buffers(t.uop))}
        assert self.fxn is not None
        recorded = start_capture()
        try:
            ret = self._realized(self.fxn(*args, **kwargs), check=True)
        finally:
            stop_capture()
        if not any(items for items, _ in recorded):
            raise JitError(
                "didn't JIT anything: the jitted function ran no kernel (realize the Tensors it computes, or return "
                "them); a function that only reads realized values needs no TinyJit"
            )
        used = {name for _, var_vals in recorded for name in var_vals}
        if hidden := sorted(used - set(passed)):
            raise JitError(
                f"the jitted function uses the variable(s) {hidden} that are not among its arguments, so a replay "
                "could not change them; pass each bound Variable as an argument (or in an input's shape)"
            )
        steps = []
        # JITBEAM: the BEAM width of the kernels a JIT replays (they run often: worth a search the others skip)
        with Context(BEAM=BEAM.value if JITBEAM.value < 0 else JITBEAM.value):
            for items, var_vals in recorded:
                for it in items:
                    program = Device[it.device].compile(it.ast) if it.is_kernel else None
                    slots = tuple(input_bufs.get(id(b)) for b in it.bufs)
                    step = _Step(it, program, slots, var_vals)
                    if program is not None:  # buffers keep their handle for life: look the captured ones up once
                        step.handles = [b.handle if s is None else None for b, s in zip(it.bufs, slots)]
                        step.from_inputs = tuple((k, s) for k, s in enumerate(slots) if s is not None)
                    steps.append(step)
        if self.prune:
            steps = _prune(steps)
        if _share_intermediates(steps, _held_buffers(ret) | set(input_bufs)):
            recorded.clear()  # the capture's own copies of the shared buffers go now: hand their memory back
            for dev in {st.item.device for st in steps if isinstance(st.item.device, str)}:
                if (trim := getattr(Device[dev].allocator, "free_cache", None)) is not None:
                    trim()
        self.steps, self.result, self.calls, self.var_vals = steps, ret, 2, passed
        self.runs = _batched(steps)
        self._kernels_only = all(not isinstance(st, _Step) or st.handles is not None for st in self.runs)
        self.names = _arg_names(args, kwargs)
        self._written = {
            id(st.item.bufs[j].base or st.item.bufs[j])
            for st in steps
            for j in _written_slots(st.item)
            if st.slots[j] is None
        }
        # returned tensors that are inputs (`return b.assign(a + 1)`): a replay returns the new inputs in their place
        positions = {id(t): k for k, t in enumerate(inputs)}
        self._returned_inputs = {id(t): positions[id(t)] for t in _returned_tensors(ret, False) if id(t) in positions}
        # the common replay (whole single-device buffers of concrete shapes, no variables) skips the generic checks
        self._fast = (
            not passed
            and not self._returned_inputs
            and self.names == list(range(len(self.specs)))
            and all(
                spec.plain and isinstance(spec.device, str) and all(type(d) is int for d in spec.shape)
                for spec in self.specs
            )
        )
        return ret

    def _replay(self, inputs: list[Tensor], var_vals: dict[str, int]) -> R:
        if set(var_vals) != set(self.var_vals):
            raise JitError(
                f"TinyJit was captured with the variables {sorted(self.var_vals)}, now called with {sorted(var_vals)}; "
                "pass the same bound Variables (with any values in their ranges) or jit a new function"
            )
        if len(inputs) != len(self.specs):
            raise JitError(f"TinyJit was captured with {len(self.specs)} tensor inputs, now called with {len(inputs)}")
        for i, (t, spec) in enumerate(zip(inputs, self.specs)):
            u = t.uop
            plain = u.plain_buffer and spec.plain
            if plain and u.dtype == spec.dtype and u.shape == spec.shape and t.device == spec.device:
                continue  # the common case, checked without building the view
            got = _spec_of(t, i)
            for what in ("shape", "dtype", "device", "view"):
                if getattr(got, what) != getattr(spec, what):
                    raise JitError(
                        f"TinyJit input {i} changed {what}: captured {getattr(spec, what)!r}, "
                        f"now {getattr(got, what)!r}; call with the captured {what} or jit a new function"
                    )
        bufs = [b for t in inputs for b in input_buffers(t.uop)]  # one per device for a multi-device input
        ret = self._launch(bufs, var_vals)
        if self._returned_inputs:
            return _swap_tensors(ret, {i: inputs[k] for i, k in self._returned_inputs.items()})  # type: ignore[no-any-return]
        return ret

    def _launch(self, bufs: list[Buffer], var_vals: dict[str, int], refs: list[weakref.ref[UOp]] | None = None) -> R:
        """Replay on the input buffers `bufs`. `refs` (given only when the replay runs kernels only: a copy or a
        collective takes the Buffers): weak refs to the inputs' UOps, whose handles the next call may reuse
        (`_last`)."""
        self._last = None
        if any(id(b.base or b) in self._written for b in bufs):  # e.g. the last output passed back in: the replay
            bufs = [_copy_of(b) if id(b.base or b) in self._written else b for b in bufs]  # would overwrite it
            refs = None  # (the copies are new each call)
        inputs = [b.handle for b in bufs]
        if refs is not None:
            self._last = (refs, inputs)  # (a live UOp holds its buffer, so the handles stay valid while refs do)
        return self._run(inputs, var_vals, bufs)

    def _run(self, inputs: list[Any], var_vals: dict[str, int], bufs: list[Buffer] | None = None) -> R:
        """The replay's kernels (and copies, which need `bufs`) on the input handles `inputs`."""
        for step in self.runs if DEBUG.value < 2 else self.steps:  # DEBUG=2 times each kernel
            if not isinstance(step, _Step):
                step(inputs, var_vals)
                continue
            if step.handles is None:  # a copy or a collective
                assert bufs is not None, "a replay with copies is never run from handles alone (see _launch)"
                actual: list[Buffer] = [b if s is None else bufs[s] for b, s in zip(step.item.bufs, step.slots)]
                if step.item.is_copy:
                    actual[0].copyin(actual[1].as_bytes())
                else:
                    run_transfer(step.item, *actual)
                continue
            handles = step.handles.copy()
            for k, s in step.from_inputs:
                handles[k] = inputs[s]
            step.program(handles, {**step.var_vals, **var_vals} if var_vals else step.var_vals)
        if var_vals != self.var_vals:
            self._rebind_result(var_vals)
        assert self.result is not None or self.steps is not None
        return self.result  # type: ignore[return-value]

    def _rebind_result(self, var_vals: dict[str, int]) -> None:
        """The returned tensors are the captured ones; a symbolic shape among them now shows the new values."""
        ret = self.result
        for t in ret if isinstance(ret, (list, tuple)) else (ret,):
            if isinstance(t, Tensor):
                t.uop = rebind(t.uop, var_vals)
        self.var_vals = var_vals


# `capturing` and `record` live in xgrad.engine.capture; importable from here as before
__all__ = ["CapturedJit", "CapturedLinear", "InputSpec", "TinyJit", "capturing", "record"]
