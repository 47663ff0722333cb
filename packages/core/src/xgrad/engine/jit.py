"""TinyJit: run a function once, capture the kernels it runs the second time, replay them afterwards.

Replay launches the captured programs on the new inputs' buffers directly: no graph building, no scheduling, no
compiling. Inputs are the Tensors among the arguments (and one level inside lists, tuples and dicts); they must be
realized buffers, and on replay must match the capture in shape, dtype, device and view.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from xgrad.buffer import Buffer
from xgrad.device import Device
from xgrad.engine.capture import capturing, record, start_capture, stop_capture
from xgrad.engine.multi import input_buffers
from xgrad.engine.schedule import ScheduleItem
from xgrad.errors import JitError, ShapeError
from xgrad.helpers import BEAM, JIT, JITBEAM, Context
from xgrad.uop.ops import Ops, UOp, sint
from xgrad.uop.symshape import bound_values, graph_binds, rebind, unbind_graph

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

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
    program: Any  # compiled program, None for copies
    slots: tuple[int | None, ...]  # per buffer: the input it comes from, or None (captured buffer)
    var_vals: dict[str, int]
    handles: list[Any] | None = None  # kernels: the captured buffers' handles, input positions filled per replay
    from_inputs: tuple[tuple[int, int], ...] = ()  # (position among the handles, input index)


def _plain_int_buffer(u: UOp) -> bool:
    """A whole single buffer (maybe reshaped) with a concrete shape: no view and no variable to check or unbind."""
    if u.op is Ops.RESHAPE:
        return u.src[0].op is Ops.BUFFER and all(type(s) is int for s in u.arg)
    return u.op is Ops.BUFFER


def _input_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    from xgrad.tensor import Tensor

    found: list[Tensor] = []
    for a in (*args, *kwargs.values()):
        inner = a.values() if isinstance(a, dict) else a if isinstance(a, (list, tuple)) else (a,)
        found.extend(x for x in inner if isinstance(x, Tensor))
    return found


def _passes_variables(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a UOp (a bound Variable) is among the arguments (one level inside lists, tuples and dicts too)."""
    for a in (*args, *kwargs.values()):
        inner = a.values() if isinstance(a, dict) else a if isinstance(a, (list, tuple)) else (a,)
        if any(isinstance(x, UOp) for x in inner):
            return True
    return False


def _bound_vars(args: tuple[Any, ...], kwargs: dict[str, Any], inputs: list[Tensor]) -> dict[str, int]:
    """Values of the bound Variables passed in: directly (one level inside lists, tuples and dicts too) or in the
    symbolic shapes of the input tensors. They are runtime values: a replay passes the new ones to the kernels."""
    binds: list[UOp] = []
    for a in (*args, *kwargs.values()):
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


class TinyJit(Generic[R]):
    """Capture a function's kernels and replay them. `JIT=0` turns it off (the function just runs).

    >>> from xgrad import Tensor
    >>> f = TinyJit(lambda a, b: (a * b + 1).realize())
    >>> for i in range(3): out = f(Tensor([1.0, 2.0]).realize(), Tensor([float(i), 1.0]).realize())
    >>> out.tolist()
    [3.0, 3.0]
    """

    def __init__(self, fxn: Callable[..., R]):
        self.fxn = fxn
        self.calls = 0
        self.steps: list[_Step] = []
        self.specs: tuple[InputSpec, ...] = ()
        self.result: R | None = None
        self.var_vals: dict[str, int] = {}  # the bound Variables of the capture (their values change per replay)
        self._fast = False  # see _capture
        functools.update_wrapper(self, fxn)

    def reset(self) -> None:
        self.calls = 0
        self.steps = []
        self.specs = ()
        self.result = None
        self.var_vals = {}
        self._fast = False

    def __get__(self, obj: Any, objtype: Any = None) -> Callable[..., R]:
        return functools.partial(self.__call__, obj)  # methods: bind self

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if not JIT:
            return self.fxn(*args, **kwargs)
        if self._fast and not kwargs and (bufs := self._plain_args(args)) is not None:
            return self._launch(bufs, {})  # the common replay: only whole-buffer tensors passed, each once
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
        if self._fast and (bufs := self._plain_inputs(inputs)) is not None and not _passes_variables(args, kwargs):
            return self._launch(bufs, {})
        return self._replay(inputs, _bound_vars(args, kwargs, inputs))

    def _plain_args(self, args: tuple[Any, ...]) -> list[Buffer] | None:
        """`_plain_inputs` when every argument is a Tensor and none is passed twice; None otherwise."""
        from xgrad.tensor import Tensor

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

    def _realized(self, ret: R) -> R:
        from xgrad.tensor import Tensor

        outs = [x for x in (ret if isinstance(ret, (list, tuple)) else (ret,)) if isinstance(x, Tensor)]
        if outs:
            outs[0].realize(*outs[1:])
        return ret

    def _capture(self, inputs: list[Tensor], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        if capturing():
            raise JitError("TinyJit calls cannot be nested: a jitted function called another jitted function")
        self.specs = tuple(_spec_of(t, i) for i, t in enumerate(inputs))
        passed = _bound_vars(args, kwargs, inputs)
        input_bufs = {id(b): i for i, b in enumerate(b for t in inputs for b in input_buffers(t.uop))}
        recorded = start_capture()
        try:
            ret = self._realized(self.fxn(*args, **kwargs))
        finally:
            stop_capture()
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
                    program = None if it.is_copy else Device[it.device].compile(it.ast)
                    slots = tuple(input_bufs.get(id(b)) for b in it.bufs)
                    step = _Step(it, program, slots, var_vals)
                    if program is not None:  # buffers keep their handle for life: look the captured ones up once
                        step.handles = [b.handle if s is None else None for b, s in zip(it.bufs, slots)]
                        step.from_inputs = tuple((k, s) for k, s in enumerate(slots) if s is not None)
                    steps.append(step)
        self.steps, self.result, self.calls, self.var_vals = steps, ret, 2, passed
        # the common replay (whole single-device buffers of concrete shapes, no variables) skips the generic checks
        self._fast = not passed and all(
            spec.plain and isinstance(spec.device, str) and all(type(d) is int for d in spec.shape)
            for spec in self.specs
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
        return self._launch(bufs, var_vals)

    def _launch(self, bufs: list[Buffer], var_vals: dict[str, int]) -> R:
        for step in self.steps:
            if step.handles is None:
                actual: list[Buffer] = [b if s is None else bufs[s] for b, s in zip(step.item.bufs, step.slots)]
                actual[0].copyin(actual[1].as_bytes())
                continue
            handles = step.handles.copy()
            for k, s in step.from_inputs:
                handles[k] = bufs[s].handle
            step.program(handles, {**step.var_vals, **var_vals} if var_vals else step.var_vals)
        if var_vals != self.var_vals:
            self._rebind_result(var_vals)
        assert self.result is not None or self.steps is not None
        return self.result  # type: ignore[return-value]

    def _rebind_result(self, var_vals: dict[str, int]) -> None:
        """The returned tensors are the captured ones; a symbolic shape among them now shows the new values."""
        from xgrad.tensor import Tensor

        ret = self.result
        for t in ret if isinstance(ret, (list, tuple)) else (ret,):
            if isinstance(t, Tensor):
                t.uop = rebind(t.uop, var_vals)
        self.var_vals = var_vals


# `capturing` and `record` live in xgrad.engine.capture; importable from here as before
__all__ = ["InputSpec", "TinyJit", "capturing", "record"]
