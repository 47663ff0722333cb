"""Aten kernels that make, move, view and fill tensors: views, creation, copies between `cpu` and `xgrad`, random
fills, `item()`, and the `_foreach_` lists the optimizers call.

In: aten calls on `xgrad` (or from `cpu` into `xgrad`). Out: entries of `ops.TABLE`. Views are torch's own Meta
kernels run on the xgrad tensor (same storage, torch's sizes and strides); the xgrad side never copies for a view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from xgrad import Tensor, dtypes

from . import storage
from .ops import KERNELS, Args, aten, bind_to, kernel, operand, register, signature, tensor, x_of
from .registration import redispatch_meta, set_storage
from .storage import read, to_xgrad_dtype, wrap, write


# ---- views: torch's Meta kernel computes sizes, strides and offset on the same storage ----
def _meta_view(op: Any) -> Callable[..., Any]:
    def view(*args: Any, **kwargs: Any) -> Any:
        return redispatch_meta(op, *args, **kwargs)

    return view


for _name in ["view", "as_strided", "_reshape_alias", "unfold", "alias"]:
    kernel(_name, kind="view")(_meta_view(getattr(aten, _name).default))


# ---- creation ----
def _shape(size: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in size)


def _fresh(size: tuple[int, ...], dtype: torch.dtype | None) -> torch.Tensor:
    dtype = dtype or torch.get_default_dtype()
    return wrap(Tensor.zeros(size, dtype=to_xgrad_dtype(dtype)) if size else Tensor(0, dtype=to_xgrad_dtype(dtype)))


@kernel("empty.memory_format", kind="creation")
def empty(size: Any, dtype: torch.dtype | None = None, **_: Any) -> torch.Tensor:
    """A new tensor; its elements are zeros until written (xgrad allocates nothing for it until realized)."""
    return _fresh(_shape(size), dtype)


@kernel("empty_strided", kind="creation")
def empty_strided(size: Any, stride: Any, dtype: torch.dtype | None = None, **_: Any) -> torch.Tensor:
    """A new tensor with the given strides (over a storage just large enough)."""
    size, stride = _shape(size), _shape(stride)
    if stride == storage._contiguous(size):
        return _fresh(size, dtype)
    extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
    flat = _fresh((extent,), dtype)
    out: torch.Tensor = redispatch_meta(aten.as_strided.default, flat, list(size), list(stride), 0)
    return out


register(["fill_.Scalar", "fill_.Tensor"], "creation", lambda a: operand(a["value"], a["self"].dtype))
register(["zero_"], "creation", lambda a: Tensor(0, dtype=to_xgrad_dtype(a["self"].dtype)))
register(
    ["arange.start_out"],
    "creation",
    lambda a: Tensor.arange(a["start"], a["end"], a["step"], dtype=to_xgrad_dtype(a["out"].dtype)),
)


def _scalar(a: Args) -> Tensor:
    return Tensor(a["s"], dtype=to_xgrad_dtype(a["dtype"] or torch.get_default_dtype()))


register(["scalar_tensor"], "creation", _scalar)


@kernel("resize_", kind="creation")
def resize_(self: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
    """Give `self` the shape `size`: its elements (as a flat prefix) are kept, new ones are zeros."""
    size = _shape(size)
    if size == tuple(self.shape):
        return self
    numel = 1
    for n in size:
        numel *= n
    old = read(self).reshape(-1) if self.numel() else Tensor.zeros(0, dtype=to_xgrad_dtype(self.dtype))
    flat = old.shrink(((0, numel),)) if old.shape[0] >= numel else old.pad(((0, numel - old.shape[0]),))
    set_storage(self, wrap(flat.reshape(size), self.dtype))
    return self


# ---- scatters into a view of a copy (torch's own kernels size the copy from the storage's bytes, which a shell lacks)
def _view_scatter(view: Any) -> Callable[..., torch.Tensor]:
    """`<view>_scatter(self, src, *view_args)`: a copy of `self` with `src` written into `view(copy, *view_args)`."""

    def scatter(self: torch.Tensor, src: torch.Tensor, *args: Any) -> torch.Tensor:
        out = wrap(read(self), self.dtype)  # a storage of its own holding self's values (lazy)
        write(view(out, *args), x_of(src, self.dtype))
        return out

    return scatter


kernel("slice_scatter", kind="index")(_view_scatter(aten.slice.Tensor))
kernel("select_scatter", kind="index")(_view_scatter(aten.select.int))
kernel("diagonal_scatter", kind="index")(_view_scatter(aten.diagonal.default))


# ---- copies between devices, item ----
def _copy(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.device.type == "xgrad":
        value = storage.from_cpu(src) if src.device.type == "cpu" else read(src)
        write(dst, value)
    else:
        dst.copy_(storage.to_cpu_tensor(src))
    return dst


@kernel("copy_", kind="copy")
def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """`self.copy_(src)` with either on `xgrad` (the other on `cpu` or `xgrad`)."""
    return _copy(src, self)


@kernel("_copy_from", kind="copy")
def _copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """torch's cross-device copy: `self` into `dst`."""
    return _copy(self, dst)


