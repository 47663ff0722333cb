"""Movement ops: views of a tensor that become index math in kernels, never copies. Joining (cat, stack) and the
non-constant pad modes are the exceptions: they add zero-padded views together, so they cost one elementwise pass."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from xgrad.dtype import dtypes, least_upper_dtype
from xgrad.errors import ArgumentError, DeviceMismatchError, ShapeError
from xgrad.helpers import argfix, ceildiv, prod
from xgrad.mixin.base import TensorBase
from xgrad.mixin.common import Scalar
from xgrad.mixin.rearrange import plan_rearrange
from xgrad.mixin.symbolic_shapes import as_size, check_in_range, pairs_str, size_diff
from xgrad.uop.ops import UOp, sint
from xgrad.uop.symshape import canonical_sum, is_symbolic, shape_str, sint_min

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

PAD_MODES = ("constant", "reflect", "replicate", "circular")


class PadModeError(ArgumentError, NotImplementedError):
    """`pad` got a mode it does not know: a `NotImplementedError` as tinygrad's (and an `ArgumentError`)."""


class MovementMixin(TensorBase):
    __slots__ = ()

    # ---- the primitive movement ops ----
    def reshape(self, shape: Any, *args: int) -> Tensor:
        """The same elements in a new shape; one size may be -1 (inferred).

        >>> Tensor([1, 2, 3, 4, 5, 6]).reshape(2, -1).tolist()
        [[1, 2, 3], [4, 5, 6]]
        """
        given = [s if isinstance(s, UOp) else int(s) for s in argfix(shape, *args)]
        old = self.shape
        if is_symbolic(given) or is_symbolic(old):
            return self._t()._reshape_symbolic(given)
        new = cast("list[int]", given)  # no symbolic size: all ints
        numel = prod(old)
        if -1 in new:
            if new.count(-1) > 1:
                raise ShapeError(f"reshape to {tuple(new)}: only one dimension can be -1")
            rest = prod(s for s in new if s != -1)
            if rest == 0 or numel % rest:
                raise ShapeError(f"cannot reshape {old} to {tuple(new)}")
            new[new.index(-1)] = numel // rest
        if prod(new) != numel or min(new, default=0) < 0:
            raise ShapeError(f"cannot reshape tensor of shape {old} ({numel} elements) to {tuple(new)}")
        return self._new(self.uop.reshape(tuple(new)))

    def view(self, shape: Any, *args: int) -> Tensor:
        """Alias of `reshape` (xgrad tensors are never strided, so every reshape is a view).

        >>> Tensor([[1, 2], [3, 4]]).view(4).tolist()
        [1, 2, 3, 4]
        """
        return self.reshape(shape, *args)

    def permute(self, order: Any, *args: int) -> Tensor:
        """Reorder the axes: axis i of the result is axis `order[i]` of self.

        >>> Tensor([[1, 2, 3]]).permute(1, 0).tolist()
        [[1], [2], [3]]
        """
        o = tuple(self._axis(a) for a in argfix(order, *args))
        if sorted(o) != list(range(self.ndim)):
            raise ShapeError(f"permute order {o} is not a permutation of the {self.ndim} axes of {self.shape}")
        return self._new(self.uop.permute(o))

    def expand(self, shape: Any, *args: int) -> Tensor:
        """Broadcast size-1 axes (and new leading axes) to `shape`; -1 keeps a size.

        >>> Tensor([[1], [2]]).expand(2, 3).tolist()
        [[1, 1, 1], [2, 2, 2]]
        """
        sizes = argfix(shape, *args)
        if len(sizes) < self.ndim:
            raise ShapeError(f"cannot expand shape {self.shape} to {tuple(sizes)}: it has fewer dimensions")
        old = (1,) * (len(sizes) - self.ndim) + self.shape
        return self._broadcast_to(tuple(o if s == -1 else s for s, o in zip(sizes, old)))

    def shrink(self, arg: Sequence[tuple[sint, sint] | None]) -> Tensor:
        """Keep `[start, end)` of each axis (None keeps the whole axis).

        >>> Tensor([[1, 2, 3], [4, 5, 6]]).shrink((None, (1, 3))).tolist()
        [[2, 3], [5, 6]]
        """
        if len(arg) != self.ndim:
            raise ShapeError(f"shrink {tuple(arg)} has {len(arg)} entries for {self.ndim} dimensions")
        full = tuple((0, s) if a is None else (as_size(a[0]), as_size(a[1])) for a, s in zip(arg, self.shape))
        for (b, e), s in zip(full, self.shape):
            check_in_range(lambda: f"shrink {pairs_str(full)}", self.shape, b, e, s)
        return self._new(self.uop.shrink(full))

    def flip(self, axis: Any, *args: int) -> Tensor:
        """Reverse the order of the elements along the given axes.

        >>> Tensor([[1, 2], [3, 4]]).flip(1).tolist()
        [[2, 1], [4, 3]]
        """
        given = [self._axis(a) for a in argfix(axis, *args)]
        if len(set(given)) != len(given):
            raise ShapeError(f"flip axes {given} name an axis twice; give each axis once")
        axes = set(given)
        return self._new(self.uop.flip(tuple(i in axes for i in range(self.ndim))))

    def pad(self, padding: Sequence[Any], mode: str = "constant", value: Scalar = 0.0) -> Tensor:
        """Pad each axis; negative pads cut elements off instead.

        `padding` is either one `(before, after)` pair (or None) per axis, or a flat torch-style list
        `[last_before, last_after, second_last_before, ...]` covering the last axes. `mode`: 'constant' fills with
        `value`, 'reflect' mirrors without repeating the edge, 'replicate' repeats the edge, 'circular' wraps around.

        >>> Tensor([1, 2, 3]).pad((1, 2), value=9).tolist()
        [9, 1, 2, 3, 9, 9]
        >>> Tensor([1, 2, 3]).pad(((2, 1),), mode="reflect").tolist()
        [3, 2, 1, 2, 3, 2]
        """
        if mode not in PAD_MODES:
            raise PadModeError(f"pad mode {mode!r} is unknown; use one of {', '.join(PAD_MODES)}")
        if mode != "constant" and value != 0.0:
            raise ArgumentError(f"pad value {value} is only used by mode 'constant', not {mode!r}; leave it out")
        given = self._pad_pairs(padding)
        if any(isinstance(x, UOp) for p in given for x in p) or is_symbolic(self.shape):
            return self._t()._pad_symbolic(given, mode, value)
        pairs = [(b, a) for b, a in given if isinstance(b, int) and isinstance(a, int)]
        for (b, a), s in zip(pairs, self.shape):
            if -b - a > s or -b > s or -a > s:
                raise ShapeError(
                    f"negative padding {(b, a)} removes more than the size {s} of a dimension of {self.shape}"
                )
        x = self.shrink(tuple((max(0, -b), s - max(0, -a)) for (b, a), s in zip(pairs, self.shape)))
        grow = tuple((max(0, b), max(0, a)) for b, a in pairs)
        if mode != "constant":
            for d, (b, a) in enumerate(grow):
                if b or a:
                    x = x._pad_axis_mode(d, b, a, mode)
            return x
        out = self._new(x.uop.pad(grow))
        if value != 0 and any(b or a for b, a in grow):
            mask = self._new(UOp.const(dtypes.bool, True, self.device, x.shape).pad(grow))
            out = mask.where(out, self._new(UOp.const(self.dtype, value, self.device, ())))
        return out

    def _pad_pairs(self, padding: Sequence[Any]) -> list[tuple[sint, sint]]:
        if all(isinstance(p, (int, UOp)) for p in padding):
            flat = list(padding)
            if len(flat) % 2 or len(flat) // 2 > self.ndim:
                raise ShapeError(f"flat padding {tuple(flat)} must have an even length of at most 2*{self.ndim}")
            pairs: list[tuple[sint, sint]] = [(0, 0)] * (self.ndim - len(flat) // 2)
            return pairs + [(as_size(flat[i]), as_size(flat[i + 1])) for i in reversed(range(0, len(flat), 2))]
        out = [(0, 0) if p is None else (as_size(p[0]), as_size(p[1])) for p in padding]
        if len(out) != self.ndim:
            raise ShapeError(f"padding {tuple(padding)} has {len(out)} entries for {self.ndim} dimensions")
        return out

    def _pad_axis_mode(self, d: int, b: int, a: int, mode: str) -> Tensor:
        s = self.shape[d]
        if mode == "circular":
            if b > s or a > s:
                raise ShapeError(f"circular padding {(b, a)} is larger than the size {s} of axis {d} of {self.shape}")
            return self._tile_axis(d, 3)._shrink_axis(d, s - b, 2 * s + a)
        if mode == "reflect":
            if b >= s or a >= s:
                raise ShapeError(
                    f"reflect padding {(b, a)} must be smaller than the size {s} of axis {d} of {self.shape}"
                )
            before = self._shrink_axis(d, 1, b + 1).flip(d)
            after = self._shrink_axis(d, s - 1 - a, s - 1).flip(d)
        else:
            if s == 0:
                raise ShapeError(f"replicate padding of the empty axis {d} of {self.shape}: there is no edge to repeat")
            edge = list(self.shape)
            edge[d] = b
            before = self._shrink_axis(d, 0, 1).expand(tuple(edge))
            edge[d] = a
            after = self._shrink_axis(d, s - 1, s).expand(tuple(edge))
        return before.cat(self._t(), after, dim=d)

    # ---- helpers on one axis (pure movement) ----
    def _shrink_axis(self, d: int, start: int, end: int) -> Tensor:
        return self.shrink(tuple((start, end) if i == d else None for i in range(self.ndim)))

    def _tile_axis(self, d: int, times: int) -> Tensor:
        """`times` copies of self one after another along axis `d`."""
        s = self.shape[d]
        split = self.shape[:d] + (1, s) + self.shape[d + 1 :]
        tiled = self.reshape(split).expand(self.shape[:d] + (times, s) + self.shape[d + 1 :])
        return tiled.reshape(self.shape[:d] + (times * s,) + self.shape[d + 1 :])

    def _every(self, d: int, step: int, count: int) -> Tensor:
        """Elements 0, step, ..., (count-1)*step of axis `d` (which holds at least (count-1)*step+1 elements), using
        only reshape, expand and shrink, so the result can still be written through (setitem)."""
        if count <= 1 or step == 1:
            return self._shrink_axis(d, 0, count if step == 1 else min(count, 1))
        x = self._t()
        if self.shape[d] < count * step:  # the last row is incomplete: read it from a second copy of the axis
            x = x._tile_axis(d, 2)
        x = x._shrink_axis(d, 0, count * step)
        rows = x.reshape(x.shape[:d] + (count, step) + x.shape[d + 1 :])
        return rows._shrink_axis(d + 1, 0, 1).reshape(x.shape[:d] + (count,) + x.shape[d + 1 :])

    # ---- size helpers ----
    def shrink_to(self, shape: Any, *args: int | None) -> Tensor:
        """Keep the first `shape[i]` elements of each axis (None keeps the axis whole).

        >>> Tensor([[1, 2, 3], [4, 5, 6]]).shrink_to(1, 2).tolist()
        [[1, 2]]
        """
        sizes = argfix(shape, *args)
        if len(sizes) != self.ndim:
            raise ShapeError(f"shrink_to {tuple(sizes)} needs one size per dimension of {self.shape}")
        return self.shrink(tuple(None if s is None else (0, s) for s in sizes))

    def pad_to(self, shape: Any, *args: int | None, value: Scalar = 0) -> Tensor:
        """Pad the end of each axis with `value` up to `shape[i]` (None keeps the axis).

        >>> Tensor([[1, 2]]).pad_to(2, 3).tolist()
        [[1, 2, 0], [0, 0, 0]]
        """
        sizes = argfix(shape, *args)
        if len(sizes) != self.ndim:
            raise ShapeError(f"pad_to {tuple(sizes)} needs one size per dimension of {self.shape}")
        grow = [None if s is None else size_diff(s, n) for s, n in zip(sizes, self.shape)]
        if any(g is not None and sint_min(g) < 0 for g in grow):
            raise ShapeError(f"pad_to {shape_str(sizes)} is smaller than {shape_str(self.shape)}; use shrink_to to cut")
        return self.pad(tuple(None if g is None else (0, g) for g in grow), value=value)

    # ---- rank changes ----
    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Merge the axes `start_dim..end_dim` (inclusive) into one.

        >>> Tensor([[[1, 2], [3, 4]]]).flatten(1).shape
        (1, 4)
        """
        if self.ndim == 0:
            return self.reshape(1)
        s, e = self._axis(start_dim), self._axis(end_dim)
        if s > e:
            raise ShapeError(f"flatten start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
        return self.reshape(self.shape[:s] + (prod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        """Split axis `dim` into axes of `sizes` (one may be -1).

        >>> Tensor([1, 2, 3, 4, 5, 6]).unflatten(0, (2, 3)).tolist()
        [[1, 2, 3], [4, 5, 6]]
        """
        d = self._axis(dim)
        return self.reshape(self.shape[:d] + (-1,) + self.shape[d + 1 :]).reshape(
            self.shape[:d] + tuple(self._unflatten_sizes(self.shape[d], sizes)) + self.shape[d + 1 :]
        )

    @staticmethod
    def _unflatten_sizes(n: int, sizes: Sequence[int]) -> list[int]:
        out = [int(s) for s in sizes]
        if out.count(-1) > 1:
            raise ShapeError(f"unflatten sizes {tuple(out)}: only one can be -1")
        if -1 in out:
            rest = prod(s for s in out if s != -1)
            if rest == 0 or n % rest:
                raise ShapeError(f"cannot unflatten an axis of size {n} into {tuple(out)}")
            out[out.index(-1)] = n // rest
        if prod(out) != n:
            raise ShapeError(
                f"cannot unflatten an axis of size {n} into {tuple(out)}: the sizes multiply to {prod(out)}"
            )
        return out

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        """Swap two axes.

        >>> Tensor([[1, 2, 3]]).transpose(0, 1).shape
        (3, 1)
        """
        order = list(range(self.ndim))
        a, b = self._axis(dim0), self._axis(dim1)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:  # noqa: N802
        """Axes 0 and 1 swapped (a 0-d or 1-d tensor is returned as is).

        >>> Tensor([[1, 2], [3, 4]]).T.tolist()
        [[1, 3], [2, 4]]
        """
        return self._t() if self.ndim < 2 else self.transpose()

    def unsqueeze(self, dim: int) -> Tensor:
        """Insert an axis of size 1 at `dim` (negative counts from the end of the result).

        >>> Tensor([1, 2]).unsqueeze(-1).shape
        (2, 1)
        """
        d = self._axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        """Remove axes of size 1: all of them, or those among `dim` (an axis or a sequence of axes).

        >>> Tensor([[[1], [2]]]).squeeze().shape
        (2,)
        >>> Tensor([[[1], [2]]]).squeeze((0, 1)).shape
        (2, 1)
        """
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        if self.ndim == 0:
            self._axis(dim if isinstance(dim, int) else 0)
            return self._t()
        axes = {self._axis(d) for d in ((dim,) if isinstance(dim, int) else dim)}
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in axes and s == 1)))

    # ---- joining and splitting ----
    def cat(self, *args: Tensor, dim: int = 0) -> Tensor:
        """Join self and `args` along axis `dim`; the other axes must match. Dtypes are promoted.

        >>> Tensor([[1, 2]]).cat(Tensor([[3, 4]]), dim=0).tolist()
        [[1, 2], [3, 4]]
        """
        ts: list[Tensor] = [self._t(), *args]
        if self.ndim == 0:
            raise ShapeError("cat of 0-d tensors: there is no axis to join along; use stack")
        d = self._axis(dim)
        for t in ts[1:]:
            if t.ndim != self.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != d):
                raise ShapeError(
                    f"cat along dim {d}: shape {t.shape} does not fit {self.shape}; only dim {d} may differ"
                )
            if t.device != self.device:
                raise DeviceMismatchError(f"cat of tensors on {self.device} and {t.device}; move them with .to() first")
        if len(ts) == 1:
            return ts[0]
        dt = least_upper_dtype(*(t.dtype for t in ts))
        total = canonical_sum(t.shape[d] for t in ts)  # i+j whether the parts come as (i, j) or (j, i)
        parts, offset = [], 0
        for t in ts:
            pad: list[tuple[Any, Any]] = [(0, 0)] * self.ndim
            pad[d] = (offset, total - offset - t.shape[d])
            part = t.cast(dt).pad(pad)
            if part.shape[d] is not total:  # a symbolic size: name it as the total
                part = part.reshape(part.shape[:d] + (total,) + part.shape[d + 1 :])
            parts.append(part)
            offset += t.shape[d]
        return functools.reduce(lambda a, b: a + b, parts)

    def stack(self, *args: Tensor, dim: int = 0) -> Tensor:
        """Join self and `args` (all of the same shape) along a new axis `dim`.

        >>> Tensor([1, 2]).stack(Tensor([3, 4]), dim=1).tolist()
        [[1, 3], [2, 4]]
        """
        d = self._axis(dim, self.ndim + 1)
        for t in args:
            if t.shape != self.shape:
                raise ShapeError(f"stack needs tensors of one shape, got {self.shape} and {t.shape}")
        first = self.unsqueeze(d)
        return first.cat(*(t.unsqueeze(d) for t in args), dim=d)

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        """Cut axis `dim` into pieces of `sizes` each (an int: equal pieces, the last may be smaller), or of the
        given sizes (which must add up to the axis).

        >>> [t.tolist() for t in Tensor([1, 2, 3, 4, 5]).split(2)]
        [[1, 2], [3, 4], [5]]
        """
        d = self._axis(dim)
        n = self.shape[d]
        if isinstance(sizes, int):
            if sizes <= 0:
                raise ShapeError(f"split size must be positive, got {sizes}")
            sizes = [min(sizes, n - i) for i in range(0, max(1, n), sizes)]
        elif sum(sizes) != n or any(s < 0 for s in sizes):
            raise ShapeError(
                f"split sizes {tuple(sizes)} must be non-negative and add up to {n} (axis {d} of {self.shape})"
            )
        out, start = [], 0
        for s in sizes:
            out.append(self._shrink_axis(d, start, start + s))
            start += s
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
        """Cut axis `dim` into `chunks` pieces of equal size (the last may be smaller, and there may be fewer).

        >>> [t.tolist() for t in Tensor([1, 2, 3, 4, 5]).chunk(3)]
        [[1, 2], [3, 4], [5]]
        """
        if chunks <= 0:
            raise ShapeError(f"chunk needs a positive number of chunks, got {chunks}")
        n = self.shape[self._axis(dim)]
        return list(self.split(ceildiv(n, chunks) if n else [0] * chunks, dim=dim))

    def unfold(self, dim: int, size: int, step: int) -> Tensor:
        """Sliding windows of `size` elements every `step` along `dim`: that axis becomes the window index and the
        window contents go to a new last axis.

        >>> Tensor([1, 2, 3, 4, 5]).unfold(0, 2, 2).tolist()
        [[1, 2], [3, 4]]
        """
        d = self._axis(dim) if self.ndim else 0
        x = self._t() if self.ndim else self.reshape(1)
        n = x.shape[d]
        if step <= 0 or size < 0 or size > n:
            raise ShapeError(f"unfold of size {size}, step {step} does not fit axis {d} of size {n} of {self.shape}")
        windows = (n - size) // step + 1
        order = [i for i in range(x.ndim) if i != d] + [d]
        xt = x.permute(order)
        lead = xt.shape[:-1]
        # row r of the axis tiled and re-cut in rows of n+1 elements starts at element r: windows start every step rows
        tiled = xt._tile_axis(xt.ndim - 1, ceildiv(windows * step * (n + 1), max(n, 1)))
        rows = tiled._shrink_axis(xt.ndim - 1, 0, windows * step * (n + 1)).reshape(lead + (windows, step, n + 1))
        win = rows.shrink(tuple([None] * len(lead) + [None, (0, 1), (0, size)])).reshape(lead + (windows, size))
        back = list(range(len(lead)))
        back.insert(d, len(lead))
        out = win.permute(back + [len(lead) + 1])
        return out if self.ndim else out.reshape(out.shape[1:])

    def meshgrid(self, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
        """Coordinate grids of self and `args` (1-d tensors). 'ij' gives shape (len(self), len(args[0]), ...),
        'xy' swaps the first two axes.

        >>> [t.tolist() for t in Tensor([1, 2]).meshgrid(Tensor([3, 4, 5]))]
        [[[1, 1, 1], [2, 2, 2]], [[3, 4, 5], [3, 4, 5]]]
        """
        if indexing not in ("ij", "xy"):
            raise ArgumentError(f"meshgrid indexing {indexing!r} is unknown; use 'ij' or 'xy'")
        ts = [t.reshape(-1) for t in (self._t(), *args)]
        if any(t.ndim != 1 for t in ts):
            raise ShapeError("meshgrid needs 0-d or 1-d tensors")
        axis_of = list(range(len(ts)))
        if indexing == "xy" and len(ts) >= 2:
            axis_of[0], axis_of[1] = 1, 0
        shape = [0] * len(ts)
        for t, a in zip(ts, axis_of):
            shape[a] = t.shape[0]
        out = []
        for t, a in zip(ts, axis_of):
            one = [1] * len(ts)
            one[a] = t.shape[0]
            out.append(t.reshape(one).expand(tuple(shape)))
        return tuple(out)

    # ---- tiling ----
    def repeat(self, repeats: Any, *args: int) -> Tensor:
        """Tile the tensor `repeats[i]` times along each axis (extra leading repeats add axes).

        >>> Tensor([1, 2]).repeat(2, 2).tolist()
        [[1, 2, 1, 2], [1, 2, 1, 2]]
        """
        reps = tuple(int(r) for r in argfix(repeats, *args))
        if len(reps) < self.ndim or any(r < 0 for r in reps):
            raise ShapeError(
                f"repeat {reps} needs a non-negative count for each of the {self.ndim} axes of {self.shape}"
            )
        base = (1,) * (len(reps) - self.ndim) + self.shape
        split = self.reshape(tuple(x for s in base for x in (1, s)))
        tiled = split.expand(tuple(x for r, s in zip(reps, base) for x in (r, s)))
        return tiled.reshape(tuple(r * s for r, s in zip(reps, base)))

    def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
        """Repeat each element `repeats` times along `dim` (None: of the flattened tensor).

        >>> Tensor([1, 2]).repeat_interleave(2).tolist()
        [1, 1, 2, 2]
        """
        if not isinstance(repeats, int) or repeats < 0:
            raise ShapeError(f"repeat_interleave takes a non-negative int count, got {repeats!r}")
        x = self.flatten() if dim is None else self._t()
        d = 0 if dim is None else self._axis(dim)
        grown = x.unsqueeze(d + 1).expand(x.shape[: d + 1] + (repeats,) + x.shape[d + 1 :])
        return grown.flatten(d, d + 1)

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """Shift elements along `dims` by `shifts`, wrapping around (dims None: over the flattened tensor).

        >>> Tensor([1, 2, 3, 4]).roll(1).tolist()
        [4, 1, 2, 3]
        """
        if dims is None:
            if not isinstance(shifts, int):
                raise ShapeError("roll without dims takes a single int shift")
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        sh = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        ds = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(sh) != len(ds):
            raise ShapeError(f"roll got {len(sh)} shifts for {len(ds)} dims; give one shift per dim")
        x = self._t()
        for s, d in zip(sh, ds):
            a = self._axis(d)
            n = x.shape[a]
            if n and s % n:
                x = x._tile_axis(a, 2)._shrink_axis(a, n - s % n, 2 * n - s % n)
        return x

    # ---- diagonals ----
    def diag(self) -> Tensor:
        """A square matrix with the 1-d self on its diagonal.

        >>> Tensor([1, 2]).diag().tolist()
        [[1, 0], [0, 2]]
        """
        if self.ndim != 1:
            raise ShapeError(
                f"diag builds a matrix from a 1-d tensor, got shape {self.shape}; use diagonal() to read one"
            )
        n = self.shape[0]
        rows = self.reshape(n, 1).pad(((0, 0), (0, n))).reshape(n * (n + 1))
        return rows.shrink(((0, n * n),)).reshape(n, n)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The diagonal of the matrices spanned by `dim1` and `dim2` (offset > 0: above it), as a new last axis.

        >>> Tensor([[1, 2], [3, 4]]).diagonal().tolist()
        [1, 4]
        """
        a, b = self._axis(dim1), self._axis(dim2)
        if a == b:
            raise ShapeError(f"diagonal needs two different dims, got {dim1} and {dim2}")
        x = self.permute([i for i in range(self.ndim) if i not in (a, b)] + [a, b])
        rows, cols = x.shape[-2], x.shape[-1]
        r0, c0 = (min(-offset, rows), 0) if offset < 0 else (0, min(offset, cols))
        m = max(0, min(rows - r0, cols - c0))
        lead = x.shape[:-2]
        sq = x.shrink(tuple([None] * len(lead) + [(r0, r0 + m), (c0, c0 + m)]))
        return sq.reshape(lead + (m * m,))._every(len(lead), m + 1, m)

    # ---- einops ----
    def rearrange(self, formula: str, **sizes: int) -> Tensor:
        """Reshape and permute with an einops pattern: `'b (h w) c -> b h w c'`, groups in parentheses, `...` for
        the other axes, `1` or `()` for unit axes, and the sizes of split axes as keyword arguments.

        >>> Tensor([[1, 2, 3, 4]]).rearrange("b (h w) -> b w h", h=2).tolist()
        [[[1, 3], [2, 4]]]
        """
        split, order, merged = plan_rearrange(formula, self.shape, sizes)
        return self.reshape(split).permute(order).reshape(merged)
