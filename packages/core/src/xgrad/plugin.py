"""The backend plugin contract: pluggy hook specifications, the spec dataclasses plugins return, and the registry.

A backend is a module with `@hookimpl` functions named like the hookspecs below, published under the entry-point
group `xgrad.backends` (or named in the XGRAD_PLUGINS knob). Hooks return descriptions (`DeviceSpec`,
`RendererSpec`), never live devices. The registry is built on first use, not at `import xgrad`.

A plugin that fails to import, raises in a hook, returns something that is not a list of specs, or targets another
PLUGIN_API_VERSION never breaks anything: it is kept as a `PluginRecord` with status "failed" and the reason, and
`xgrad info` shows it (an import that raises KeyboardInterrupt is not caught: Ctrl-C stops the program).
See tests/fixtures/xgrad-fake-backend for a complete third-party plugin.

Name clashes are settled by rank, not by load order: a plugin named in XGRAD_PLUGIN_OVERRIDE outranks xgrad's bundled
plugins (BUNDLED_MODULES), which outrank every other plugin; between equals the first loaded keeps the name (the
builtin plugin, then entry points sorted by name, then XGRAD_PLUGINS in its order). The loser's record lists the clash
under `problems`. Plugin names in the knobs match a plugin's entry-point name, module or distribution, compared as
PEP 503 normalises distribution names (case, and runs of `-`, `_`, `.` are equal).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pluggy

from xgrad.errors import PluginError
from xgrad.helpers import XGRAD_BLOCK_PLUGINS, XGRAD_DISABLE_PLUGIN_AUTOLOAD, XGRAD_PLUGIN_OVERRIDE, XGRAD_PLUGINS
from xgrad.version import __version__

PROJECT_NAME = "xgrad"
ENTRY_POINT_GROUP = "xgrad.backends"
PLUGIN_API_VERSION = 1
BUILTIN_PLUGIN_MODULE = "xgrad.builtin_plugin"
# a runnable device of lower priority is a fallback (slower than C compiled for the host): the default device becomes
# one only with a warning that says why each installed device of higher priority is unavailable
FALLBACK_BELOW = 10
# the plugin modules of the distributions in xgrad's repository: their device and renderer names win clashes with a
# third-party plugin's unless the user names that plugin in XGRAD_PLUGIN_OVERRIDE
BUNDLED_MODULES = frozenset(
    {
        BUILTIN_PLUGIN_MODULE,
        "xgrad_codegen.plugin",
        "xgrad_cpu.plugin",
        "xgrad_nv.plugin",
        "xgrad_amd.plugin",
        "xgrad_webgpu.plugin",
    }
)

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@dataclass(frozen=True)
class DeviceSpec:
    """A device type a plugin offers. Core builds the device only when it is first used."""

    name: str  # the device type, upper case, no ':' ("CPU", "NV", "NULL")
    factory: Callable[[str], Any]  # canonical device name ("CPU:1", "NULL:CUDA:sm_90") -> device object
    priority: int  # the available runs_kernels device with the highest priority that opens is Device.DEFAULT; below
    # FALLBACK_BELOW (the CPU backend's 10) a device is a fallback, made the default only with a warning
    available: Callable[[], tuple[bool, str]]  # never raises; (False, "why not and how to fix") when unusable
    runs_kernels: bool = True  # False for NULL/DISK-like devices: never picked as Device.DEFAULT
    description: str = ""


@dataclass(frozen=True)
class RendererSpec:
    """A renderer (kernel AST -> source) a plugin offers for compile-only work, e.g. DEV=NULL:CUDA:sm_90."""

    name: str  # "C", "CUDA", "PTX", "HIP", "WGSL"; case is kept
    factory: Callable[[str | None], Any]  # arch (None = default_arch) -> renderer object
    available: Callable[[], tuple[bool, str]]  # never raises; (False, reason) when unusable
    default_arch: str | None = None
    description: str = ""


class XgradHookSpecs:
    """The hooks a backend plugin implements (as module-level functions decorated with `xgrad.plugin.hookimpl`)."""

    @hookspec(firstresult=True)
    def xgrad_api_version(self) -> int:  # type: ignore[empty-body]
        """Called once when the plugin is registered, before any other hook.

        Returns the PLUGIN_API_VERSION the plugin was written for. A plugin whose version differs from core's (or
        that does not implement this hook) is refused and listed as failed by `xgrad info`.
        """

    @hookspec
    def xgrad_devices(self) -> list[DeviceSpec]:  # type: ignore[empty-body]
        """Called once per registry build (first use of `Device` or `xgrad info`), after the version check.

        Returns the device types the plugin offers as `DeviceSpec`s (possibly empty). Must not open a device.
        """

    @hookspec
    def xgrad_renderers(self) -> list[RendererSpec]:  # type: ignore[empty-body]
        """Called once per registry build, after `xgrad_devices`.

        Returns the renderers the plugin offers for compile-only use as `RendererSpec`s (possibly empty).
        """


PluginStatus = Literal["loaded", "failed", "blocked"]
PluginSource = Literal["builtin", "entry point", "XGRAD_PLUGINS"]


@dataclass
class PluginRecord:
    """What the registry knows about one plugin, loaded or not (shown by `xgrad info`)."""

    name: str  # entry-point name, or module name for XGRAD_PLUGINS (XGRAD_BLOCK_PLUGINS matches it, module or dist)
    module: str
    source: PluginSource
    status: PluginStatus = "loaded"
    reason: str = ""  # why it failed or was blocked
    dist_name: str | None = None
    dist_version: str | None = None
    api_version: int | None = None
    devices: list[str] = field(default_factory=list)
    renderers: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # non-fatal: e.g. a device name another plugin took first

    @property
    def bundled(self) -> bool:
        """Whether this is one of xgrad's own plugins (BUNDLED_MODULES), which win device-name clashes."""
        return self.module in BUNDLED_MODULES

    def matches(self, names: set[str]) -> bool:
        """Whether any of the PEP 503-normalised `names` is this plugin's name, module or distribution."""
        own = {self.name, self.module} | ({self.dist_name} if self.dist_name else set())
        return bool(names & {normalize_name(n) for n in own})

    def label(self) -> str:
        """How messages name the plugin: its name and, when known, its distribution."""
        return f"{self.name} ({self.dist_name})" if self.dist_name and self.dist_name != self.name else self.name

    def switch(self) -> str:
        """The value of XGRAD_BLOCK_PLUGINS / XGRAD_PLUGIN_OVERRIDE that names this plugin."""
        return self.dist_name or self.name


