"""Autograd and parameters: the gradients of a tensor (`gradient`, `backward`), what an optimizer trains (`is_param`,
torch's `requires_grad` alias), training mode, custom kernels with their backward.

tinygrad's rule: every tensor is a parameter (`is_param` True, the results of ops too) unless marked with
`is_param_(False)`; `backward()` fills `.grad` of every live floating-point tensor its loss depends on (not through
`detach()`, not bare constants); optimizers train the `is_param` tensors they are given. The autodiff itself is
`xgrad.gradient`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from xgrad.custom_kernel import custom_kernel
from xgrad.dtype import dtypes
from xgrad.engine.realize import all_tensors
from xgrad.errors import (
    DeviceMismatchError,
    GradientDTypeError,
    GradientError,
    GradientShapeError,
    ShapeError,
)
from xgrad.gradient import compute_gradient, nodes_with_gradient_path
from xgrad.helpers import Context
from xgrad.hostdata import np_for_py, np_to_uop
from xgrad.mixin.base import TensorBase
from xgrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from xgrad.tensor import Tensor


class AutogradMixin(TensorBase):
    __slots__ = ()
    grad: Tensor | None
    is_param: bool
    _requires_grad: bool | None

    def _own_buffer(self) -> None:
        """Give a bare constant (`Tensor(2.0)`) a buffer of its own: equal constants are one hash-consed node, so a
        gradient with respect to one would be the gradient with respect to all of them."""
        device = self.uop.device
        assert device is not None
        self._t().uop = np_to_uop(np.full((), self.uop.arg, dtype=np_for_py(self.dtype)), device, self.dtype)

    def custom_kernel(
        self, *lst: Tensor, fxn: Callable[..., Any], grad_fxn: Callable[..., Any] | None = None
    ) -> list[Tensor]:
        """Run a kernel written in UOps on the buffers of self and `lst` (outputs and inputs alike: the kernel writes
        in place); returns each tensor after the kernel, as tinygrad's. `fxn` gets one `KernelArg` per tensor and
        returns the kernel's SINK (see `xgrad.custom_kernel`). `grad_fxn(*grads, call)` gives the backward: the
        gradients of the outputs used (`call.src[1:]` are the arguments) -> one gradient UOp or None per argument.

        >>> from xgrad.uop.ops import KernelInfo, UOp
        >>> def add(c, a, b):
        ...     i = UOp.range(c.numel(), 0)
        ...     return c[i].store(a[i] + b[i]).sink(arg=KernelInfo(name="add"))
        >>> out = Tensor.empty(3).custom_kernel(Tensor([1.0, 2.0, 3.0]), Tensor([10.0, 20.0, 30.0]), fxn=add)[0]
        >>> out.tolist()
        [11.0, 22.0, 33.0]
        """
        return custom_kernel((self._t(), *lst), fxn, grad_fxn)

    # ---- autograd ----
    def contiguous_backward(self) -> Tensor:
        """The same values; in the backward pass the gradient flowing through here is made contiguous (realized).

        >>> x = Tensor([1.0, 2.0])
        >>> x.contiguous_backward().tolist()
        [1.0, 2.0]
        """
        return self._new(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)))

    def is_param_(self, is_param: bool = True) -> Tensor:
        """Set `is_param` in place: whether an optimizer given this tensor trains it (every tensor is a parameter
        unless marked otherwise, as in tinygrad; `is_param_(False)` marks a buffer, which an optimizer only realizes).
        Returns self.

        >>> Tensor([1.0]).is_param, Tensor([1.0]).is_param_(False).is_param
        (True, False)
        """
        t = self._t()
        t.is_param = is_param
        return t

    @staticmethod
    def train(mode: bool = True) -> Context:
        """Training mode (`mode=False`: out of it) for a `with` block or a decorated function, as tinygrad's
        `Tensor.train()`: the same as `Context(TRAINING=1)`, which optimizer steps, dropout and BatchNorm statistics
        read. `Tensor.training` says whether it is on (setting it sets the knob, as in tinygrad).

        >>> with Tensor.train():
        ...     Tensor.training
        True
        >>> Tensor.training
        False
        """
        return Context(TRAINING=int(mode))

    def requires_grad_(self, requires_grad: bool | None = True) -> Tensor:
        """Set `requires_grad` in place (see the class docstring), and `is_param` with it when a bool is given;
        returns self. False freezes a tensor: `backward()` gives it no gradient and optimizers only realize it.

        >>> w, frozen = Tensor([2.0]).requires_grad_(), Tensor([3.0]).requires_grad_(False)
        >>> _ = (w * frozen).sum().backward()
        >>> w.grad.tolist(), frozen.grad, frozen.is_param
        ([3.0], None, False)
        """
        t = self._t()
        t._requires_grad = requires_grad
        if requires_grad is not None:
            t.is_param = requires_grad
        if requires_grad and t.uop.op is Ops.CONST:
            t._own_buffer()
        return t

    @property
    def trainable(self) -> bool:
        """What an optimizer trains: `is_param` set and `requires_grad` not False.

        >>> Tensor([1.0]).trainable, Tensor([1.0], requires_grad=False).trainable
        (True, False)
        >>> Tensor([1.0]).is_param_(False).trainable
        False
        """
        return self.is_param and self._requires_grad is not False

    @property
    def requires_grad(self) -> bool | None:
        """torch's flag, kept as an alias (see the class docstring): None unless set. Setting it is `requires_grad_`,
        so old tinygrad code's `t.requires_grad = False` also makes `t` a buffer (`is_param` False).

        >>> t = Tensor([1.0])
        >>> t.requires_grad, t.is_param
        (None, True)
        >>> t.requires_grad = False
        >>> t.requires_grad, t.is_param
        (False, False)
        """
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        self.requires_grad_(value)

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """The gradients of this tensor with respect to `targets`, as new lazy tensors (nothing is mutated).

        Only floating-point tensors have gradients. A non-scalar tensor needs `gradient`, the gradient of its output.
        A target this tensor does not depend on (or only through non-differentiable ops) gets zeros; a bare constant
        target (`Tensor(2.0)`) raises, as in tinygrad.

        >>> x = Tensor([1.0, 2.0, 3.0])
        >>> w = Tensor([4.0, 5.0, 6.0])
        >>> dx, dw = (x * w).sum().gradient(x, w)
        >>> dx.tolist(), dw.tolist()
        ([4.0, 5.0, 6.0], [1.0, 2.0, 3.0])
        """
        for t, what in [(self, "the differentiated tensor"), *((t, "a gradient target") for t in targets)]:
            if not dtypes.is_float(t.dtype) or t.dtype in dtypes.weaks:
                raise GradientDTypeError(f"{what} has dtype {t.dtype.name}; only floating-point tensors have gradients")
        for i, t in enumerate(targets):
            if t.uop.op is Ops.CONST:
                raise GradientError(
                    f"gradient target {i} is a bare constant ({t.uop.arg!r}), the same graph node as every equal "
                    "constant; make it with `requires_grad=True` (a buffer of its own) or from a list (`Tensor([2.0])`)"
                )
        if gradient is None:
            if self.shape != ():
                raise GradientShapeError(
                    f"gradient of a tensor of shape {self.shape} needs `gradient=` (a tensor of that shape); "
                    "only a 0-d (scalar) tensor has an implicit gradient of 1.0"
                )
            root_grad = UOp.const(self.dtype, 1.0, self.device, ())
        else:
            if gradient.shape != self.shape and gradient.numel() == self.numel():
                gradient = gradient.reshape(self.shape)  # as tinygrad: Tensor([3.0]) for a 0-d loss
            if gradient.shape != self.shape:
                raise ShapeError(f"gradient has shape {gradient.shape}, the tensor has shape {self.shape}")
            if gradient.device != self.device:
                raise DeviceMismatchError(
                    f"gradient is on {gradient.device}, the tensor on {self.device}; move it with .to()"
                )
            root_grad = gradient.uop.cast(self.dtype)
        grads = compute_gradient(self.uop, root_grad, {t.uop for t in targets})
        return [self._new(grads[t.uop]) if t.uop in grads else t.zeros_like() for t in targets]

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Compute the gradient of this tensor for every live floating-point tensor in its graph and store it in
        `.grad`, or add it to an existing `.grad` (with `assign`). Skipped: what is only reached through `detach()`,
        tensors with `requires_grad=False` (e.g. the input batches of a training loop, whose gradients would
        otherwise be computed and added up every step), and bare 0-d constants such as `Tensor(2.0)` (as tinygrad;
        `Tensor(2.0, requires_grad=True)` has a buffer and gets one). `is_param` does not matter here: it is what
        optimizers read. A non-scalar tensor needs `gradient`. Returns self.

        >>> w = Tensor([1.0, 2.0, 3.0])
        >>> (w * w).sum().backward().item()
        14.0
        >>> w.grad.tolist()
        [2.0, 4.0, 6.0]
        """
        in_graph = nodes_with_gradient_path(self.uop)
        targets = [
            t
            for t in all_tensors.members()
            if t.uop in in_graph
            and dtypes.is_float(t.dtype)
            and t.dtype not in dtypes.weaks
            and t.uop.device is not None
            and t._requires_grad is not False
            and t.uop.op is not Ops.CONST
        ]
        for t, g in zip(targets, self.gradient(*targets, gradient=gradient)):
            if t.grad is None:
                t.grad = g
            else:
                t.grad.assign(t.grad + g)
        return self._t()
