"""`Device`: names, the default device, and opening devices through the plugin registry.

Device names read `TYPE[:index][:renderer[:arch]]` ("CPU", "CPU:1", "NULL:CUDA:sm_90", "NULL:HIP:gfx90a:xnack-"); an
empty renderer before an arch keeps the device's own renderer for that arch ("PYTHON::sm_90"),
or `DISK:<path>` with the path kept verbatim. The type is upper-cased; index 0 is dropped ("cpu:0" -> "CPU").
Core never imports a backend: every device comes from a plugin's `DeviceSpec` (see xgrad.plugin).
"""

from __future__ import annotations

import ast
import functools
import reprlib
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import xgrad.plugin as _plugin
from xgrad.contract import runtime_device_problems
from xgrad.errors import DeviceError, PluginError
from xgrad.helpers import DEV
from xgrad.plugin import FALLBACK_BELOW, Registry, Unavailable

if TYPE_CHECKING:
    from xgrad.dtype import DType

INSTALL_HINT = "e.g. from an xgrad checkout: pip install packages/core packages/codegen packages/backend-cpu"


@dataclass(frozen=True)
class DeviceName:
    """A parsed device name; `str()` gives the canonical form."""

    type: str  # "CPU", "NULL", "DISK"
    index: int = 0
    renderer: str | None = None
    arch: str | None = None
    path: str | None = None  # DISK only

    def __str__(self) -> str:
        if self.path is not None:
            return f"{self.type}:{self.path}"
        parts = [self.type]
        if self.index:
            parts.append(str(self.index))
        if self.renderer is not None or self.arch is not None:
            parts.append(self.renderer or "")  # "PYTHON::sm_90": the device's own renderer, for that arch
        if self.arch is not None:
            parts.append(self.arch)
        return ":".join(parts)


def parse_device(name: str) -> DeviceName:
    """Split a device name into its parts; raises DeviceError for malformed names."""
    if not isinstance(name, str) or not name.strip():
        raise DeviceError(f"device name must be a non-empty string like 'CPU' or 'CPU:1', got {name!r}")
    typ, _, rest = name.strip().partition(":")
    typ = typ.upper()
    if not typ:
        raise DeviceError(f"device name {name!r} has no type before ':'; write it like 'CPU:1'")
    if typ == "DISK":
        return DeviceName(typ, path=rest or None)
    parts = rest.split(":") if rest else []
    index = 0
    if parts and _is_int(parts[0]):
        index = int(parts.pop(0))
        if index < 0:
            raise DeviceError(f"device index in {name!r} must be >= 0")
    if parts and not parts[0] and not any(parts[1:]):
        raise DeviceError(f"device name {name!r} has an empty renderer; write it like 'NULL:CUDA:sm_90'")
    renderer = parts[0] if parts and parts[0] else None  # 'PYTHON::sm_90': no renderer named, only the arch
    arch = ":".join(parts[1:]) if len(parts) > 1 else None  # AMD targets carry ':' (gfx90a:xnack-)
    return DeviceName(typ, index, renderer, arch or None)


def multi_name(devices: tuple[str, ...] | list[str]) -> str:
    """The one-string name of a tuple of devices, as graph nodes carry it: `"('CPU', 'CPU:1')"` (the repr of the
    canonical tuple). Tensors show the tuple itself; `multi_devices` reads it back."""
    if not devices or not all(isinstance(d, str) for d in devices):
        raise DeviceError(f"a multi-device name needs a non-empty tuple of device names, got {devices!r}")
    canonical = tuple(str(parse_device(d)) for d in devices)
    if len(set(canonical)) != len(canonical):
        raise DeviceError(f"devices {canonical} repeat a device; name each device once")
    return repr(canonical)


def multi_devices(name: str | None) -> tuple[str, ...] | None:
    """The devices of a multi-device name (see `multi_name`), None for a single device."""
    if name is None or not name.startswith("("):
        return None
    return _parse_multi(name)


@functools.cache
def _parse_multi(name: str) -> tuple[str, ...]:
    parsed = ast.literal_eval(name)
    assert isinstance(parsed, tuple), f"malformed multi-device name {name!r}"
    return tuple(str(d) for d in parsed)


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