class Registry:
    """Every plugin, and the devices and renderers of the loaded ones. Build it with `get_registry()`."""

    def __init__(self) -> None:
        self.plugins: list[PluginRecord] = []
        self.devices: dict[str, tuple[DeviceSpec, PluginRecord]] = {}
        self.renderers: dict[str, tuple[RendererSpec, PluginRecord]] = {}
        self.pm = pluggy.PluginManager(PROJECT_NAME)
        self.pm.add_hookspecs(XgradHookSpecs)
        self._availability: dict[tuple[str, str], tuple[bool, str]] = {}
        self._override: set[str] = set()

    def device_available(self, name: str) -> tuple[bool, str]:
        """Availability of device type `name` (checked once per registry; never raises)."""
        if name not in self.devices:
            return False, f"no installed plugin offers a device named {name}"
        return self._check("device", name, self.devices[name][0].available)

    def renderer_available(self, name: str) -> tuple[bool, str]:
        """Availability of renderer `name` (checked once per registry; never raises)."""
        if name not in self.renderers:
            return False, f"no installed plugin offers a renderer named {name}"
        return self._check("renderer", name, self.renderers[name][0].available)

    def _check(self, kind: str, name: str, check: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
        key = (kind, name)
        if key not in self._availability:
            self._availability[key] = _call_availability(check)
        return self._availability[key]

    # ---- building ----
    def load(self) -> None:
        builtin = PluginRecord("builtin", BUILTIN_PLUGIN_MODULE, "builtin")
        builtin.dist_name, builtin.dist_version = "xgrad-core", __version__
        self._add(builtin, lambda: importlib.import_module(BUILTIN_PLUGIN_MODULE))
        blocked = {normalize_name(n) for n in _split_names(XGRAD_BLOCK_PLUGINS.value)}
        self._override = {normalize_name(n) for n in _split_names(XGRAD_PLUGIN_OVERRIDE.value)}
        if not XGRAD_DISABLE_PLUGIN_AUTOLOAD.value:
            for ep in _entry_points():
                record = PluginRecord(ep.name, ep.value, "entry point")
                if ep.dist is not None:
                    record.dist_name, record.dist_version = ep.dist.name, ep.dist.version
                if record.matches(blocked):
                    self._block(record)
                else:
                    self._add(record, ep.load)
        for modname in _ordered_names(XGRAD_PLUGINS.value):
            record = PluginRecord(modname, modname, "XGRAD_PLUGINS")
            if record.matches(blocked):
                self._block(record)
            else:
                self._add(record, functools.partial(importlib.import_module, modname))

    def _block(self, record: PluginRecord) -> None:
        record.status, record.reason = "blocked", "named in XGRAD_BLOCK_PLUGINS"
        self.plugins.append(record)

    def _add(self, record: PluginRecord, load: Callable[[], object]) -> None:
        try:
            plugin = load()
        except (Exception, SystemExit) as e:  # a plugin must never take xgrad down; Ctrl-C (KeyboardInterrupt) does
            self.plugins.append(record)
            _fail(record, f"import failed: {_describe(e)}")
            return
        if self.pm.is_registered(plugin):
            return  # the same module reached twice (entry point and XGRAD_PLUGINS): keep the first record
        self.plugins.append(record)
        try:
            self.pm.register(plugin, name=f"{record.source}:{record.name}")
            devices, renderers = self._collect(plugin, record)
        except Exception as e:
            _fail(record, str(e) if isinstance(e, PluginError) else _describe(e))
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            return
        for spec in devices:
            if self._claim("device", spec.name, record, self.devices):
                self.devices[spec.name] = (spec, record)
                record.devices.append(spec.name)
        for rspec in renderers:
            if self._claim("renderer", rspec.name, record, self.renderers):
                self.renderers[rspec.name] = (rspec, record)
                record.renderers.append(rspec.name)

    def _rank(self, record: PluginRecord) -> int:
        return 2 if record.matches(self._override) else 1 if record.bundled else 0

    def _claim(self, kind: str, name: str, record: PluginRecord, table: dict[str, tuple[Any, PluginRecord]]) -> bool:
        """Whether `record` takes `name` (a device or renderer name); the loser of a clash notes it in its problems."""
        if name not in table:
            return True
        holder = table[name][1]
        if self._rank(record) <= self._rank(holder):
            why = "bundled with xgrad" if holder.bundled and not record.bundled else "loaded first"
            fix = f"; set XGRAD_PLUGIN_OVERRIDE={record.switch()} to use this one" if holder.bundled else ""
            record.problems.append(f"{kind} {name} ignored: plugin {holder.label()} has it ({why}){fix}")
            return False
        names = holder.devices if kind == "device" else holder.renderers
        names.remove(name)
        holder.problems.append(
            f"{kind} {name} given to plugin {record.label()}, named in XGRAD_PLUGIN_OVERRIDE"
            if record.matches(self._override)
            else f"{kind} {name} given to plugin {record.label()}, bundled with xgrad"
        )
        return True

    def _collect(self, plugin: object, record: PluginRecord) -> tuple[list[DeviceSpec], list[RendererSpec]]:
        version = _call_hook(self.pm, plugin, "xgrad_api_version")
        if version is None:
            raise PluginError(
                f"plugin {record.name} does not implement xgrad_api_version(); "
                f"add a @hookimpl returning {PLUGIN_API_VERSION}"
            )
        record.api_version = version if isinstance(version, int) else None
        if version != PLUGIN_API_VERSION:
            fix = f"install a {record.dist_name or record.name} built for it" if record.source != "builtin" else ""
            raise PluginError(
                f"plugin {record.name} targets plugin API {version!r} but xgrad-core speaks "
                f"{PLUGIN_API_VERSION}; {fix or 'reinstall xgrad-core'}"
            )
        devices = _flatten_specs(_call_hook(self.pm, plugin, "xgrad_devices"), DeviceSpec, "xgrad_devices")
        renderers = _flatten_specs(_call_hook(self.pm, plugin, "xgrad_renderers"), RendererSpec, "xgrad_renderers")
        for d in devices:
            if not d.name or d.name != d.name.upper() or ":" in d.name:
                raise PluginError(f"device name {d.name!r} must be non-empty upper case without ':'")
        for r in renderers:
            if not r.name or ":" in r.name:
                raise PluginError(f"renderer name {r.name!r} must be non-empty without ':'")
        return devices, renderers


def _call_hook(pm: pluggy.PluginManager, plugin: object, hookname: str) -> Any:
    """Call one hook of one plugin only, so a failing plugin is blamed alone."""
    others = [p for p in pm.get_plugins() if p is not plugin]
    try:
        return pm.subset_hook_caller(hookname, remove_plugins=others)()
    except Exception as e:
        raise PluginError(f"hook {hookname} raised {_describe(e)}") from e


def _flatten_specs(results: Any, kind: type[Any], hookname: str) -> list[Any]:
    # a non-firstresult hook returns one list per implementation; a plugin module has at most one
    specs: list[Any] = []
    for result in results:
        if not isinstance(result, (list, tuple)) or not all(isinstance(s, kind) for s in result):
            raise PluginError(f"hook {hookname} returned {_short(result)}, not a list of {kind.__name__}")
        specs.extend(result)
    return specs


def _call_availability(check: Callable[[], tuple[bool, str]]) -> tuple[bool, str]:
    try:
        result: object = check()  # typed as a tuple, but it is third-party code: trust nothing
    except Exception as e:
        return False, f"availability check raised {_describe(e)}"
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], str)):
        return False, f"availability check returned {_short(result)}, not (bool, str)"
    return bool(result[0]), result[1]


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    seen: set[tuple[str, str]] = set()
    eps = []
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        if (ep.name, ep.value) not in seen:  # the same distribution can be on sys.path twice
            seen.add((ep.name, ep.value))
            eps.append(ep)
    return eps


