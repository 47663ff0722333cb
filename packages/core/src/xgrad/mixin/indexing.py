"""Joining, splitting, tiling and indexing: cat, stack, split, getitem/setitem, gather, scatter, one_hot, ..."""

from __future__ import annotations

from xgrad.mixin.random import RandomMixin


class IndexingMixin(RandomMixin):
    __slots__ = ()