class _Device:
    """The device singleton: `Device["CPU"]` opens (once) and returns a device object; `Device.DEFAULT` names one."""

    def __init__(self) -> None:
        self._opened: dict[str, Any] = {}
        self._opened_from: Registry | None = None
        self._by_name: dict[str, tuple[Registry | None, Any]] = {}  # the name as given -> (registry, device)
        self._default: tuple[Registry, str] | None = None  # the registry DEFAULT was found in, and the name
        self._lock = threading.RLock()

    @staticmethod
    def canonicalize(name: str | tuple[str, ...] | list[str]) -> str:
        """The canonical spelling of a device name: `Device.canonicalize("cpu:0") == "CPU"`. A tuple of devices (a
        multi-device tensor) becomes its one-string form, see `multi_name`."""
        if isinstance(name, (tuple, list)):
            return multi_name(name)
        if (devices := multi_devices(name)) is not None:
            return multi_name(devices)
        return str(parse_device(name))

    @staticmethod
    def parse(name: str) -> DeviceName:
        """The parts of a device name (type, index, renderer, arch, path)."""
        return parse_device(name)

    def __getitem__(self, name: str) -> Any:
        # hot path (every kernel launch): a name seen before, while the registry it was opened from is current
        hit = self._by_name.get(name) if type(name) is str else None
        if hit is not None and hit[0] is _plugin._registry:  # the registry built, not rebuilt
            return hit[1]
        device = self._open(name)
        if type(name) is str:
            self._by_name[name] = (self._opened_from, device)
        return device

    def _open(self, name: str) -> Any:
        canonical = self.canonicalize(name)
        if multi_devices(canonical) is not None:
            raise DeviceError(f"{name} names several devices; open one of them, e.g. Device[{canonical!r}[0]]")
        registry = _registry()
        with self._lock:
            if self._opened_from is not registry:  # the registry was rebuilt: forget devices of the old one
                self._opened, self._opened_from = {}, registry
            if canonical in self._opened:
                return self._opened[canonical]
            typ = parse_device(canonical).type
            available, reason = registry.device_available(typ)
            if not available:
                raise DeviceError(f"device {canonical} is not available: {reason}\n{_describe_devices(registry)}")
            spec, record = registry.devices[typ]
            try:
                device = spec.factory(canonical)
            except Exception as e:
                raise DeviceError(
                    f"opening device {canonical} (plugin {record.name}) failed: {type(e).__name__}: {e}"
                ) from e
            if problems := runtime_device_problems(device, spec.runs_kernels):
                kind = "a device that runs kernels (xgrad.buffer.RuntimeDevice)" if spec.runs_kernels else "a device"
                raise PluginError(
                    f"plugin {record.label()}: the factory of device {typ} gave {reprlib.repr(device)} for "
                    f"{canonical}, not {kind}: {'; '.join(problems)}. Fix or update the plugin, or hide it with "
                    f"XGRAD_BLOCK_PLUGINS={record.switch()}"
                )
            self._opened[canonical] = device
            return device

    @property
    def DEFAULT(self) -> str:  # noqa: N802 (the tinygrad spelling)
        """The DEV knob's (first) device if set, else the available device that runs kernels with the highest priority
        that opens. A device that fails to open is passed over with one warning on stderr naming its plugin and the
        switch that hides it; a fallback (priority below `xgrad.plugin.FALLBACK_BELOW`: WebGPU on the CPU, the PYTHON
        interpreter) is chosen with one warning saying why each installed device above it is unavailable. An
        interface prefix (`DEV=MOCK+NV`) is not part of the name: a backend reads it as `DEV.interface`."""
        if DEV.value:
            return self.canonicalize(DEV.device)
        registry = _registry()
        if self._default is not None and self._default[0] is registry:  # availability is checked once per registry
            return self._default[1]
        with self._lock:
            candidates = self.get_available_devices(runs_kernels_only=True)
            failures: list[str] = []
            for name in candidates:
                try:
                    self[name]
                except (DeviceError, PluginError) as e:
                    record = registry.devices[name][1]
                    failures.append(f"{name}: {e}")
                    _warn_once(
                        f"xgrad: device {name} of plugin {record.label()} failed to open, so it is not the default "
                        f"device; hide the plugin with XGRAD_BLOCK_PLUGINS={record.switch()} or choose a device with "
                        f"DEV. The error: {e}",
                        key=f"open {name} {record.name}",
                    )
                    continue
                if slower := _fallback_reason(registry, name):
                    _warn_once(slower)
                self._default = (registry, name)
                return name
            reason = no_default_reason(registry)
            raise DeviceError(f"{reason}; devices that failed to open: {'; '.join(failures)}" if failures else reason)

    @DEFAULT.setter
    def DEFAULT(self, name: str) -> None:  # noqa: N802
        DEV.value = self.canonicalize(name)

    def get_available_devices(self, runs_kernels_only: bool = False) -> list[str]:
        """Names of the available device types, highest priority first (ties by name)."""
        registry = _registry()
        names = [
            name
            for name, (spec, _) in registry.devices.items()
            if (spec.runs_kernels or not runs_kernels_only) and registry.device_available(name)[0]
        ]
        return sorted(names, key=lambda n: (-registry.devices[n][0].priority, n))

    def renderer(self, name: str, arch: str | None = None) -> Any:
        """Build renderer `name` ("CUDA", "C", ...) for `arch` (None = the renderer's default_arch)."""
        registry = _registry()
        key = (
            name
            if name in registry.renderers
            else next((r for r in registry.renderers if r.upper() == name.upper()), None)
        )
        if key is None:
            raise DeviceError(
                f"no installed plugin offers a renderer named {name}; "
                f"renderers: {', '.join(sorted(registry.renderers)) or 'none'}"
            )
        available, reason = registry.renderer_available(key)
        if not available:
            raise DeviceError(f"renderer {key} is not available: {reason}")
        spec, record = registry.renderers[key]
        try:
            built = spec.factory(arch if arch is not None else spec.default_arch)
        except Exception as e:
            raise DeviceError(f"building renderer {key} (plugin {record.name}) failed: {type(e).__name__}: {e}") from e
        if built is None:
            raise PluginError(
                f"plugin {record.label()}: the factory of renderer {key} returned None. Fix or update the plugin, or "
                f"hide it with XGRAD_BLOCK_PLUGINS={record.switch()}"
            )
        return built