def _fail(record: PluginRecord, reason: str) -> None:
    record.status, record.reason = "failed", reason
    record.devices.clear()
    record.renderers.clear()


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _short(x: object) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _split_names(value: str) -> set[str]:
    return {n.strip() for n in value.split(",") if n.strip()}


def _ordered_names(value: str) -> list[str]:
    return list(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))


def normalize_name(name: str) -> str:
    """A plugin or distribution name as PEP 503 compares them: lower case, runs of `-`, `_`, `.` made one `-`
    (`Xgrad_Fake.Backend` and `xgrad-fake-backend` are the same name)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def module_exists(modname: str) -> bool:
    """Whether `modname` can be imported, without importing it (parents are imported); for availability checks."""
    try:
        return importlib.util.find_spec(modname) is not None
    except (ImportError, ValueError):
        return False


# ---- building blocks for plugin modules (the bundled backends use them; so may a third-party one) ----
@hookimpl
def xgrad_api_version() -> int:
    """The version hook every plugin needs, answering this core's PLUGIN_API_VERSION. A plugin module picks it up with
    `from xgrad.plugin import xgrad_api_version as xgrad_api_version` (or writes its own returning the version it
    was written for)."""
    return PLUGIN_API_VERSION


@dataclass(frozen=True)
class LazyFactory:
    """A `DeviceSpec`/`RendererSpec` factory that imports `module` on the first call and calls its `attr` with the
    argument (device name or arch), so that listing a plugin's hooks imports nothing heavy."""

    module: str
    attr: str

    def __call__(self, arg: str | None) -> Any:
        return getattr(importlib.import_module(self.module), self.attr)(arg)


