"""The core of every Tensor: its graph node and the facts read from it. Every mixin (xgrad/mixin/*.py) subclasses
TensorBase alone and `Tensor` lists them all; a mixin reaches another mixin's methods through `_t()` (self, typed as
the Tensor it is), so each type-checks on its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, cast

from xgrad.dtype import DType, dtypes
from xgrad.errors import IndexingError, ShapeError, TensorUsageError
from xgrad.mixin.common import Scalar
from xgrad.uop.ops import UOp
from xgrad.uop.symshape import same_symbolic_size, sym_prod

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


class TensorBase:
    __slots__ = ()
    uop: UOp
    _concrete: ClassVar[type[Tensor] | None] = None  # the Tensor class: it registers itself (`concrete=True`)

    def __init_subclass__(cls, concrete: bool = False, **kwargs: Any) -> None:
        """`class Tensor(...mixins..., concrete=True)` records the class the mixins build their results as, so no
        mixin imports tensor.py (which imports them all). A subclass of Tensor is not registered."""
        super().__init_subclass__(**kwargs)
        if concrete:
            TensorBase._concrete = cast("type[Tensor]", cls)

    @staticmethod
    def _tensor_cls() -> type[Tensor]:
        assert TensorBase._concrete is not None, "xgrad.tensor defines Tensor before any tensor exists"
        return TensorBase._concrete

    def _new(self, uop: UOp) -> Tensor:
        """A Tensor for a new graph node."""
        return self._tensor_cls()(uop)

    def _operand(self, uop: UOp) -> Tensor:
        """A Tensor for a node the op making it consumes at once (Tensor makes it without bookkeeping)."""
        return self._new(uop)

    def _t(self) -> Tensor:
        """self, typed as the Tensor it is."""
        return self  # type: ignore[return-value]  # every TensorBase is a Tensor

    # ---- properties ----
    @property
    def shape(self) -> tuple[int, ...]:
        """The sizes. A symbolic size (a UOp over bound Variables, see `xgrad.uop.symshape`) is returned as is: the
        annotation says int because nearly all code works on concrete shapes.

        >>> Tensor.zeros(2, 3).shape
        (2, 3)"""
        return self.uop.shape  # type: ignore[return-value]  # a tensor's node always has a shape

    @property
    def dtype(self) -> DType:
        """The element type.

        >>> Tensor([1, 2]).dtype == dtypes.int32, Tensor([1.0]).dtype == dtypes.float32
        (True, True)"""
        return self.uop.dtype

    @property
    def device(self) -> str:
        dev = self.uop.device
        assert dev is not None
        return dev

    @property
    def ndim(self) -> int:
        """The number of dimensions.

        >>> Tensor.zeros(2, 3, 4).ndim
        3"""
        return len(self.uop.shape)  # type: ignore[arg-type]

    def numel(self) -> int:
        """The number of elements.

        >>> Tensor.zeros(2, 3).numel()
        6"""
        n = sym_prod(self.shape)
        return cast(int, n) if isinstance(n, UOp) else int(n)  # symbolic shapes: a symbolic count

    def element_size(self) -> int:
        """Bytes per element.

        >>> Tensor([1.0]).element_size(), Tensor([1.0], dtype=dtypes.float16).element_size()
        (4, 2)"""
        return self.dtype.itemsize

    def nbytes(self) -> int:
        """Bytes of all elements.

        >>> Tensor.zeros(2, 3).nbytes()
        24"""
        return self.numel() * self.element_size()

    def is_floating_point(self) -> bool:
        """Whether the dtype is a float type.

        >>> Tensor([1.0]).is_floating_point(), Tensor([1]).is_floating_point()
        (True, False)"""
        return dtypes.is_float(self.dtype)

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        """The shape, or the size of dimension `dim` (negative counts from the end).

        >>> Tensor.zeros(2, 3).size(), Tensor.zeros(2, 3).size(-1)
        ((2, 3), 3)"""
        return self.shape if dim is None else self.shape[self._axis(dim)]

    def __len__(self) -> int:
        if not self.shape:
            raise TensorUsageError("len() of a 0-d tensor; use .shape or .numel()")
        return self.shape[0]

    def __bool__(self) -> bool:
        raise TensorUsageError("the truth value of a Tensor is ambiguous; use .item() or .any()/.all()")

    def __repr__(self) -> str:
        return f"<Tensor {self.device} {self.shape} {self.dtype.name}>"

    def _axis(self, axis: int, ndim: int | None = None) -> int:
        n = self.ndim if ndim is None else ndim
        if not -max(n, 1) <= axis < max(n, 1):
            raise IndexingError(f"axis {axis} is out of range for a tensor with {n} dimensions")
        return axis + n if axis < 0 else axis

    def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        if self.shape == shape:
            return self._t()
        if len(shape) < self.ndim:
            raise ShapeError(f"cannot broadcast shape {self.shape} to {shape}")
        padded = (1,) * (len(shape) - self.ndim) + self.shape
        # a symbolic size equal to the target's but written differently (j+i for i+j) is renamed by the reshape
        padded = tuple(s if p is not s and same_symbolic_size(p, s) else p for p, s in zip(padded, shape))
        if any(p != s and p != 1 for p, s in zip(padded, shape)):
            raise ShapeError(f"cannot broadcast shape {self.shape} to {shape}")
        return self._new(self.uop.reshape(padded).expand(shape))

    def _const(self, value: Scalar, dtype: DType | None = None, operand: bool = False) -> Tensor:
        """`value` broadcast to self's shape, on self's device; `operand`: only to be consumed at once by an op (see
        `_operand`)."""
        uop = UOp.const(dtype or self.dtype, value, self.device, self.shape)
        return self._operand(uop) if operand else self._new(uop)
