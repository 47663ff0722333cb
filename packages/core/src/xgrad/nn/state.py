"""Model state: find a model's tensors (`get_state_dict`, `get_parameters`), load weights into it
(`load_state_dict`), and read/write weights files (`safe_load`/`safe_save` for safetensors, `torch_load` for
`torch.save` files, `zip_extract`/`tar_extract`, `TensorIO`).

Loaders accept a path (str or pathlib.Path) or a uint8 Tensor of the file's bytes, and return lazy tensors: views of
the file on the DISK device, read only when used. `load_state_dict` moves each one to its model tensor's device.

Differences from tinygrad: `load_state_dict` writes into already realized model tensors with `assign` (so optimizers
and JIT captures that hold them see the new values) and casts the loaded value to the model tensor's dtype; a model
tensor that is still lazy (never realized) has its graph replaced instead, so its initializer never runs. Missing keys
raise `StateDictError` naming them all before anything is loaded. `get_state_dict` skips reference cycles and Python
modules stored as attributes.
"""

from __future__ import annotations

import time
import types
from typing import Any, cast

from xgrad.errors import ShapeError
from xgrad.helpers import DEBUG
from xgrad.nn.archives import tar_extract, zip_extract
from xgrad.nn.fileview import CheckpointError, StateDictError, TensorIO, UnsafePickleError
from xgrad.nn.safetensors import safe_load, safe_load_metadata, safe_save
from xgrad.nn.torch_load import torch_load
from xgrad.tensor import Tensor
from xgrad.uop.ops import Ops

__all__ = [
    "CheckpointError",
    "StateDictError",
    "TensorIO",
    "UnsafePickleError",
    "get_parameters",
    "get_state_dict",
    "load_state_dict",
    "safe_load",
    "safe_load_metadata",
    "safe_save",
    "tar_extract",
    "torch_load",
    "zip_extract",
]


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
    """Every tensor reachable from `obj`, by dotted name: object attributes, dict keys, list/tuple indices and
    namedtuple fields are walked (in that order of preference), like a torch `state_dict()`.

    >>> class Layer:
    ...     def __init__(self): self.w, self.b = Tensor([1.0, 2.0]), Tensor([0.0])
    >>> class Net:
    ...     def __init__(self): self.layers = [Layer(), Layer()]
    >>> list(get_state_dict(Net()))
    ['layers.0.w', 'layers.0.b', 'layers.1.w', 'layers.1.b']
    """
    out: dict[str, Tensor] = {}
    _walk(obj, prefix, tensor_type, out, set())
    return out


def _walk(obj: Any, prefix: str, tensor_type: type, out: dict[str, Tensor], active: set[int]) -> None:
    if isinstance(obj, tensor_type):
        out[prefix.strip(".")] = cast(Tensor, obj)
        return
    if isinstance(obj, types.ModuleType) or id(obj) in active:
        return
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):  # namedtuple
        items: Any = obj._asdict().items()
    elif isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif isinstance(getattr(obj, "__dict__", None), dict):
        items = vars(obj).items()
    else:
        return
    active.add(id(obj))
    for key, value in list(items):
        _walk(value, f"{prefix}{key}.", tensor_type, out, active)
    active.discard(id(obj))


def get_parameters(obj: Any) -> list[Tensor]:
    """The tensors of `obj` (`get_state_dict(obj).values()`), for an optimizer. A tensor reachable under two names
    appears twice, as in tinygrad (optimizers drop duplicates).

    >>> class Net:
    ...     def __init__(self): self.w, self.b = Tensor([1.0, 2.0]), Tensor([0.0])
    >>> [p.shape for p in get_parameters(Net())]
    [(2,), (1,)]
    """
    return list(get_state_dict(obj).values())


def load_state_dict(
    model: Any,
    state_dict: dict[str, Tensor],
    strict: bool = True,
    verbose: bool = True,
    consume: bool = False,
    realize: bool = True,
) -> None:
    """Load `state_dict` (e.g. from `safe_load` or `torch_load`) into the tensors of `model`, found by
    `get_state_dict(model)`. Each value is moved to its model tensor's device and cast to its dtype; shapes must match
    (() and (1,) are interchangeable). `strict=False` skips model tensors the state dict lacks; keys of the state dict
    the model lacks are reported but never an error. `consume=True` deletes each entry from `state_dict` once loaded
    (freeing the memory of large state dicts as it goes); `realize=False` leaves the loads lazy.

    >>> class Net:
    ...     def __init__(self): self.w = Tensor([0.0, 0.0]).realize()
    >>> net = Net()
    >>> load_state_dict(net, {"w": Tensor([1.0, 2.0])}, verbose=False)
    >>> net.w.tolist()
    [1.0, 2.0]
    """
    start = time.perf_counter()
    model_sd = get_state_dict(model)
    missing = [k for k in model_sd if k not in state_dict]
    unexpected = [k for k in state_dict if k not in model_sd]
    if strict and missing:
        raise StateDictError(
            f"load_state_dict: {len(missing)} model tensor(s) missing from the state dict: {_names(missing)}"
            + (f"; the state dict has other keys: {_names(unexpected)}" if unexpected else "")
            + ". Rename the keys to match get_state_dict(model), or pass strict=False to load only what matches"
        )
    if unexpected and (verbose or DEBUG >= 1):
        print(f"load_state_dict: {len(unexpected)} key(s) of the state dict are not in the model: {_names(unexpected)}")
    if missing and (verbose or DEBUG >= 1):
        print(f"load_state_dict: not loading {len(missing)} model tensor(s): {_names(missing)}")
    for k, v in model_sd.items():
        if k in state_dict and v.shape != state_dict[k].shape and {v.shape, state_dict[k].shape} != {(), (1,)}:
            raise ShapeError(
                f"load_state_dict: {k!r} has shape {state_dict[k].shape} in the state dict but {v.shape} in the model"
            )
    nbytes = 0
    for k, v in model_sd.items():
        if k not in state_dict:
            continue
        value = state_dict[k]
        if value.shape != v.shape:
            value = value.reshape(v.shape)
        value = value.to(v.device)
        if value.dtype != v.dtype:
            value = value.cast(v.dtype)
        if v.uop.base.op is Ops.BUFFER or v.uop.op is Ops.ASSIGN:
            v.assign(value)
        else:  # a lazy initializer: no need to compute it just to overwrite it
            v.uop = value.uop
        if realize:
            v.realize()
        nbytes += v.nbytes()
        if consume:
            del state_dict[k]
    if verbose:
        elapsed = time.perf_counter() - start
        loaded = len(model_sd) - len(missing)
        print(f"loaded {loaded} tensors, {nbytes / 1e6:.2f} MB in {elapsed * 1e3:.2f} ms")


def _names(keys: list[str], limit: int = 10) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")
