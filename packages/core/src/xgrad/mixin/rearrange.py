"""The einops pattern language of `Tensor.rearrange`, turned into one reshape, one permute and one reshape.

In: a pattern such as `'b (h w) ... -> b h (w ...)'`, the input shape and the named sizes. Out: the shape that splits
every input axis into elementary axes, the order of those axes on the right side, and the shape that groups them.
"""

from __future__ import annotations

import re

from xgrad.errors import ShapeError
from xgrad.helpers import prod

ELLIPSIS = "…"
_TOKEN = re.compile(r"\.\.\.|…|\(|\)|[A-Za-z_][A-Za-z0-9_]*|\d+|\S")

Side = list[list[str]]  # one group of elementary axis names per dimension; an empty group is a unit axis


def _parse_side(text: str, formula: str) -> Side:
    groups: Side = []
    current: list[str] | None = None
    for tok in _TOKEN.findall(text):
        if tok == "(":
            if current is not None:
                raise ShapeError(f"rearrange pattern {formula!r}: parentheses cannot nest")
            current = []
        elif tok == ")":
            if current is None:
                raise ShapeError(f"rearrange pattern {formula!r}: ')' without '('")
            groups.append(current)
            current = None
        elif tok in ("...", ELLIPSIS) or tok.isidentifier():
            name = ELLIPSIS if tok == "..." else tok
            if current is None:
                groups.append([name])
            else:
                current.append(name)
        elif tok.isdigit():
            if tok != "1":
                raise ShapeError(f"rearrange pattern {formula!r}: only the unit axis 1 may be a number, not {tok}")
            if current is None:
                groups.append([])
        else:
            raise ShapeError(f"rearrange pattern {formula!r}: unexpected {tok!r}")
    if current is not None:
        raise ShapeError(f"rearrange pattern {formula!r}: '(' is never closed")
    names = [n for g in groups for n in g]
    if len(names) != len(set(names)):
        raise ShapeError(f"rearrange pattern {formula!r}: an axis name appears twice on one side")
    return groups


def _expand_ellipsis(side: Side, count: int) -> Side:
    dots = [f"{ELLIPSIS}{i}" for i in range(count)]
    out: Side = []
    for g in side:
        if g == [ELLIPSIS]:
            out.extend([d] for d in dots)
        else:
            out.append([d for n in g for d in (dots if n == ELLIPSIS else [n])])
    return out


def plan_rearrange(
    formula: str, shape: tuple[int, ...], sizes: dict[str, int]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(split shape, permutation, merged shape) that carry out `formula` on a tensor of `shape`."""
    if formula.count("->") != 1:
        raise ShapeError(f"rearrange pattern {formula!r} needs exactly one '->' between input and output")
    left_text, right_text = formula.split("->")
    left, right = _parse_side(left_text, formula), _parse_side(right_text, formula)
    left_dots = [g for g in left if ELLIPSIS in g]
    if left_dots and left_dots[0] != [ELLIPSIS]:
        raise ShapeError(f"rearrange pattern {formula!r}: '...' cannot be inside parentheses on the input side")
    has_dots = bool(left_dots)
    if has_dots != any(ELLIPSIS in g for g in right):
        raise ShapeError(f"rearrange pattern {formula!r}: '...' must appear on both sides or on neither")
    fixed = len(left) - has_dots
    if (not has_dots and fixed != len(shape)) or (has_dots and fixed > len(shape)):
        raise ShapeError(f"rearrange pattern {formula!r} has {fixed} input axes, the tensor has shape {shape}")
    left = _expand_ellipsis(left, len(shape) - fixed)
    right = _expand_ellipsis(right, len(shape) - fixed)
    left_names = [n for g in left for n in g]
    right_names = [n for g in right for n in g]
    if set(left_names) != set(right_names):
        missing = set(left_names) ^ set(right_names)
        raise ShapeError(f"rearrange pattern {formula!r}: axes {sorted(missing)} appear on one side only")
    unknown_sizes = set(sizes) - set(left_names)
    if unknown_sizes:
        raise ShapeError(f"rearrange got sizes for {sorted(unknown_sizes)}, which are not in the pattern {formula!r}")
    size_of: dict[str, int] = dict(sizes)
    for group, dim in zip(left, shape):
        unknown = [n for n in group if n not in size_of]
        known = prod(size_of[n] for n in group if n in size_of)
        if len(unknown) > 1:
            raise ShapeError(f"rearrange pattern {formula!r}: give the size of all but one of {unknown}")
        if unknown:
            if known == 0 or dim % known:
                raise ShapeError(f"rearrange: axis of size {dim} cannot be split into {group} with sizes {sizes}")
            size_of[unknown[0]] = dim // known
        elif known != dim:
            raise ShapeError(f"rearrange: axis of size {dim} does not match {group} with sizes {sizes}")
    split = tuple(size_of[n] for n in left_names)
    order = tuple(left_names.index(n) for n in right_names)
    merged = tuple(prod(size_of[n] for n in g) for g in right)
    return split, order, merged
