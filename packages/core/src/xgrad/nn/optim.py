"""Optimizers: SGD, LARS, Muon, LAMB, Adam, AdamW, and `OptimizerGroup` to step several at once.

An optimizer updates lazily: `schedule_step()` builds each new parameter and state value as a graph and `assign`s it
into the existing buffer, so one `realize` of the returned tensors runs the whole update (and a TinyJit can capture
it). The learning rate is a tensor (`opt.lr`), so a schedule can change it with `opt.lr.assign(...)` without new
kernels being compiled. Steps are refused outside training mode, `with Context(TRAINING=1):`.

Update rules (g: gradient, p: parameter, lr: learning rate, wd: weight decay):

- SGD / LARS, `classic=False` (torch's SGD): `g += wd*p; b = momentum*b + g; g = g + momentum*b if nesterov else b;
  p -= lr*r*g`. `classic=True` folds the step size in before the momentum (`b = momentum*b + lr*r*g; p -= b`), as
  the LARS paper does. r is LARS's trust ratio `tcoef*|p| / (|g| + wd*|p|)` (1 where a norm is 0); SGD has tcoef 0,
  so r = 1. `pre_wd=False` decays decoupled instead: `p *= 1 - lr*wd` before the update.
- Muon: LARS without trust ratio, with decoupled weight decay and the momentum update orthogonalized by Newton-Schulz
  iterations, scaled by `sqrt(max(1, rows/cols))`. torch's Muon dampens the momentum (`b = lerp(b, g, 1-momentum)`);
  that only scales the update by `1-momentum`, which the orthogonalization normalizes away, so both agree.
- LAMB / Adam / AdamW: `m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; u = (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) +
  wd*p; p -= lr*r*u`, r the layer-wise trust ratio `|p|/|u|` for LAMB and 1 for Adam/AdamW (AdamW's decay is
  decoupled, as in torch).

State (momentum, moments) is kept in `OPTIM_DTYPE` (float32 by default); the update is computed in the wider of that
and the parameter's dtype, then cast back to the parameter's dtype. With `device=` the state lives, and the update is
computed, on that device (e.g. CPU offload); grads and parameters are copied there and the new values copied back.
With `fused=True` (default from the `FUSE_OPTIM` knob) every parameter is flattened into one vector and updated as
one: fewer, larger kernels, but LARS/LAMB trust ratios are then taken over all parameters together.
"""

from __future__ import annotations

from collections.abc import Sequence

from xgrad.dtype import DType, dtypes, least_upper_dtype, to_dtype
from xgrad.errors import XgradError
from xgrad.helpers import CONST_LR, FUSE_OPTIM, OPTIM_DTYPE, TRAINING, dedup
from xgrad.mixin.common import canonical_device
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops


class OptimizerError(XgradError, RuntimeError):
    """An optimizer was built or stepped wrongly (no parameters, missing grads, outside training mode)."""


class OptimizerArgumentError(OptimizerError, ValueError):
    """A negative learning rate, momentum or weight decay: a `ValueError` as tinygrad's (and an `OptimizerError`)."""


def _check_non_negative(**values: float) -> None:
    for name, v in values.items():
        if v < 0:
            raise OptimizerArgumentError(f"invalid {name} {v}: it must be >= 0")