@kernel("_copy_from_and_resize", kind="copy")
def _copy_from_and_resize(self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """`_copy_from` into a `dst` first resized to `self`'s shape."""
    if tuple(dst.shape) != tuple(self.shape):
        dst.resize_(self.shape)
    return _copy(self, dst)


@kernel("_to_copy", kind="copy")
def _to_copy(self: torch.Tensor, *, dtype: torch.dtype | None = None, device: Any = None, **_: Any) -> torch.Tensor:
    """`.to(device, dtype)` of a tensor, from or to `xgrad` (contiguous result)."""
    dtype = dtype or self.dtype
    target = torch.device(device) if device is not None else self.device
    if target.type == "xgrad":
        value = storage.from_cpu(self) if self.device.type == "cpu" else read(self)
        return wrap(value.contiguous() if self.device.type == "xgrad" else value, dtype)
    return storage.to_cpu_tensor(self).to(dtype=dtype, device=target)


@kernel("_local_scalar_dense", kind="copy")
def _local_scalar_dense(self: torch.Tensor) -> Any:
    """`item()`: realizes the tensor (and every pending write)."""
    return storage.to_numpy(self).reshape(()).item()


# ---- random fills (xgrad's generator: torch.xgrad.manual_seed seeds it) ----
def _rand(a: Args) -> Tensor:
    return Tensor.rand(
        *a["self"].shape,
        dtype=to_xgrad_dtype(torch.float32) if not a["self"].is_floating_point() else to_xgrad_dtype(a["self"].dtype),
    )


register(["uniform_"], "random", lambda a: _rand(a) * (a["to"] - a["from"]) + a["from"])
register(
    ["normal_"],
    "random",
    lambda a: Tensor.randn(*a["self"].shape, dtype=to_xgrad_dtype(a["self"].dtype)) * a["std"] + a["mean"],
)
register(["bernoulli_.float"], "random", lambda a: _rand(a) < a["p"])
register(["bernoulli_.Tensor"], "random", lambda a: _rand(a) < operand(a["p"]))
register(["bernoulli"], "random", lambda a: (_rand(a) < x_of(a["self"])).cast(to_xgrad_dtype(a["self"].dtype)))
register(["exponential_"], "random", lambda a: -(1 - _rand(a)).log() / a["lambd"])


_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}


def _random_from(a: Args) -> Tensor:
    low = a["from"]
    high = (
        a["to"]
        if a["to"] is not None
        else 2 ** (_MANTISSA_BITS[a["self"].dtype] + 1 if a["self"].is_floating_point() else 31)
    )
    return tensor((_rand(a).cast(dtypes.float64) * (high - low)).floor() + low)


register(["random_.from"], "random", _random_from)
register(["random_.to"], "random", lambda a: (_rand(a).cast(dtypes.float64) * a["to"]).floor())


def _native_dropout(a: Args) -> tuple[Tensor, Tensor]:
    x = x_of(a["input"])
    if not a["train"] or a["p"] == 0:
        return x, Tensor.ones(*x.shape, dtype=dtypes.bool)
    keep = Tensor.rand(*x.shape) >= a["p"]
    return keep.where(x * (1 / (1 - a["p"])), 0).cast(x.dtype), keep


register(["native_dropout"], "random", _native_dropout)
register(
    ["native_dropout_backward"],
    "random",
    lambda a: (x_of(a["grad_output"]) * x_of(a["mask"]).cast(dtypes.float32) * a["scale"]).cast(
        to_xgrad_dtype(a["grad_output"].dtype)
    ),
)


