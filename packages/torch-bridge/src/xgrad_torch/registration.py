"""The PrivateUse1 set-up: the one module that touches PyTorch's private APIs.

In: the installed torch (>= 2.10, which can register a PrivateUse1 backend from Python). Out: the device type
`xgrad` (`torch.device("xgrad:0")`, `t.xgrad()`, `t.is_xgrad`, `Module.xgrad()`), the device module `torch.xgrad`,
the Python hooks and device guard torch asks a backend for, and the few private calls the rest of the package needs
(`new_shell`, `redispatch_meta`, `set_storage`), named here so a torch upgrade that moves them breaks one file.

Backward runs on the caller's thread: torch's autograd engine starts a worker thread per device of a non-CPU backend,
and xgrad's lazy graphs and realize are not built to be driven from two threads at once, so registering turns the
engine's multithreading off for the process (`torch.autograd.set_multithreading_enabled(False)` for good).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import backend_registration

from xgrad import Tensor
from xgrad.errors import XgradError
from xgrad.helpers import Effect, knob

NAME = "xgrad"
MIN_TORCH = (2, 10)

XGRAD_TORCH_STRICT = knob(
    "XGRAD_TORCH_STRICT", 0, "1 = an aten op the torch bridge lacks raises instead of running on CPU", Effect.NONE
)


class TorchVersionError(XgradError, ImportError):
    """The installed torch cannot register a backend from Python."""


class BridgeError(XgradError, RuntimeError):
    """A torch call the bridge cannot carry out on the `xgrad` device."""


def torch_version(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as "2.13.0+cpu"."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise TorchVersionError(
            f"cannot read the torch version {version!r}; install torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}"
        )
    return int(m.group(1)), int(m.group(2))


def check_torch(version: str) -> None:
    """Raise TorchVersionError unless `version` can host a Python-registered backend (torch >= 2.10)."""
    if torch_version(version) < MIN_TORCH:
        raise TorchVersionError(
            f"xgrad_torch needs torch>={MIN_TORCH[0]}.{MIN_TORCH[1]} (a PrivateUse1 backend registered from Python), "
            f"found torch {version}; upgrade it: pip install 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'"
        )
    if not hasattr(torch._C, "_acc") or not hasattr(torch._C._acc, "create_empty_tensor"):
        raise TorchVersionError(f"torch {version} lacks torch._C._acc (the Python backend hooks); reinstall torch")


# ---- the device module: torch.xgrad ----
_sync_hooks: list[Callable[[], None]] = []


class DeviceModule:
    """`torch.xgrad`: what torch and users ask of a device type's module. One device, `xgrad:0`, is xgrad's default
    device (`xgrad.Device.DEFAULT`)."""

    @staticmethod
    def is_available() -> bool:
        """True: the device runs on whatever xgrad's default device is."""
        return True

    @staticmethod
    def is_initialized() -> bool:
        """True: nothing to initialise lazily."""
        return True

    @staticmethod
    def device_count() -> int:
        """One device, `xgrad:0`."""
        return 1

    @staticmethod
    def current_device() -> int:
        """The index of the current device (always 0)."""
        return 0

    @staticmethod
    def set_device(device: int | str | torch.device) -> None:
        """Select the current device; only index 0 exists."""
        index = torch.device(device).index if not isinstance(device, int) else device
        if index not in (None, 0):
            raise BridgeError(f"xgrad:{index} does not exist; the torch bridge has one device, xgrad:0")

    @staticmethod
    def synchronize(device: int | str | torch.device | None = None) -> None:
        """Realize every pending write, so timings and host reads see finished work."""
        for hook in _sync_hooks:
            hook()

    @staticmethod
    def manual_seed(seed: int) -> None:
        """Seed xgrad's random number generator (what `uniform_`, `normal_`, ... on `xgrad` draw from)."""
        Tensor.manual_seed(int(seed))

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        """Seed every device's generator: the one device's."""
        Tensor.manual_seed(int(seed))

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        """dtypes autocast may use on this device."""
        return [torch.float16, torch.bfloat16]


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self) -> Any:
        return torch._C._autograd.DeviceType.PrivateUse1


_registered = False


def register(on_synchronize: Callable[[], None]) -> None:
    """Make `xgrad` a torch device type (once per process); `on_synchronize` runs on `torch.xgrad.synchronize()`."""
    global _registered
    if _registered:
        return
    check_torch(torch.__version__)
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", NAME):
        raise BridgeError(
            f"torch's PrivateUse1 backend is already named {current!r} by another package; torch hosts one such "
            "backend per process: import xgrad_torch in a process without it"
        )
    if current != NAME:
        backend_registration.rename_privateuse1_backend(NAME)
        backend_registration.generate_methods_for_privateuse1_backend(for_storage=True)
        torch._register_device_module(NAME, DeviceModule)  # type: ignore[no-untyped-call]
        torch._C._acc.register_python_privateuseone_hook(_Hooks())
        torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    torch._C._set_multithreading_enabled(False)
    _pickle_through_cpu()
    _sync_hooks.append(on_synchronize)
    _registered = True


def _pickle_through_cpu() -> None:
    """Pickle (`torch.save`) a tensor on `xgrad` as its CPU copy plus the device to restore it to: torch's own route
    for tensors of a Python backend without host-readable storage (whose test, `_has_storage`, our tensors pass
    because their storage carries the xgrad buffer). `torch.load(..., map_location="cpu")` gives CPU tensors;
    without a map_location they come back on `xgrad`."""
    original = torch.Tensor._reduce_ex_internal
    if getattr(original, "_xgrad", False):
        return

    def reduce_ex_internal(self: torch.Tensor, proto: int) -> Any:
        if self.device.type != NAME:
            return original(self, proto)  # type: ignore[no-untyped-call]
        cpu = self.detach().cpu()
        return torch._utils._rebuild_device_tensor_from_cpu_tensor, (
            cpu,
            self.dtype,
            str(self.device),
            self.requires_grad,
        )

    reduce_ex_internal._xgrad = True  # type: ignore[attr-defined]
    torch.Tensor._reduce_ex_internal = reduce_ex_internal  # type: ignore[method-assign]


# ---- the private calls the rest of the package makes ----
_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def new_shell(shape: tuple[int, ...] | list[int], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor on `xgrad:0` with a storage of its own that holds no memory (the caller attaches the
    xgrad buffer to the storage)."""
    return torch._C._acc.create_empty_tensor(tuple(shape), dtype)


def redispatch_meta(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Run `op`'s Meta kernel on `xgrad` tensors: a view op computes its sizes, strides and offset exactly as CPU
    would and returns a tensor of the same (xgrad) storage."""
    return op.redispatch(_META, *args, **kwargs)


def set_storage(t: torch.Tensor, source: torch.Tensor) -> None:
    """Point `t` at `source`'s storage, sizes and strides (resizing an `out=` tensor to a new result)."""
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _META, t, source.untyped_storage(), source.storage_offset(), source.shape, source.stride()
    )


def decomposes(overload: str) -> bool:
    """Whether torch decomposes the aten overload itself (CompositeImplicitAutograd): a backend kernel for it would
    hide the decomposition from autograd, so the bridge registers none."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{overload}", "CompositeImplicitAutograd"))