class Optimizer:
    """Base of the optimizers: holds the parameters, the learning rate and the state; subclasses give the update.

    Of `params`, the `trainable` tensors are trained: as in tinygrad every tensor is a parameter unless marked
    otherwise (`is_param_(False)`, or frozen with `requires_grad=False`); the others (e.g. running statistics) are
    only realized with each step, so updates assigned to them happen in the same run.

    >>> from xgrad import Context
    >>> w = Tensor([1.0, 2.0])
    >>> opt = SGD([w], lr=0.5)
    >>> _ = (w * w).sum().backward()
    >>> with Context(TRAINING=1):
    ...     opt.step()
    >>> w.tolist()
    [0.0, 0.0]
    """

    def __init__(self, params: Sequence[Tensor], lr: float, device: str | None = None, fused: bool | None = None):
        _check_non_negative(learning_rate=lr)
        given = dedup(params)
        self.params: list[Tensor] = [t for t in given if t.trainable]
        self.buffers: list[Tensor] = [t for t in given if not t.trainable]
        if not self.params:
            raise OptimizerError(
                "the optimizer got no trainable tensors: every one given is marked `is_param_(False)` or "
                "`requires_grad=False` (or none was given); pass the parameters, e.g. "
                "`SGD(nn.state.get_parameters(model))`, or set `t.is_param_()` on those to train"
            )
        for p in self.params:
            if not dtypes.is_float(p.dtype):
                raise OptimizerError(f"parameter of dtype {p.dtype.name} cannot be trained; use a float dtype")
        # a parameter must own a buffer for the update to be assigned into it
        Tensor.realize(*self.params)
        self.device: str | None = canonical_device(device) if device is not None else None
        self.fused = bool(FUSE_OPTIM.value) if fused is None else fused
        self.state_dtype: DType = to_dtype(OPTIM_DTYPE.value)
        lr_device = self.device or self.params[0].device
        lr_dtype = least_upper_dtype(dtypes.float32, *(p.dtype for p in self.params))
        self.lr: Tensor = (
            Tensor(lr, device=lr_device, dtype=lr_dtype)
            if CONST_LR.value
            else Tensor([lr], device=lr_device, dtype=lr_dtype).realize()
        ).is_param_(False)  # the optimizer's own state tensors are buffers, as tinygrad's

    # ---- what a subclass uses ----
    def _slots(self) -> list[tuple[tuple[int, ...], str]]:
        """(shape, device) of each tensor the update sees: one per parameter, or one flat vector when fused."""
        if self.fused:
            return [((sum(p.numel() for p in self.params),), self.device or self.params[0].device)]
        return [(p.shape, self.device or p.device) for p in self.params]

    def _zeros_state(self, fill: float = 0.0) -> list[Tensor]:
        """One realized state buffer per slot, filled with `fill`."""
        return [
            Tensor.full(shape, fill, device=dev, dtype=self.state_dtype).contiguous().realize().is_param_(False)
            for shape, dev in self._slots()
        ]

    def _lr_on(self, device: str, dtype: DType) -> Tensor:
        lr = self.lr.reshape(()) if self.lr.shape else self.lr
        return lr.to(device).cast(dtype)

    def _step(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        """New values of `params` from `grads` (same device and dtype as each param); assigns the state itself."""
        raise NotImplementedError

    def _state(self) -> list[Tensor]:
        """The state tensors realized with each step."""
        return []

    # ---- public ----
    def zero_grad(self) -> None:
        """Forget the gradients of the parameters (set `.grad` to None), so the next `backward()` starts afresh."""
        for p in self.params:
            p.grad = None

    def schedule_step(self) -> list[Tensor]:
        """Assign the update into the parameters and the state, lazily; returns the tensors to realize
        (parameters, state, grads, buffers). Raises unless in training mode (`Context(TRAINING=1)`)."""
        if not TRAINING:
            raise OptimizerError(
                f"{type(self).__name__}.step() outside training mode; wrap the training step in "
                "`with Tensor.train():` or `with Context(TRAINING=1):` (from xgrad import Context)"
            )
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise OptimizerError(
                f"parameter(s) {missing} of shape(s) {[self.params[i].shape for i in missing]} have no gradient; "
                "call loss.backward() before step(), and leave out of the optimizer what the loss does not use"
            )
        slots = self._slots()
        # the grads are realized with the update: read lazily after it, they would see the new parameter values
        for p in self.params:
            if p.grad is not None and not _is_realized(p.grad):
                p.grad = p.grad.contiguous()
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.fused:
            dev = slots[0][1]
            cdt = least_upper_dtype(self.state_dtype, *(p.dtype for p in self.params))
            flat_p = _concat_flat([p.detach().to(dev).cast(cdt) for p in self.params])
            flat_g = _concat_flat([g.to(dev).cast(cdt) for g in grads])
            new_flat = self._step([flat_p], [flat_g])[0]
            offsets = [0, *_cumsum([p.numel() for p in self.params])]
            new = [new_flat.shrink(((a, b),)).reshape(p.shape) for p, a, b in zip(self.params, offsets, offsets[1:])]
        else:
            ps, gs = [], []
            for p, g, (_, dev) in zip(self.params, grads, slots):
                cdt = least_upper_dtype(self.state_dtype, p.dtype)
                ps.append(p.detach().to(dev).cast(cdt))
                gs.append(g.to(dev).cast(cdt))
            new = self._step(ps, gs)
        for p, value in zip(self.params, new):
            p.assign(value.cast(p.dtype).to(p.device))
        return [*self.params, *self._state(), *grads, *self.buffers]

    def step(self) -> None:
        """One optimizer step: `schedule_step()` and realize it (one run for every parameter and state update).

        The grads are realized with it. Other lazy tensors computed from the parameters (the loss) read the new
        values if realized after the step; realize them with it: `Tensor.realize(loss, *opt.schedule_step())`."""
        todo = self.schedule_step()
        todo[0].realize(*todo[1:])


class OptimizerGroup(Optimizer):
    """Several optimizers stepped together (e.g. Muon for matrices, AdamW for the rest); `group[i]` is the i-th.

    >>> from xgrad import Context
    >>> w, b = Tensor([[1.0]]), Tensor([1.0])
    >>> opt = OptimizerGroup(SGD([w], lr=0.5), Adam([b], lr=0.5))
    >>> _ = (w.sum() * b.sum()).backward()
    >>> with Context(TRAINING=1):
    ...     opt.step()
    >>> w.tolist(), round(b.item(), 4)
    ([[0.5]], 0.5)
    """

    def __init__(self, *optimizers: Optimizer):
        if not optimizers:
            raise OptimizerError("OptimizerGroup needs at least one optimizer: OptimizerGroup(opt1, opt2, ...)")
        self.optimizers = list(optimizers)
        self.params = [p for o in self.optimizers for p in o.params]
        self.buffers = [b for o in self.optimizers for b in o.buffers]

    def __getitem__(self, i: int) -> Optimizer:
        return self.optimizers[i]

    def __len__(self) -> int:
        return len(self.optimizers)

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()

    def schedule_step(self) -> list[Tensor]:
        return dedup(t for o in self.optimizers for t in o.schedule_step())


class LARS(Optimizer):
    """LARS (You et al. 2017, layer-wise adaptive rate scaling): SGD with momentum whose step per parameter is scaled
    by the trust ratio `tcoef*|p| / (|g| + weight_decay*|p|)`. The base of SGD (tcoef 0) and Muon (`ns_steps` > 0).
    See the module docstring for the exact update and the meaning of `classic` and `pre_wd`.

    >>> from xgrad import Context
    >>> w = Tensor([3.0, 4.0])
    >>> opt = LARS([w], lr=1.0, momentum=0.0, weight_decay=0.0, tcoef=0.1)
    >>> _ = (w * w).sum().backward()  # grad [6, 8]: |w| = 5, |g| = 10, r = 0.05
    >>> with Context(TRAINING=1):
    ...     opt.step()
    >>> [round(x, 4) for x in w.tolist()]
    [2.7, 3.6]
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        ns_steps: int = 0,
        ns_coefficients: tuple[float, float, float] | None = None,
        nesterov: bool = False,
        classic: bool = True,
        pre_wd: bool = True,
        tcoef: float = 0.001,
        device: str | None = None,
        fused: bool | None = None,
    ):
        _check_non_negative(momentum=momentum, weight_decay=weight_decay)
        super().__init__(params, lr, device, fused)
        if ns_steps and self.fused:
            raise OptimizerError(
                "Newton-Schulz orthogonalization (ns_steps > 0, Muon) works per matrix and cannot be fused; "
                "pass fused=False"
            )
        if ns_steps and ns_coefficients is None:
            raise OptimizerError("ns_steps > 0 needs ns_coefficients=(a, b, c), e.g. (3.4445, -4.775, 2.0315)")
        if nesterov and momentum <= 0:
            raise OptimizerError("nesterov momentum needs momentum > 0")
        self.momentum, self.wd, self.nesterov = momentum, weight_decay, nesterov
        self.classic, self.pre_wd, self.tcoef = classic, pre_wd, tcoef
        self.ns_steps, self.ns_coefficients = ns_steps, ns_coefficients
        self.b: list[Tensor] = self._zeros_state() if momentum else []

    def _state(self) -> list[Tensor]:
        return self.b

    def _step(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        new = []
        for i, (p, g) in enumerate(zip(params, grads)):
            lr = self._lr_on(p.device, p.dtype)
            if self.tcoef != 0:
                p_norm, g_norm = p.square().sum().sqrt(), g.square().sum().sqrt()
                ratio = (p_norm > 0).where(
                    (g_norm > 0).where(self.tcoef * p_norm / (g_norm + self.wd * p_norm), 1.0), 1.0
                )
                step_size = lr * ratio
            else:
                step_size = lr
            if self.pre_wd and self.wd:
                g = g + self.wd * p
            if self.classic:
                g = g * step_size
            if self.momentum:
                buf = self.b[i].assign((self.momentum * self.b[i].cast(g.dtype) + g).cast(self.state_dtype))
                g = g + self.momentum * buf.cast(g.dtype) if self.nesterov else buf.cast(g.dtype)
            if self.ns_steps:
                assert self.ns_coefficients is not None
                mat = g.reshape(g.shape[0] if g.ndim else 1, -1)
                rows, cols = mat.shape
                g = mat.newton_schulz(self.ns_steps, self.ns_coefficients).reshape(g.shape) * max(1, rows / cols) ** 0.5
            if not self.pre_wd and self.wd:
                p = p * (1.0 - self.wd * lr)
            if not self.classic:
                g = g * step_size
            new.append(p - g)
        return new


def SGD(  # noqa: N802  (a class-like factory, as in torch and tinygrad)
    params: Sequence[Tensor],
    lr: float = 0.001,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    classic: bool = False,
    device: str | None = None,
    fused: bool | None = None,
) -> LARS:
    """Stochastic gradient descent with optional momentum, Nesterov momentum and (L2) weight decay, as torch.optim.SGD
    (dampening 0): LARS with trust coefficient 0. `classic=True` folds lr into the momentum buffer instead.

    >>> from xgrad import Context
    >>> w = Tensor([1.0])
    >>> opt = SGD([w], lr=0.1, momentum=0.9)
    >>> with Context(TRAINING=1):
    ...     for _ in range(2):
    ...         opt.zero_grad()
    ...         _ = (w * 2).sum().backward()
    ...         opt.step()
    >>> round(w.item(), 4)  # steps of 0.2, then 0.2 + 0.9*0.2
    0.42
    """
    return LARS(
        params,
        lr,
        momentum,
        weight_decay,
        0,
        None,
        nesterov,
        classic,
        pre_wd=True,
        tcoef=0.0,
        device=device,
        fused=fused,
    )


def Muon(  # noqa: N802
    params: Sequence[Tensor],
    lr: float = 0.001,
    momentum: float = 0.95,
    weight_decay: float = 0.1,
    ns_steps: int = 5,
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
    nesterov: bool = True,
    device: str | None = None,
    fused: bool | None = None,
) -> LARS:
    """Muon (Jordan et al. 2024): momentum whose update is orthogonalized by `ns_steps` Newton-Schulz iterations, with
    decoupled weight decay; for matrix parameters (others are flattened to `(shape[0], -1)`). Not fusable.

    >>> from xgrad import Context
    >>> w = Tensor([[2.0, 0.0], [0.0, 1.0]])
    >>> opt = Muon([w], lr=0.1, weight_decay=0.0)
    >>> _ = w.sum().backward()  # grad: all ones, a rank-one matrix
    >>> with Context(TRAINING=1):
    ...     opt.step()
    >>> [[round(x, 2) for x in row] for row in w.tolist()]  # 5 fast steps give singular value ~0.7, not 1
    [[1.97, -0.03], [-0.03, 0.97]]
    """
    return LARS(
        params,
        lr,
        momentum,
        weight_decay,
        ns_steps,
        ns_coefficients,
        nesterov,
        classic=False,
        pre_wd=False,
        tcoef=0.0,
        device=device,
        fused=bool(fused),  # only an explicit fused=True reaches LARS (which refuses it), not FUSE_OPTIM
    )


class LAMB(Optimizer):
    """LAMB (You et al. 2019): Adam moments with a layer-wise trust ratio `|p| / |update|`; with `adam=True` it is
    Adam with decoupled weight decay (AdamW). See the module docstring for the exact update.

    >>> from xgrad import Context
    >>> w = Tensor([3.0, 4.0])
    >>> opt = LAMB([w], lr=0.1)
    >>> _ = (w * w).sum().backward()
    >>> with Context(TRAINING=1):
    ...     opt.step()
    >>> [round(x, 3) for x in w.tolist()]  # update ~[1, 1], |w| = 5, |u| = sqrt(2)
    [2.646, 3.646]
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
        device: str | None = None,
        fused: bool | None = None,
    ):
        _check_non_negative(weight_decay=weight_decay)
        super().__init__(params, lr, device, fused)
        self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
        count_device = self.device or self.params[0].device
        # b1**t and b2**t, kept as tensors so the step count needs no recompile
        self.b1_t, self.b2_t = (
            Tensor.ones((1,), device=count_device, dtype=dtypes.float32).contiguous().realize().is_param_(False)
            for _ in range(2)
        )
        self.m = self._zeros_state()
        self.v = self._zeros_state()

    def _state(self) -> list[Tensor]:
        return [self.b1_t, self.b2_t, *self.m, *self.v]

    def _step(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        self.b1_t.assign(self.b1_t * self.b1)
        self.b2_t.assign(self.b2_t * self.b2)
        # the bias corrections and the learning rate, once per (device, dtype) rather than once per parameter: each
        # is a few Tensor ops, and a step of a small model spends most of its time building such graphs
        shared: dict[tuple[str, str, DType], tuple[Tensor, Tensor, Tensor]] = {}
        new = []
        for i, (p, g) in enumerate(zip(params, grads)):
            cdt, sdev = p.dtype, self.m[i].device  # the moments may live elsewhere (moved with `to_`, as tinygrad's)
            if g.device != sdev:
                g = g.contiguous().to(sdev)
            if (key := (sdev, p.device, cdt)) not in shared:
                b1_t = self.b1_t.reshape(()).to(sdev).cast(cdt)
                b2_t = self.b2_t.reshape(()).to(sdev).cast(cdt)
                shared[key] = (1.0 - b1_t, 1.0 - b2_t, self._lr_on(p.device, cdt))
            bias1, bias2, lr = shared[key]
            m = self.m[i].assign((self.b1 * self.m[i].cast(cdt) + (1.0 - self.b1) * g).cast(self.state_dtype))
            v = self.v[i].assign((self.b2 * self.v[i].cast(cdt) + (1.0 - self.b2) * g * g).cast(self.state_dtype))
            update = (m.cast(cdt) / bias1) / ((v.cast(cdt) / bias2).sqrt() + self.eps)
            if update.device != p.device:
                update = update.to(p.device)
            if self.wd:  # Adam has none: no `+ 0 * p` (torch's Adam leaves it out too)
                update = update + self.wd * p
            if not self.adam:
                p_norm, u_norm = p.square().sum().sqrt(), update.square().sum().sqrt()
                lr = lr * (p_norm > 0).where((u_norm > 0).where(p_norm / u_norm, 1.0), 1.0)
            new.append(p - lr * update)
        return new


def Adam(  # noqa: N802
    params: Sequence[Tensor],
    lr: float = 0.001,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    device: str | None = None,
    fused: bool | None = None,
) -> LAMB:
    """Adam (Kingma & Ba 2014) with bias correction, as torch.optim.Adam without weight decay: LAMB with `adam=True`.

    >>> from xgrad import Context
    >>> w = Tensor([1.0, -1.0])
    >>> opt = Adam([w], lr=0.1)
    >>> _ = (w * 3).sum().backward()
    >>> with Context(TRAINING=1):
    ...     opt.step()
    >>> [round(x, 4) for x in w.tolist()]  # the first step moves by lr against the sign of the grad
    [0.9, -1.1]
    """
    return LAMB(params, lr, b1, b2, eps, 0.0, adam=True, device=device, fused=fused)


def AdamW(  # noqa: N802
    params: Sequence[Tensor],
    lr: float = 0.001,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    device: str | None = None,
    fused: bool | None = None,
) -> LAMB:
    """AdamW (Loshchilov & Hutter 2017): Adam with decoupled weight decay `p -= lr*weight_decay*p`, as
    torch.optim.AdamW: LAMB with `adam=True`.

    >>> from xgrad import Context
    >>> w = Tensor([1.0])
    >>> opt = AdamW([w], lr=0.1, weight_decay=0.5)
    >>> _ = (w * 3).sum().backward()
    >>> with Context(TRAINING=1):
    ...     opt.step()
    >>> round(w.item(), 4)  # 1 - 0.1*1 - 0.1*0.5*1
    0.85
    """
    return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, device=device, fused=fused)


# ---- helpers ----
def _concat_flat(ts: list[Tensor]) -> Tensor:
    """The tensors flattened and laid end to end in one vector."""
    total = sum(t.numel() for t in ts)
    if len(ts) == 1:
        return ts[0].reshape(total)
    out: Tensor | None = None
    start = 0
    for t in ts:
        piece = t.reshape(t.numel()).pad(((start, total - start - t.numel()),))
        out = piece if out is None else out + piece
        start += t.numel()
    assert out is not None
    return out


def _is_realized(t: Tensor) -> bool:
    return t.uop.base.op is Ops.BUFFER and t.uop.op is not Ops.ASSIGN


def _cumsum(xs: list[int]) -> list[int]:
    out, acc = [], 0
    for x in xs:
        acc += x
        out.append(acc)
    return out


__all__ = ["Optimizer", "OptimizerGroup", "OptimizerError", "SGD", "LARS", "Muon", "LAMB", "Adam", "AdamW"]
