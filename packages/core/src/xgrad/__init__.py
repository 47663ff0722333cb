"""xgrad: a small deep-learning framework whose Tensor API follows tinygrad's. Backends are plugins (see xgrad.plugin).

Keep `import xgrad` fast: it must not load plugins or open devices. The heavier public names (`Tensor`, `Device`,
`dtypes`, `UOp`, ...) are imported on first access through the module `__getattr__` below, so `from xgrad import
Tensor` works as usual and costs its import only then (`Device` brings the plugin contract and pluggy with it; the
registry itself is built on first device use).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from xgrad.helpers import Context, GlobalCounters, getenv
from xgrad.version import __version__

if TYPE_CHECKING:
    from xgrad.device import Device
    from xgrad.dtype import dtypes
    from xgrad.engine.function import function
    from xgrad.engine.jit import TinyJit
    from xgrad.tensor import Tensor
    from xgrad.uop.ops import UOp

    Variable = UOp.variable

_LAZY = {
    "Device": ("xgrad.device", "Device"),
    "Tensor": ("xgrad.tensor", "Tensor"),
    "dtypes": ("xgrad.dtype", "dtypes"),
    "UOp": ("xgrad.uop.ops", "UOp"),
    "TinyJit": ("xgrad.engine.jit", "TinyJit"),
    "function": ("xgrad.engine.function", "function"),
}


def __getattr__(name: str) -> Any:
    if name == "Variable":
        return importlib.import_module("xgrad.uop.ops").UOp.variable
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'xgrad' has no attribute {name!r}")


__all__ = [
    "Context",
    "Device",
    "GlobalCounters",
    "Tensor",
    "TinyJit",
    "UOp",
    "Variable",
    "__version__",
    "dtypes",
    "function",
    "getenv",
]
