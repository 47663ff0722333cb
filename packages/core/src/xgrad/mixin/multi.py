"""Multi-device tensors: one logical tensor over a tuple of devices, split on one axis or replicated.

A multi-device tensor reports a tuple device (`("CPU", "CPU:1")`). Its graph is the usual tensor graph on that tuple;
`xgrad.engine.multi` lowers it to one graph per device (with real copies and allreduces) when it is realized.
`shard_axis` tells the split axis (tinygrad spells it `.uop.axis`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xgrad.device import Device, multi_devices
from xgrad.errors import ShardingError
from xgrad.mixin.base import TensorBase
from xgrad.uop.ops import Ops, UOp
from xgrad.uop.sharding import split_axis

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

DeviceLike = str | tuple[str, ...]


class MultiMixin(TensorBase):
    __slots__ = ()

    @property
    def device(self) -> Any:
        """The device name, or a tuple of names for a multi-device tensor.

        >>> Tensor([1, 2]).shard(("CPU", "CPU:1")).device
        ('CPU', 'CPU:1')
        """
        dev = self.uop.device
        assert dev is not None
        return multi_devices(dev) or dev

    @property
    def shard_axis(self) -> int | None:
        """The axis a multi-device tensor is split on; None when it is replicated (or on one device).

        >>> Tensor([[1, 2], [3, 4]]).shard(("CPU", "CPU:1"), axis=1).shard_axis
        1
        """
        return split_axis(self.uop)

    def shard(self, devices: tuple[str, ...] | list[str], axis: int | None = None) -> Tensor:
        """This tensor over `devices`: split evenly along `axis` (one piece per device, in order) or replicated on
        every device when `axis` is None. Raises ShardingError (a RuntimeError) when the axis does not divide evenly.

        >>> t = Tensor([1, 2, 3, 4]).shard(("CPU", "CPU:1"), axis=0)
        >>> t.device, t.shard_axis, t.tolist()
        (('CPU', 'CPU:1'), 0, [1, 2, 3, 4])
        """
        if not isinstance(devices, (tuple, list)) or not devices:
            raise ShardingError(f"shard needs a tuple of devices like ('CPU', 'CPU:1'), got {devices!r}")
        name = Device.canonicalize(tuple(devices))
        ax = None if axis is None else self._axis(axis)
        if ax is not None and self.shape[ax] % len(devices):
            raise ShardingError(
                f"cannot shard shape {self.shape} on axis {ax} over {len(devices)} devices: {self.shape[ax]} is not a "
                f"multiple of {len(devices)}; pick another axis, pad the tensor, or replicate it (axis=None)"
            )
        return self._new(UOp(Ops.COPY, self.dtype, (self.uop, UOp(Ops.DEVICE, arg=name)), ax)).is_param_(
            self._t().is_param
        )

    def shard_(self, devices: tuple[str, ...] | list[str], axis: int | None = None) -> Tensor:
        """`shard` in place: this tensor now lives on `devices`. Returns self.

        >>> t = Tensor([1.0, 2.0])
        >>> t.shard_(("CPU", "CPU:1")).device
        ('CPU', 'CPU:1')
        """
        t = self._t()
        t.uop = t.shard(devices, axis).uop
        return t

    def shard_like(self, y: Tensor) -> Tensor:
        """This tensor placed like `y`: on y's devices with y's split axis (or moved to y's single device).

        >>> y = Tensor([[1, 2], [3, 4]]).shard(("CPU", "CPU:1"), axis=0)
        >>> Tensor([[5, 6], [7, 8]]).shard_like(y).shard_axis
        0
        """
        if isinstance(y.device, tuple):
            return self.shard(y.device, y.shard_axis)
        return self._t().to(y.device)

    def to_(self, device: DeviceLike | None) -> Tensor:
        """`to` in place (its `.grad` moves too). A tuple of devices replicates the tensor on each. Returns self.

        >>> w = Tensor([1.0, 2.0])
        >>> w.to_(("CPU", "CPU:1")).device
        ('CPU', 'CPU:1')
        """
        t = self._t()
        t.uop = t.to(device).uop
        if t.grad is not None:
            t.grad.to_(device)
        return t

    def _to_multi(self, device: DeviceLike | None) -> Tensor:
        """`to` for tuples of devices (replicate) and from multi-device tensors (gather, or keep when unchanged)."""
        name = Device.canonicalize(device) if device is not None else Device.DEFAULT
        if name == Device.canonicalize(self.device):
            return self._t()
        return self._new(UOp(Ops.COPY, self.dtype, (self.uop, UOp(Ops.DEVICE, arg=name)))).is_param_(self._t().is_param)
