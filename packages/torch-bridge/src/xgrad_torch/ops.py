"""The aten table: torch's ops on `xgrad` as xgrad Tensor ops.

In: aten calls dispatched to the PrivateUse1 key with torch tensors on `xgrad`. Out: new torch tensors on `xgrad`
whose storages hold lazy xgrad results (`storage.wrap`), or lazy writes into existing ones (`storage.write`).

Every kernel is an entry of `TABLE`, keyed by aten overload name (`"add.Tensor"`), with its kind. A kernel is
written once as a functional computation (bound arguments -> xgrad Tensor); the registered wrappers are generated
per kind and form: the functional form wraps the result, the in-place form (`add_.Tensor`) writes it into `self`,
the `.out` form writes it into (or resizes) `out`. Elementwise ops with the same shape of schema share one
generator (`unary`, `binary`, `compare`), so adding one is a table line. View ops run torch's own Meta kernel on the
xgrad tensor (`registration.redispatch_meta`), which shares the storage: the xgrad side reads it as movement ops.

Anything unregistered reaches `fallback`: it warns once, naming the aten op, copies the xgrad arguments to CPU, runs
torch's CPU kernel and copies results (and mutated arguments) back; with `XGRAD_TORCH_STRICT=1` it raises instead.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from xgrad import Tensor, dtypes

from . import storage
from .registration import XGRAD_TORCH_STRICT, BridgeError, decomposes, set_storage
from .storage import read, to_torch_dtype, to_xgrad_dtype, wrap, write

aten = torch.ops.aten
Args = dict[str, Any]
Compute = Callable[[Args], Any]  # bound arguments -> xgrad Tensor (or tuple), in the output's dtype


class UnsupportedOpError(BridgeError, NotImplementedError):
    """An aten op the bridge has no kernel for, under XGRAD_TORCH_STRICT=1."""


@dataclass(frozen=True)
class Entry:
    kind: str  # unary, binary, compare, reduce, view, creation, copy, random, foreach, nn, index, ... (README table)
    compute: Compute | None  # the functional computation; None for kernels registered as written (views, copies)


TABLE: dict[str, Entry] = {}  # aten overload name -> its entry (every form registered, for the coverage table)
_lib: torch.library.Library | None = None
_pending_impls: list[tuple[str, Callable[..., Any]]] = []
KERNELS: dict[str, Callable[..., Any]] = {}  # aten overload name -> its registered kernel (called directly by kernels)


# ---- arguments ----
_SIGNATURES: dict[Any, tuple[tuple[str, ...], tuple[Any, ...]]] = {}  # op -> its argument names and their defaults


Signature = tuple[tuple[str, ...], tuple[Any, ...]]


def signature(op: Any) -> Signature:
    """An aten overload's argument names and their defaults (None where there is none)."""
    found = _SIGNATURES.get(op)
    if found is None:
        arguments = op._schema.arguments
        names = tuple(a.name for a in arguments)
        found = _SIGNATURES[op] = (names, tuple(a.default_value if a.has_default_value() else None for a in arguments))
    return found


