"""Linear algebra, convolution, pooling, resampling and sorting."""

from __future__ import annotations

from xgrad.mixin.indexing import IndexingMixin


class LinalgMixin(IndexingMixin):
    __slots__ = ()