def is_dtype_supported(dtype: DType, device: str | None = None) -> bool:
    """Whether tensors of `dtype` can be computed on `device` (default: Device.DEFAULT): its renderer's
    `supported_dtypes()`, which include what codegen emulates there (bfloat16, fp8). A device without a renderer
    (DISK, NULL with none installed) only stores bytes and holds every dtype.

    >>> is_dtype_supported(dtypes.float32, "CPU"), is_dtype_supported(dtypes.bfloat16, "CPU")
    (True, True)
    """
    renderer = getattr(Device[device if device is not None else Device.DEFAULT], "renderer", None)
    if renderer is None:
        return True
    return dtype.scalar() in renderer.supported_dtypes()


def _registry() -> Registry:
    return _plugin.get_registry()


def _describe_devices(registry: Registry) -> str:
    lines = []
    for name in sorted(registry.devices):
        available, reason = registry.device_available(name)
        plugin = registry.devices[name][1].name
        lines.append(f"  {name} (plugin {plugin}): " + ("available" if available else f"unavailable: {reason}"))
    failed = [r for r in registry.plugins if r.status != "loaded"]
    lines += [f"  plugin {r.name} {r.status}: {r.reason}" for r in failed]
    return "devices:\n" + "\n".join(lines) + "\nrun `xgrad info` for details"


_warned: set[str] = set()


def _warn_once(message: str, key: str | None = None) -> None:
    """Print `message` on stderr unless a message with the same key (default: the message) was printed before."""
    key = message if key is None else key
    if key not in _warned:
        _warned.add(key)
        print(message, file=sys.stderr)


def _fallback_reason(registry: Registry, name: str) -> str:
    """The warning for a default device below FALLBACK_BELOW (a fallback, slower than the C backend): why each
    installed device that would outrank it is unavailable, as `xgrad info` says. Devices of backends not built yet
    (their availability check is `xgrad.plugin.Unavailable`) are left out; "" when nothing is left."""
    priority = registry.devices[name][0].priority
    if priority >= FALLBACK_BELOW:
        return ""
    reasons = [
        f"{other}: {registry.device_available(other)[1]}"
        for other, (spec, _) in sorted(registry.devices.items())
        if spec.runs_kernels
        and spec.priority > priority
        and not isinstance(spec.available, Unavailable)
        and not registry.device_available(other)[0]
    ]
    if not reasons:
        return ""
    return (
        f"xgrad: the default device is {name}, a fallback, because {'; '.join(reasons)}. "
        f"Fix that (`xgrad info` lists every device) or set DEV={name} to choose it and silence this warning"
    )


def no_default_reason(registry: Registry) -> str:
    """Why no device can be the default, with the fix (used by Device.DEFAULT and `xgrad info`)."""
    runnable = sorted(name for name, (spec, _) in registry.devices.items() if spec.runs_kernels)
    if not runnable:
        return f"no runnable backend is installed; install one, {INSTALL_HINT}"
    reasons = "; ".join(f"{name}: {registry.device_available(name)[1]}" for name in runnable)
    return f"no runnable backend is available ({reasons}); fix one of these or install another backend, {INSTALL_HINT}"


Device = _Device()