@dataclass(frozen=True)
class NeedsModule:
    """An availability check: (True, "") when `module` can be imported (found, not imported), else (False, reason)."""

    module: str
    reason: str

    def __call__(self) -> tuple[bool, str]:
        return (True, "") if module_exists(self.module) else (False, self.reason)


@dataclass(frozen=True)
class Unavailable:
    """A stub backend's device or renderer: as `available` it answers (False, reason); `open` is its factory and
    raises NotImplementedError(reason)."""

    reason: str

    def __call__(self) -> tuple[bool, str]:
        return False, self.reason

    def open(self, name: str | None) -> Any:
        raise NotImplementedError(self.reason)


# ---- the process-wide registry ----
_registry: Registry | None = None
_lock = threading.RLock()
_building = False


def get_registry() -> Registry:
    """The registry of every plugin, built on first call (loads entry points, XGRAD_PLUGINS and the builtin plugin)."""
    global _registry, _building
    if (built := _registry) is not None:  # the hot path: no lock once built (reading a global is atomic)
        return built
    with _lock:
        if _registry is None:
            if _building:
                raise PluginError(
                    "a plugin used the device registry while it was being built; "
                    "plugins must not open devices or query Device at import or in hooks"
                )
            _building = True
            try:
                registry = Registry()
                registry.load()
                _registry = registry
            finally:
                _building = False
        return _registry


def reset_registry() -> None:
    """Forget the registry; the next `get_registry()` rebuilds it from the current knob values (for tests)."""
    global _registry
    with _lock:
        _registry = None