# ---- _foreach_: one call per list element, each through the op's own kernel ----
def _runtime_scalars(values: list[Any], like: torch.Tensor) -> list[torch.Tensor]:
    """Per-element scalars (an optimizer's step sizes, new every step) as 0-d tensors on `xgrad` read from one
    buffer: the kernels read them instead of baking them in, so they stay the same kernels (compiled once, and the
    step's schedule is reused) from step to step."""
    dtype = like.dtype if like.is_floating_point() else torch.float32
    buf = Tensor([float(v) for v in values], dtype=to_xgrad_dtype(dtype))
    # (the node `buf[i]` is, without indexing's argument handling: a tenth of the optimizer step's Python)
    return [wrap(buf.shrink(((i, i + 1),)).reshape(()), dtype) for i in range(len(values))]


_SINGLE = {"Scalar": ("Scalar", ""), "List": ("Tensor", ""), "ScalarList": ("Tensor", ""), "Tensor": ("Tensor", "")}


def _single(name: str, overload: str) -> Callable[..., Any] | None:
    """The bridge's own kernel of the per-tensor op a `_foreach_` overload applies (called directly: no dispatch)."""
    base = name.removeprefix("_foreach_")
    if base.startswith("addc"):
        return KERNELS.get(base)
    for ov in _SINGLE.get(overload, ("",)):
        if (fn := KERNELS.get(f"{base}.{ov}" if ov else base)) is not None:
            return fn
    return None


def _foreach(name: str, overload: str) -> Callable[..., Any]:
    op = getattr(getattr(aten, name), overload)
    method = getattr(torch.Tensor, name.removeprefix("_foreach_"))
    inplace = name.endswith("_")
    addc = name.startswith("_foreach_addc")
    names = [a.name for a in op._schema.arguments if not a.kwarg_only]
    keywords = [a.name for a in op._schema.arguments if a.kwarg_only]  # alpha: keyword-only in torch's methods too
    lists = {a.name for a in op._schema.arguments if str(a.type).startswith("List[")}
    scalar_list = next((a.name for a in op._schema.arguments if str(a.type) == "List[number]"), None)
    if overload == "Tensor" and addc:  # one CPU tensor of per-element scalars
        lists.add("scalars")
        scalar_list = "scalars"
    sig = signature(op)

    def run(*args: Any, **kwargs: Any) -> Any:
        a = bind_to(sig, args, kwargs)
        single = _single(name, overload)
        if scalar_list is not None and len(a[names[0]]):
            values = a[scalar_list].tolist() if isinstance(a[scalar_list], torch.Tensor) else list(a[scalar_list])
            a[scalar_list] = _runtime_scalars(values, a[names[0]][0])
        results = []
        for i in range(len(a[names[0]])):
            call = [a[k][i] if k in lists else a[k] for k in names]
            extra = {k: a[k] for k in keywords}
            if addc and isinstance(call[3], torch.Tensor):  # value as a tensor: scale the numerator by it
                scaled = KERNELS["mul.Tensor"](call[1], call[3])
                results.append(single(call[0], scaled, call[2]) if single else method(call[0], scaled, call[2]))
            elif addc:  # value is keyword-only in torch's Python binding
                results.append(single(*call[:3], value=call[3]) if single else method(*call[:3], value=call[3]))
            else:
                results.append(single(*call, **extra) if single else method(*call, **extra))
        return None if inplace else results

    return run


FOREACH = [
    "add", "sub", "mul", "div", "maximum", "minimum", "pow", "lerp", "addcmul", "addcdiv", "sqrt", "exp", "neg",
    "abs", "reciprocal", "sign", "sigmoid", "clamp_min", "clamp_max", "zero", "copy", "log", "tanh",
]  # fmt: skip
for _m in FOREACH:
    for _base in (f"_foreach_{_m}", f"_foreach_{_m}_"):
        _packet = getattr(aten, _base, None)
        if _packet is None or not hasattr(torch.Tensor, _base.removeprefix("_foreach_")):
            continue
        for _ov in _packet.overloads():
            if "out" in _ov or _ov == "ScalarAndTensor":
                continue
            kernel(f"{_base}.{_ov}" if _ov != "default" else _base, kind="foreach")(_foreach(_base, _ov))