def bind(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Args:
    """The arguments of an aten call by schema name, defaults filled in."""
    return bind_to(signature(op), args, kwargs)


def bind_to(signature: Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Args:
    """`bind` with the op's signature at hand (a kernel looks it up once: hashing an OpOverload runs Python)."""
    names, defaults = signature
    out: Args = dict(zip(names, args))
    n = len(args)
    if n < len(names):
        if kwargs:
            for name, default in zip(names[n:], defaults[n:]):
                out[name] = kwargs.get(name, default)
        else:  # (most calls: torch passes every argument positionally)
            out.update(zip(names[n:], defaults[n:]))
    return out


Scalar = bool | int | float


def operand(v: Any, dtype: torch.dtype | None = None) -> Any:
    """An xgrad operand: a tensor reads as its xgrad Tensor (`x_of`), except that a CPU scalar tensor gives its Python
    number, as do Python numbers (xgrad then promotes them as torch promotes scalars); None stays None."""
    if isinstance(v, torch.Tensor) and not (v.is_cpu and v.dim() == 0):  # (is_cpu: a device object costs more)
        return x_of(v, dtype)
    return v.item() if isinstance(v, torch.Tensor) else v


def tensor(v: Any) -> Tensor:
    """`v` as an xgrad Tensor: a computed one as it is, a Python number as a constant."""
    return v if isinstance(v, Tensor) else Tensor(v)


def x_of(v: torch.Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """The xgrad Tensor of a torch tensor on `xgrad` (lazy) or on `cpu` (copied in), cast to `dtype` when given."""
    x = storage.from_cpu(v) if v.is_cpu else read(v)
    if dtype is not None and x.dtype != to_xgrad_dtype(dtype):
        x = x.cast(to_xgrad_dtype(dtype))
    return x


def default_float() -> torch.dtype:
    """torch's default float dtype (what int inputs of float ops give)."""
    return torch.get_default_dtype()


def float_of(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a float-valued op on `dtype` (ints and bool give the default float)."""
    return dtype if dtype.is_floating_point else default_float()


def dims_of(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """aten's `int[1]? dim` as non-negative axes (None or [] = every axis)."""
    if dim is None:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return None
    return tuple(d % max(ndim, 1) for d in dims)


# ---- registration ----
def _form(overload: str) -> str:
    op = _overload(overload)
    name = op._schema.name.split("::")[1]
    if any(a.alias_info is not None and a.alias_info.is_write and a.kwarg_only for a in op._schema.arguments):
        return "out"
    return "inplace" if name.endswith("_") else "functional"


def _overload(overload: str) -> Any:
    name, _, ov = overload.partition(".")
    return getattr(getattr(aten, name), ov or "default")


def store_out(out: torch.Tensor, x: Tensor) -> torch.Tensor:
    """Write `x` into the `out=` tensor, resizing it (to a new storage) when the shapes differ."""
    if tuple(out.shape) != x.shape:
        set_storage(out, wrap(x, out.dtype))
    else:
        write(out, x)
    return out


def _generated(overload: str, compute: Compute) -> Callable[..., Any]:
    op = _overload(overload)
    form = _form(overload)
    outs = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    sig = signature(op)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        bound = bind_to(sig, args, kwargs)
        result = compute(bound)
        if form == "inplace":
            write(bound["self"], result)
            return bound["self"]
        if form == "out":
            if isinstance(result, tuple):
                return tuple(store_out(bound[n], r) for n, r in zip(outs, result))
            return store_out(bound[outs[0]], result)
        if isinstance(result, tuple):
            return tuple(wrap(r) if r is not None else None for r in result)
        return wrap(result)

    kernel.__name__ = f"xgrad_{overload.replace('.', '_')}"
    return kernel


def register(overloads: list[str] | str, kind: str, compute: Compute) -> None:
    """Add `compute` under each aten overload (any of functional, in-place and out forms) to the table."""
    for name in [overloads] if isinstance(overloads, str) else overloads:
        _overload(name)  # a typo fails at import, naming the overload
        TABLE[name] = Entry(kind, compute)
        _pending_impls.append((name, _generated(name, compute)))
        KERNELS[name] = _pending_impls[-1][1]


def kernel(*overloads: str, kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a kernel written against the aten signature itself (torch tensors in, torch tensors out)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in overloads:
            _overload(name)
            TABLE[name] = Entry(kind, None)
            _pending_impls.append((name, fn))
            KERNELS[name] = fn
        return fn

    return deco


def overloads_of(name: str, skip: tuple[str, ...] = ()) -> list[str]:
    """Every overload of `name` and of its in-place `name_` that takes and returns tensors (not the int/str/list
    overloads TorchScript keeps under the same name)."""
    found = []
    for base in (name, name + "_"):
        packet = getattr(aten, base, None)
        if packet is None:
            continue
        for ov in packet.overloads():
            schema = getattr(packet, ov)._schema
            if ov in skip or not schema.returns or not str(schema.returns[0].type).startswith("Tensor"):
                continue
            if not any(str(a.type).startswith("Tensor") for a in schema.arguments):
                continue
            found.append(f"{base}.{ov}" if ov != "default" else base)
    return found


def install() -> None:
    """Register every kernel of the table, and the fallback, with torch's dispatcher (once)."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    for name, fn in _pending_impls:
        if decomposes(name):
            TABLE.pop(name, None)  # torch decomposes it into ops of the table (and differentiates those)
            KERNELS.pop(name, None)
            continue
        _lib.impl(name, fn, "PrivateUse1")  # type: ignore[no-untyped-call]
    _fallback_lib.fallback(fallback, "PrivateUse1")  # type: ignore[no-untyped-call]


# ---- elementwise: unary ----
def _unary(fn: Callable[[Tensor], Tensor], result: str) -> Compute:
    def compute(a: Args) -> Tensor:
        self = a["self"]
        out_dtype = {"same": self.dtype, "float": float_of(self.dtype), "bool": torch.bool}[result]
        compute_dtype = out_dtype if result == "float" else self.dtype
        return fn(x_of(self, compute_dtype)).cast(to_xgrad_dtype(out_dtype))

    return compute


UNARY: dict[str, tuple[Callable[[Tensor], Tensor], str]] = {
    "abs": (Tensor.abs, "same"),
    "neg": (Tensor.neg, "same"),
    "exp": (Tensor.exp, "float"),
    "exp2": (Tensor.exp2, "float"),
    "expm1": (lambda x: x.exp() - 1, "float"),
    "log": (Tensor.log, "float"),
    "log2": (Tensor.log2, "float"),
    "log10": (lambda x: x.log2() * (1 / math.log2(10)), "float"),
    "log1p": (lambda x: (x + 1).log(), "float"),
    "sqrt": (Tensor.sqrt, "float"),
    "rsqrt": (Tensor.rsqrt, "float"),
    "sin": (Tensor.sin, "float"),
    "cos": (Tensor.cos, "float"),
    "tan": (Tensor.tan, "float"),
    "asin": (Tensor.asin, "float"),
    "acos": (Tensor.acos, "float"),
    "atan": (Tensor.atan, "float"),
    "sinh": (Tensor.sinh, "float"),
    "cosh": (Tensor.cosh, "float"),
    "tanh": (Tensor.tanh, "float"),
    "sigmoid": (Tensor.sigmoid, "float"),
    "erf": (Tensor.erf, "float"),
    "reciprocal": (Tensor.reciprocal, "float"),
    "relu": (Tensor.relu, "same"),
    "silu": (Tensor.silu, "same"),
    "mish": (Tensor.mish, "same"),
    "floor": (Tensor.floor, "same"),
    "ceil": (Tensor.ceil, "same"),
    "trunc": (Tensor.trunc, "same"),
    "round": (Tensor.round, "same"),
    "frac": (lambda x: x - x.trunc(), "same"),
    "sign": (lambda x: x.isnan().where(0, x.sign()) if dtypes.is_float(x.dtype) else x.sign(), "same"),
    "sgn": (lambda x: x.isnan().where(0, x.sign()) if dtypes.is_float(x.dtype) else x.sign(), "same"),
    "bitwise_not": (lambda x: x.logical_not() if x.dtype == dtypes.bool else x.bitwise_not(), "same"),
    "logical_not": (Tensor.logical_not, "bool"),
    "isnan": (Tensor.isnan, "bool"),
    "isinf": (Tensor.isinf, "bool"),
    "isfinite": (Tensor.isfinite, "bool"),
    "isneginf": (lambda x: x.isinf() & (x < 0), "bool"),
    "isposinf": (lambda x: x.isinf() & (x > 0), "bool"),
    "signbit": (lambda x: (x < 0) | ((x == 0) & ((1 / x) < 0)) if dtypes.is_float(x.dtype) else x < 0, "bool"),
}
for _name, (_fn, _result) in UNARY.items():
    register(overloads_of(_name, skip=("decimals", "decimals_out")), "unary", _unary(_fn, _result))


# ---- elementwise: binary (type promotion as torch's, alpha, broadcast) ----
_OPERANDS: dict[tuple[str, ...], tuple[str, str]] = {}  # a schema's argument names -> its two operands' names


def _operands(a: Args) -> tuple[str, str]:
    keys = tuple(a)
    found = _OPERANDS.get(keys)
    if found is None:
        names = [k for k in keys if k not in ("alpha", "out", "rounding_mode")]
        found = _OPERANDS[keys] = (names[0], names[1])
    return found


def _binary(fn: Callable[[Any, Any], Any], result: str) -> Compute:
    def compute(a: Args) -> Tensor:
        first, second = _operands(a)
        x, y = a[first], a[second]
        dtype = torch.result_type(x, y)
        if result == "float" or (result == "div" and a.get("rounding_mode") is None):
            dtype = float_of(dtype)
        xs, ys = operand(x, dtype), operand(y, dtype)
        if a.get("alpha") not in (None, 1):
            ys = ys * a["alpha"]
        if result == "div":
            out = _divide(xs, ys, a.get("rounding_mode"), dtype)
        else:
            out = fn(xs, ys)
        out_dtype = torch.bool if result == "bool" else dtype
        return tensor(out).cast(to_xgrad_dtype(out_dtype))

    return compute


def _divide(x: Any, y: Any, mode: str | None, dtype: torch.dtype) -> Tensor:
    if mode is None:
        return tensor(x / y)
    if dtype.is_floating_point:
        q = tensor(x / y)
        if mode == "trunc":
            return q.trunc()
        return tensor(x).isinf().where(math.nan, q.floor())  # torch's floor division: inf // y is nan
    xt = x if isinstance(x, Tensor) else Tensor(x, dtype=to_xgrad_dtype(dtype))
    floor = xt // y  # ints: xgrad's // rounds toward -inf, as Python's and torch's floor mode
    if mode == "floor":
        return tensor(floor)
    inexact_negative = (xt % y != 0) & ((xt < 0) != (y < 0))
    return tensor(inexact_negative.where(floor + 1, floor))  # trunc rounds toward 0


def _logical(fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Any, Any], Tensor]:
    def go(x: Any, y: Any) -> Tensor:
        xb = x.cast(dtypes.bool) if isinstance(x, Tensor) else Tensor(bool(x))
        yb = y.cast(dtypes.bool) if isinstance(y, Tensor) else Tensor(bool(y))
        return tensor(fn(xb, yb))

    return go


def _rpow(x: Any, y: Any) -> Any:
    return x**y if isinstance(x, Tensor) else Tensor(x, dtype=y.dtype) ** y if isinstance(y, Tensor) else x**y


def _fmod(x: Any, y: Any) -> Tensor:
    return tensor(x - (x / y).trunc() * y if dtypes.is_float(x.dtype) else x - (x / y).trunc().cast(x.dtype) * y)


BINARY: dict[str, tuple[Callable[[Any, Any], Any], str]] = {
    "add": (lambda x, y: x + y, "same"),
    "sub": (lambda x, y: x - y, "same"),
    "rsub": (lambda x, y: y - x, "same"),
    "mul": (lambda x, y: x * y, "same"),
    "div": (lambda x, y: x / y, "div"),
    "true_divide": (lambda x, y: x / y, "float"),
    "floor_divide": (
        lambda x, y: _divide(x, y, "floor", to_torch_dtype(x.dtype)),
        "same",
    ),
    "remainder": (lambda x, y: x % y, "same"),
    "fmod": (_fmod, "same"),
    "pow": (_rpow, "same"),
    "maximum": (lambda x, y: x.maximum(y), "same"),
    "minimum": (lambda x, y: x.minimum(y), "same"),
    "atan2": (lambda x, y: _atan2(x, y), "float"),
    "copysign": (lambda x, y: x.copysign(y), "float"),
    "bitwise_and": (lambda x, y: x & y, "same"),
    "bitwise_or": (lambda x, y: x | y, "same"),
    "bitwise_xor": (lambda x, y: x ^ y, "same"),
    "logical_and": (_logical(lambda x, y: x & y), "bool"),
    "logical_or": (_logical(lambda x, y: x | y), "bool"),
    "logical_xor": (_logical(lambda x, y: x ^ y), "bool"),
    "eq": (lambda x, y: x == y, "bool"),
    "ne": (lambda x, y: x != y, "bool"),
    "lt": (lambda x, y: x < y, "bool"),
    "le": (lambda x, y: x <= y, "bool"),
    "gt": (lambda x, y: x > y, "bool"),
    "ge": (lambda x, y: x >= y, "bool"),
}


def _atan2(y: Tensor, x: Any) -> Tensor:
    base = (y / x).atan()
    pi = math.pi
    return tensor(
        (x < 0).where((y >= 0).where(base + pi, base - pi), (x == 0).where((y > 0).where(pi / 2, -pi / 2), base))
    )


for _name, (_bfn, _bresult) in BINARY.items():
    register(overloads_of(_name), "compare" if _bresult == "bool" else "binary", _binary(_bfn, _bresult))


# ---- elementwise with more operands ----
def _where(a: Args) -> Tensor:
    x, y = a["self"], a["other"]
    dtype = torch.result_type(x, y)
    cond = x_of(a["condition"]).cast(dtypes.bool)
    return cond.where(operand(x, dtype), operand(y, dtype)).cast(to_xgrad_dtype(dtype))


register(["where.self", "where.ScalarOther", "where.ScalarSelf", "where.self_out"], "ternary", _where)


def _clamp(a: Args) -> Tensor:
    x = x_of(a["self"])
    lo, hi = operand(a["min"], a["self"].dtype), operand(a["max"], a["self"].dtype)
    if lo is not None:
        x = x.maximum(lo)
    if hi is not None:
        x = x.minimum(hi)
    return x


register(overloads_of("clamp") + overloads_of("clip"), "ternary", _clamp)
register(overloads_of("clamp_min"), "binary", lambda a: x_of(a["self"]).maximum(operand(a["min"], a["self"].dtype)))
register(overloads_of("clamp_max"), "binary", lambda a: x_of(a["self"]).minimum(operand(a["max"], a["self"].dtype)))


def _lerp(a: Args) -> Tensor:
    x, end, w = x_of(a["self"]), x_of(a["end"], a["self"].dtype), operand(a["weight"], a["self"].dtype)
    return tensor(x + (end - x) * w)


def _addc(mul: bool) -> Compute:
    def compute(a: Args) -> Tensor:
        dtype = a["self"].dtype
        t1, t2 = x_of(a["tensor1"], dtype), x_of(a["tensor2"], dtype)
        return tensor(x_of(a["self"]) + (t1 * t2 if mul else t1 / t2) * a["value"])

    return compute


register(overloads_of("lerp"), "ternary", _lerp)
register(overloads_of("addcmul"), "ternary", _addc(True))
register(overloads_of("addcdiv"), "ternary", _addc(False))


def _masked_fill(a: Args) -> Tensor:
    x = x_of(a["self"])
    value = operand(a["value"], a["self"].dtype)
    return x_of(a["mask"]).cast(dtypes.bool).where(value, x).cast(x.dtype)


register(overloads_of("masked_fill"), "ternary", _masked_fill)


# ---- reductions ----
def _sum_dtype(a: Args) -> torch.dtype:
    if a.get("dtype") is not None:
        dtype: torch.dtype = a["dtype"]
        return dtype
    dtype = a["self"].dtype
    return torch.int64 if not dtype.is_floating_point else dtype


def _reduce(method: str, result: str = "same") -> Compute:
    def compute(a: Args) -> Tensor:
        self = a["self"]
        dtype = _sum_dtype(a) if result == "sum" else (torch.bool if result == "bool" else self.dtype)
        x = x_of(self, dtype if result != "bool" else None)
        axis = dims_of(a.get("dim"), self.dim())
        keepdim = bool(a.get("keepdim") or False)
        if result == "bool":
            x = x.cast(dtypes.bool)
        out = getattr(x, method)(axis, keepdim=keepdim)
        return tensor(out.cast(to_xgrad_dtype(dtype)))

    return compute


register(["sum", "sum.dim_IntList", "sum.out", "sum.IntList_out"], "reduce", _reduce("sum", "sum"))
register(["mean", "mean.dim", "mean.out"], "reduce", _reduce("mean", "sum"))
register(["prod", "prod.dim_int"], "reduce", _reduce("prod", "sum"))
register(overloads_of("amax"), "reduce", _reduce("max"))
register(overloads_of("amin"), "reduce", _reduce("min"))
register("max", "reduce", _reduce("max"))
register("min", "reduce", _reduce("min"))
register(["any", "any.dim", "any.dims"], "reduce", _reduce("any", "bool"))
register(["all", "all.dim", "all.dims"], "reduce", _reduce("all", "bool"))


def _max_dim(method: str) -> Compute:
    def compute(a: Args) -> tuple[Tensor, Tensor]:
        x = x_of(a["self"])
        dim, keepdim = a["dim"] % max(a["self"].dim(), 1), a["keepdim"]
        if a["self"].dim() == 0:
            return x, Tensor(0, dtype=dtypes.int64)
        values = getattr(x, method)(dim, keepdim=keepdim)
        indices = (x.argmax if method == "max" else x.argmin)(dim, keepdim=keepdim).cast(dtypes.int64)
        return values, indices

    return compute


register(["max.dim"], "reduce", _max_dim("max"))
register(["min.dim"], "reduce", _max_dim("min"))


def _arg(method: str) -> Compute:
    def compute(a: Args) -> Tensor:
        x = x_of(a["self"])
        dim = a["dim"]
        if dim is None:
            out = getattr(x.reshape(-1), method)(0)
            return tensor((out.reshape((1,) * x.ndim) if a["keepdim"] else out).cast(dtypes.int64))
        return tensor(getattr(x, method)(dim % max(x.ndim, 1), keepdim=a["keepdim"]).cast(dtypes.int64))

    return compute


register(overloads_of("argmax"), "reduce", _arg("argmax"))
register(overloads_of("argmin"), "reduce", _arg("argmin"))


def _var(method: str) -> Compute:
    def compute(a: Args) -> Tensor:
        x = x_of(a["self"])
        correction = a.get("correction")
        if correction is None:
            correction = 1 if a.get("unbiased", True) is not False else 0
        axis = dims_of(a.get("dim"), x.ndim)
        return tensor(getattr(x, method)(axis, keepdim=bool(a.get("keepdim")), correction=correction))

    return compute


register(["var.correction", "var.dim", "var"], "reduce", _var("var"))
register(["std.correction", "std.dim", "std"], "reduce", _var("std"))


def _var_mean(a: Args) -> tuple[Tensor, Tensor]:
    x = x_of(a["self"])
    axis, keepdim = dims_of(a.get("dim"), x.ndim), bool(a.get("keepdim"))
    correction = a["correction"] if a.get("correction") is not None else 1
    return x.var(axis, keepdim=keepdim, correction=correction), x.mean(axis, keepdim=keepdim)


register(["var_mean.correction"], "reduce", _var_mean)
register(
    ["logsumexp", "logsumexp.out"],
    "reduce",
    lambda a: x_of(a["self"], float_of(a["self"].dtype)).logsumexp(dims_of(a["dim"], a["self"].dim()), a["keepdim"]),
)
register(
    ["cumsum", "cumsum_", "cumsum.out"],
    "reduce",
    lambda a: x_of(a["self"], a["dtype"] or _sum_dtype(a)).cumsum(a["dim"] % max(a["self"].dim(), 1)),
)


def _vector_norm(a: Args) -> Tensor:
    x = x_of(a["self"], a["dtype"] or float_of(a["self"].dtype)).abs()
    axis, keepdim, p = dims_of(a["dim"], a["self"].dim()), a["keepdim"], float(a["ord"])
    if p == math.inf:
        return x.max(axis, keepdim=keepdim)
    if p == 2:
        return (x * x).sum(axis, keepdim=keepdim).sqrt()
    return (x**p).sum(axis, keepdim=keepdim) ** (1 / p)


register(["linalg_vector_norm", "linalg_vector_norm.out"], "reduce", _vector_norm)


# ---- the fallback: CPU, once warned ----
_fallback_lib = torch.library.Library("_", "IMPL")  # type: ignore[no-untyped-call]
_warned: set[str] = set()


def _to_cpu(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.device.type == "xgrad":
        return storage.to_cpu_tensor(v).clone()  # torch's own memory: a CPU kernel may resize an out= tensor
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(e) for e in v)
    return v


def _to_xgrad(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.device.type == "cpu":
        return wrap(storage.from_cpu(v), v.dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_xgrad(e) for e in v)
    return v


def fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Run an aten op the table lacks on CPU (warning once per op), or raise under XGRAD_TORCH_STRICT=1."""
    name = op.name()
    if XGRAD_TORCH_STRICT.value:
        raise UnsupportedOpError(
            f"aten op {name} has no xgrad kernel (XGRAD_TORCH_STRICT=1); unset XGRAD_TORCH_STRICT to run it on CPU, "
            "or add it to xgrad_torch.ops.TABLE"
        )
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"xgrad_torch: aten op {name} runs on CPU (no xgrad kernel); results are copied back", stacklevel=2
        )
    cpu_args, cpu_kwargs = _to_cpu(args), {k: _to_cpu(v) for k, v in kwargs.items()}
    result = op(*cpu_args, **cpu_kwargs)
    bound, cpu_bound = bind(op, args, kwargs), bind(op, cpu_args, cpu_kwargs)
    for a in op._schema.arguments:  # mutated arguments: their new values go back into the xgrad tensors
        if a.alias_info is not None and a.alias_info.is_write and isinstance(bound[a.name], torch.Tensor):
            target, new = bound[a.name], cpu_bound[a.name]
            if tuple(target.shape) != tuple(new.shape):
                set_storage(target, wrap(storage.from_cpu(new), target.dtype))
            else:
                write(target, storage.from_cpu(new))
    outs = op._schema.returns
    if len(outs) == 1 and outs[0].alias_info is not None and outs[0].alias_info.is_write:
        return next(bound[a.name] for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    return _to_xgrad(result)


__all__ = ["TABLE", "Entry", "UnsupportedOpError", "fallback", "install", "kernel", "register"]
