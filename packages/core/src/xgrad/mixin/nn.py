"""Neural-network functions: losses, normalization, attention, dropout."""

from __future__ import annotations

from xgrad.mixin.linalg import LinalgMixin


class NNMixin(LinalgMixin):
    __slots__ = ()
