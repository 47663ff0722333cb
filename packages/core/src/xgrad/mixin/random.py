"""Random numbers from a counter-based Threefry-2x32 generator computed in kernels, and the init helpers."""

from __future__ import annotations

from xgrad.mixin.creation import CreationMixin


class RandomMixin(CreationMixin):
    __slots__ = ()
