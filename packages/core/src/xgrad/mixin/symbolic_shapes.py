"""Symbolic shapes in the movement ops: sizes, pads and slice bounds that are expressions of bound Variables
(`Variable("n", 1, 64).bind(5)`). The primitive ops (`reshape`, `shrink`, `pad`, indexing) hand their symbolic cases
to the methods here; each checks that the result is valid for every value in the variables' ranges, because one
compiled kernel serves all of them. See `xgrad.uop.symshape` for how bound values reach the kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from xgrad.dtype import dtypes
from xgrad.errors import IndexingError, ShapeError, XgradError
from xgrad.helpers import prod
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import Scalar
from xgrad.uop.ops import Ops, UOp, sint, ssimplify
from xgrad.uop.symshape import (
    is_symbolic,
    resolve_binds,
    shape_str,
    sint_max,
    sint_min,
    sint_value,
    sym_equal,
    sym_prod,
)

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


def as_size(x: Any) -> sint:
    """An int, or a simplified size expression (an int again when it folds to a constant)."""
    if not isinstance(x, UOp):
        return int(x)
    s = ssimplify(x)
    return int(s.arg) if s.op is Ops.CONST else s


def size_diff(a: sint, b: sint) -> sint:
    return as_size(a - b)


def _is_symbolic_index(it: Any) -> bool:
    if isinstance(it, slice):
        return any(isinstance(p, UOp) for p in (it.start, it.stop, it.step))
    return isinstance(it, UOp)


def _is_plain_basic_index(it: Any) -> bool:
    """An int, a step-1 slice, None or ... (what a symbolic shape can be indexed with by shrinks)."""
    if isinstance(it, slice):
        return it.step in (None, 1)
    return it is None or it is Ellipsis or (isinstance(it, int) and not isinstance(it, bool))


def _slice_end(x: Any, n: sint, default: sint) -> sint:
    """A slice bound (or an int index) as a position in an axis of size n; a negative int counts from the end."""
    if x is None:
        return default
    if isinstance(x, UOp):
        return as_size(x)
    if int(x) < 0:
        if isinstance(n, UOp):
            raise IndexingError(f"negative index {x} on the symbolic axis {n!r}; use a non-negative position")
        return int(x) + n
    return int(x)


def pairs_str(pairs: Sequence[tuple[sint, sint]]) -> str:
    return "(" + ", ".join(shape_str(p) for p in pairs) + ")"


def check_in_range(what: Callable[[], str], shape: tuple[sint, ...], b: sint, e: sint, n: sint) -> None:
    """0 <= b <= e <= n now (at the bound values) and, for symbolic bounds, over the variables' whole ranges: a
    kernel compiled for the range must never read outside the buffer. `what()` describes the operation for an error
    (called only then: formatting it on every slice cost more than the check)."""
    if not 0 <= sint_value(b) <= sint_value(e) <= sint_value(n):
        raise ShapeError(f"{what()} is out of range for shape {shape_str(shape)}")
    if any(isinstance(x, UOp) for x in (b, e, n)):
        lo, hi = sint_min(b), sint_max(e)
        room = sint_min(n)
        if lo < 0 or (hi > room and not sym_equal(e, n)) or sint_min(size_diff(e, b)) < 0:
            raise ShapeError(
                f"{what()} can leave the shape {shape_str(shape)} for some values of its variables (start >= {lo}, "
                f"end <= {hi}, size >= {room}); narrow the Variable ranges so that every value fits"
            )


class SymbolicShapeMixin(TensorBase):
    __slots__ = ()

    @property
    def max_shape(self) -> tuple[int, ...]:
        """The shape with each symbolic size at its largest value (the shape itself when it is concrete).

        >>> from xgrad import Variable
        >>> Tensor.ones(2, Variable("n", 1, 8).bind(3)).max_shape
        (2, 8)
        """
        return tuple(sint_max(s) for s in self.shape)

    def max_numel(self) -> int:
        """The number of elements at `max_shape`.

        >>> from xgrad import Variable
        >>> Tensor.ones(2, Variable("n", 1, 8).bind(3)).max_numel()
        16
        """
        return int(prod(self.max_shape))

    def _symbolic_index(self, indices: Any) -> Tensor | None:
        """The view `self[indices]` when an index or a slice bound is symbolic (ints, step-1 slices, None and ...
        only), else None. Used by `__getitem__`/`__setitem__`: `cache[:, :start_pos + 1]`.

        >>> from xgrad import Variable
        >>> t = Tensor([[1, 2, 3], [4, 5, 6]])
        >>> t._symbolic_index((slice(None), slice(Variable("n", 1, 3).bind(2)))).tolist()
        [[1, 2], [4, 5]]
        """
        items = list(indices) if isinstance(indices, tuple) else [indices]
        if not any(_is_symbolic_index(it) for it in items) and not (
            is_symbolic(self.shape) and all(_is_plain_basic_index(it) for it in items)
        ):  # plain indexes of a symbolic shape (x[..., 0] of an (n, 4) tensor) are shrinks here too
            return None
        if not all(it is None or it is Ellipsis or isinstance(it, (int, slice, UOp)) for it in items):
            raise IndexingError("a symbolic index combines only with ints, slices, None and ...")
        real = sum(1 for it in items if it is not None and it is not Ellipsis)
        if real > self.ndim or sum(1 for it in items if it is Ellipsis) > 1:
            raise IndexingError(f"too many indices for a tensor of shape {shape_str(self.shape)}")
        fill: list[Any] = [slice(None)] * (self.ndim - real)
        at = next((i for i, it in enumerate(items) if it is Ellipsis), len(items))
        items = items[:at] + fill + items[at + 1 :]
        shrinks: list[tuple[sint, sint]] = []
        keep: list[bool | None] = []  # per item: a kept axis, a dropped axis (an int), or a new axis (None)
        for it in items:
            if it is None:
                keep.append(None)
                continue
            n = self.shape[len(shrinks)]
            if isinstance(it, slice):
                if it.step not in (None, 1):
                    raise IndexingError(f"slice {it} with a symbolic bound needs step 1")
                shrinks.append((_slice_end(it.start, n, 0), _slice_end(it.stop, n, n)))
                keep.append(True)
            else:
                start = _slice_end(it, n, 0)
                shrinks.append((start, as_size(start + 1)))
                keep.append(False)
        x = self._t().shrink(shrinks)
        out: list[sint] = []
        axis = 0
        for k in keep:
            if k is None:
                out.append(1)
                continue
            if k:
                out.append(x.shape[axis])
            axis += 1
        return x.reshape(tuple(out))

    def _resolved(self) -> Tensor:
        """The same tensor with each bound variable in its shape replaced by its value (a concrete shape)."""
        return self._new(resolve_binds(self.uop)) if is_symbolic(self.shape) else self._t()

    def _reshape_symbolic(self, new: list[Any]) -> Tensor:
        """reshape where a size is symbolic: the element counts must be equal for every value of the variables."""
        holes = [i for i, s in enumerate(new) if isinstance(s, int) and s == -1]
        if len(holes) > 1:
            raise ShapeError(f"reshape to {shape_str(new)}: only one dimension can be -1")
        if holes:
            rest = sym_prod(s for i, s in enumerate(new) if i not in holes)
            numel: sint = self.numel()
            if not isinstance(numel, UOp):
                raise ShapeError(f"cannot reshape {shape_str(self.shape)} to {shape_str(new)}: -1 is not a whole size")
            new[holes[0]] = ssimplify(numel // rest)
        if any(isinstance(s, int) and s < 0 for s in new) or not sym_equal(sym_prod(new), self.numel()):
            raise ShapeError(
                f"cannot reshape tensor of shape {shape_str(self.shape)} to {shape_str(new)}: the element counts "
                "are not equal for every value of the variables"
            )
        return self._new(self.uop.reshape(tuple(new)))

    def _pad_symbolic(self, pairs: list[tuple[Any, Any]], mode: str, value: Scalar) -> Tensor:
        """Constant padding where a pad or a size is symbolic; symbolic pads must be >= 0 for every value."""
        if mode != "constant":
            raise XgradError(f"pad mode {mode!r} of a symbolic shape is not supported; use mode 'constant'")
        for p in pairs:
            if any(sint_min(x) < 0 for x in p):
                raise ShapeError(f"padding {pairs_str(pairs)} can be negative; symbolic padding must be >= 0")
        grow = tuple(pairs)
        out = self._new(self.uop.pad(grow))
        if value != 0:
            mask = self._new(UOp.const(dtypes.bool, True, self.device, self.shape).pad(grow))
            out = mask.where(out, self._new(UOp.const(self.dtype, value, self.device, ())))
        return out
