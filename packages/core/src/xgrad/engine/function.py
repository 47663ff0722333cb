"""`function`: trace a Python function of Tensors once, then apply the traced graph to new inputs.

The first call runs the function on placeholder inputs (BUFFER nodes without memory, one per Tensor argument) and
keeps the lazy graph it returns: the body. Every call, the first included, substitutes the arguments' graphs for the
placeholders, so the Python function itself never runs again; the results are ordinary lazy Tensors (they fuse with
what surrounds them and differentiate as usual). Later calls must pass Tensors of the traced shapes, dtypes and
devices and the same non-Tensor arguments; anything else raises `JitError` (decorate again to trace anew).

Tensors are found among the arguments and one level inside lists, tuples and dicts (as `TinyJit` finds them); the
same Tensor passed twice becomes one input. Realized Tensors the body reads that are not arguments (captured from a
closure or `self`) are implicit inputs: an error unless `allow_implicit=True`, then they are read as they are at
each realize. The body must stay lazy: it cannot `realize()` or read values (`numpy()`, `item()`).

`precompile=True` makes the body its own kernels: the inputs and outputs are kernel boundaries (`contiguous`), and
the first call realizes the outputs, compiling the body's kernels; later calls build the same kernels, which the
device's program cache serves without compiling. `precompile_backward=True` does the same for the gradient
(`contiguous_backward` at the boundaries). A custom backward (`grad_fxn`) is not supported yet.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

from xgrad.buffer import new_buffer_id
from xgrad.dtype import DType
from xgrad.errors import JitError, XgradError
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.pattern import substitute


@dataclass(frozen=True)
class _InputSig:
    shape: tuple[int, ...]
    dtype: DType
    device: str


@dataclass
class _Trace:
    inputs: tuple[_InputSig, ...]
    placeholders: tuple[UOp, ...]  # one per input: the node the body reads for it
    statics: tuple[Any, ...]  # the non-Tensor arguments, which the trace baked in
    outputs: tuple[UOp, ...]
    single: bool  # the function returned one Tensor (not a tuple or list)


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def _split_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Tensor], tuple[Any, ...]]:
    """(the distinct Tensors, in order of appearance; a description of everything else, Tensors as their index)."""
    tensors: list[Tensor] = []
    index: dict[int, int] = {}

    def slot(x: Any) -> Any:
        if not _is_tensor(x):
            return x
        if id(x) not in index:
            index[id(x)] = len(tensors)
            tensors.append(x)
        return ("<tensor>", index[id(x)])

    def level(a: Any) -> Any:
        if isinstance(a, dict):
            return ("<dict>", tuple((k, slot(v)) for k, v in a.items()))
        if isinstance(a, (list, tuple)):
            return (f"<{type(a).__name__}>", tuple(slot(v) for v in a))
        return slot(a)

    statics = (tuple(level(a) for a in args), tuple((k, level(v)) for k, v in kwargs.items()))
    return tensors, statics


def _rebuild(args: tuple[Any, ...], kwargs: dict[str, Any], new: dict[int, Tensor]) -> tuple[tuple[Any, ...], Any]:
    """args and kwargs with every Tensor (one level deep) replaced by new[id(tensor)]."""

    def swap(x: Any) -> Any:
        return new[id(x)] if _is_tensor(x) else x

    def level(a: Any) -> Any:
        if isinstance(a, dict):
            return {k: swap(v) for k, v in a.items()}
        if isinstance(a, (list, tuple)):
            return type(a)(swap(v) for v in a)
        return swap(a)

    return tuple(level(a) for a in args), {k: level(v) for k, v in kwargs.items()}


def _signature(t: Tensor, i: int) -> _InputSig:
    if isinstance(t.device, tuple) or any(isinstance(s, UOp) for s in t.shape):
        raise JitError(f"function input {i}: multi-device and symbolic-shape tensors are not supported yet")
    return _InputSig(tuple(t.shape), t.dtype, t.device)


def _placeholder(sig: _InputSig) -> UOp:
    """A BUFFER node with no memory behind it, viewed in the input's shape; ids never repeat, so it equals no other
    node of the graph."""
    size = 1
    for s in sig.shape:
        size *= s
    return UOp.buffer(sig.device, max(size, 1), sig.dtype, new_buffer_id()).reshape(sig.shape)


class Function:
    """The traced function returned by `function`; call it like the original."""

    def __init__(
        self,
        fxn: Callable[..., Any],
        precompile: bool = False,
        precompile_backward: bool = False,
        allow_implicit: bool = False,
    ):
        self.fxn = fxn
        self.precompile, self.precompile_backward, self.allow_implicit = precompile, precompile_backward, allow_implicit
        self.trace: _Trace | None = None
        self.name: str = getattr(fxn, "__name__", type(fxn).__name__)
        functools.update_wrapper(self, fxn)

    def __get__(self, obj: Any, objtype: Any = None) -> Callable[..., Any]:
        return functools.partial(self.__call__, obj)  # methods: bind self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors, statics = _split_args(args, kwargs)
        sigs = tuple(_signature(t, i) for i, t in enumerate(tensors))
        first = self.trace is None
        if self.trace is None:
            self.trace = self._trace(args, kwargs, tensors, sigs, statics)
        trace = self.trace
        self._check(trace, sigs, statics)
        outs = self._apply(trace, tensors)
        if first and self.precompile:
            outs[0].realize(*outs[1:])  # compile (and run) the body's kernels now
        return outs[0] if trace.single else tuple(outs)

    # ---- tracing ----
    def _trace(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        tensors: list[Tensor],
        sigs: tuple[_InputSig, ...],
        statics: tuple[Any, ...],
    ) -> _Trace:
        placeholders = tuple(_placeholder(s) for s in sigs)
        first_uid = new_buffer_id()  # buffers numbered below this existed before the trace: implicit inputs
        stand_ins = [Tensor(p) for p in placeholders]
        new_args, new_kwargs = _rebuild(args, kwargs, {id(t): s for t, s in zip(tensors, stand_ins)})
        try:
            ret = self.fxn(*new_args, **new_kwargs)
        except KeyError as e:
            if e.args != ("buffer",):
                raise
            raise XgradError(
                f"function {self.name!r} tried to realize or read a traced tensor; a function body must stay "
                "lazy: return the tensors and realize or read them after the call"
            ) from None
        single = _is_tensor(ret)
        outs = [ret] if single else list(ret) if isinstance(ret, (tuple, list)) else None
        if outs is None or not outs or not all(_is_tensor(o) for o in outs):
            raise XgradError(
                f"function {self.name!r} must return a Tensor or a tuple/list of Tensors, got {type(ret).__name__}"
            )
        out_uops = tuple(o.uop for o in outs)
        self._check_implicit(out_uops, set(placeholders), first_uid)
        return _Trace(sigs, placeholders, statics, out_uops, single)

    def _check_implicit(self, outs: tuple[UOp, ...], placeholders: set[UOp], first_uid: int) -> None:
        if self.allow_implicit:
            return
        bases = {p.base for p in placeholders}
        implicit = [
            u
            for out in outs
            for u in out.toposort
            if u.op is Ops.BUFFER and u not in bases and _buffer_uid(u) < first_uid
        ]
        if implicit:
            sizes = sorted({f"{u.dtype.name}[{u.arg[1]}]" for u in implicit})
            raise XgradError(
                f"function {self.name!r} reads {len(set(implicit))} realized tensor(s) that are not arguments "
                f"(from a closure or self: {', '.join(sizes)}); pass them as arguments, or decorate with "
                "@function(allow_implicit=True)"
            )

    # ---- calls ----
    def _check(self, trace: _Trace, sigs: tuple[_InputSig, ...], statics: tuple[Any, ...]) -> None:
        if len(sigs) != len(trace.inputs):
            raise JitError(
                f"function {self.name!r} was traced with {len(trace.inputs)} tensor inputs, now called with "
                f"{len(sigs)}; call it as traced or decorate the function again"
            )
        for i, (got, want) in enumerate(zip(sigs, trace.inputs)):
            for what in ("shape", "dtype", "device"):
                if getattr(got, what) != getattr(want, what):
                    raise JitError(
                        f"function {self.name!r} input {i} changed {what}: traced with {getattr(want, what)!r}, "
                        f"now {getattr(got, what)!r}; call it with the traced {what} or decorate the function again"
                    )
        if not _same(statics, trace.statics):
            raise JitError(
                f"function {self.name!r} was traced with other non-Tensor arguments ({trace.statics!r}, now "
                f"{statics!r}); the trace baked them in: decorate the function again for new ones"
            )

    def _apply(self, trace: _Trace, tensors: list[Tensor]) -> list[Tensor]:
        mapping: dict[UOp, UOp] = {}
        for p, t in zip(trace.placeholders, tensors):
            x = t.contiguous() if self.precompile and not _is_plain_buffer(t.uop) else t
            x = x.contiguous_backward() if self.precompile_backward else x
            mapping[p] = x.uop
        sink = substitute(UOp(Ops.SINK, src=trace.outputs), mapping, name="apply function")
        outs = [Tensor(u) for u in sink.src]
        if self.precompile:
            outs = [o.contiguous() for o in outs]
        if self.precompile_backward:
            outs = [o.contiguous_backward() for o in outs]
        return outs


def _buffer_uid(u: UOp) -> int:
    """The number a BUFFER node was created with (numbers only grow); -1 when it carries none."""
    uid = u.arg[0] if isinstance(u.arg, tuple) and u.arg else None
    return uid if isinstance(uid, int) else -1


def _is_plain_buffer(u: UOp) -> bool:
    """A realized buffer, at most reshaped: already a kernel boundary (`contiguous` would copy it)."""
    while u.op is Ops.RESHAPE:
        u = u.src[0]
    return u.op is Ops.BUFFER


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # values whose == is not a bool (arrays): compare by identity
        return a is b


@overload
def function(fxn: Callable[..., Any], /) -> Function: ...


@overload
def function(
    fxn: None = None,
    /,
    *,
    precompile: bool = False,
    precompile_backward: bool = False,
    allow_implicit: bool = False,
    grad_fxn: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Function]: ...


def function(
    fxn: Callable[..., Any] | None = None,
    /,
    *,
    precompile: bool = False,
    precompile_backward: bool = False,
    allow_implicit: bool = False,
    grad_fxn: Callable[..., Any] | None = None,
) -> Function | Callable[[Callable[..., Any]], Function]:
    """Decorator: trace `fxn` once on its first call, then apply the traced graph to each call's Tensors (see the
    module docstring). Use bare (`@function`) or with options (`@function(precompile=True)`).

    >>> from xgrad import Tensor
    >>> @function
    ... def f(a, b):
    ...     return (a * b).sum(axis=1) + 1
    >>> f(Tensor([[1.0, 2.0]]), Tensor([[3.0, 4.0]])).tolist()
    [12.0]
    >>> f(Tensor([[0.0, 1.0]]), Tensor([[5.0, 6.0]])).tolist()  # the Python body does not run again
    [7.0]
    """
    if grad_fxn is not None:
        raise XgradError("function(grad_fxn=...) (a custom backward) is not supported yet; leave grad_fxn unset")

    def wrap(f: Callable[..., Any]) -> Function:
        return Function(f, precompile, precompile_backward, allow_implicit)

    return wrap if fxn is None else wrap(fxn)
