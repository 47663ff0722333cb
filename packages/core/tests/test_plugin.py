from __future__ import annotations

import dataclasses
import inspect
from types import ModuleType

import pytest

from xgrad import Context
from xgrad.plugin import (
    PLUGIN_API_VERSION,
    DeviceSpec,
    LazyFactory,
    NeedsModule,
    Unavailable,
    XgradHookSpecs,
    get_registry,
    module_exists,
    reset_registry,
    xgrad_api_version,
)


def test_builtin_plugin_loads_when_autoload_off_and_blocked() -> None:
    with Context(XGRAD_DISABLE_PLUGIN_AUTOLOAD=1, XGRAD_PLUGINS="", XGRAD_BLOCK_PLUGINS="builtin"):
        reset_registry()
        try:
            registry = get_registry()
            assert [r.name for r in registry.plugins] == ["builtin"]
            record = registry.plugins[0]
            assert (record.status, record.dist_name, record.api_version) == ("loaded", "xgrad-core", PLUGIN_API_VERSION)
            assert set(registry.devices) == {"NULL", "DISK"}
            assert not registry.devices["NULL"][0].runs_kernels
        finally:
            reset_registry()


def test_registry_is_built_once_until_reset() -> None:
    first = get_registry()
    assert get_registry() is first
    reset_registry()
    assert get_registry() is not first


def test_registry_records_test_plugin_devices_and_renderers(test_devices: ModuleType) -> None:
    record = next(r for r in get_registry().plugins if r.name == "xgrad_test_devices")
    assert record.source == "XGRAD_PLUGINS"
    assert record.dist_name is None
    assert record.devices == ["TESTLOW", "TESTHIGH", "TESTOFF", "TESTNORUN", "TESTRAISES", "TESTBROKEN"]
    assert record.renderers == ["TESTR"]


def test_every_hookspec_is_typed_and_says_when_called_and_what_it_returns() -> None:
    hooks = [m for name, m in inspect.getmembers(XgradHookSpecs) if name.startswith("xgrad_")]
    assert {h.__name__ for h in hooks} == {"xgrad_api_version", "xgrad_devices", "xgrad_renderers"}
    for hook in hooks:
        doc = inspect.getdoc(hook) or ""
        assert "Called" in doc and "Returns" in doc, hook.__name__
        assert "return" in hook.__annotations__


def test_device_spec_is_frozen() -> None:
    spec = DeviceSpec("X", lambda name: None, priority=0, available=lambda: (True, ""))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.priority = 1  # type: ignore[misc]


def test_module_exists_false_for_missing_parent() -> None:
    assert module_exists("xgrad.plugin")
    assert not module_exists("xgrad_no_such_package.device")


def test_lazy_factory_imports_its_module_only_when_called() -> None:
    factory = LazyFactory("xgrad_no_such_package.device", "Device")  # building it imports nothing
    with pytest.raises(ModuleNotFoundError):
        factory("X")
    assert LazyFactory("fractions", "Fraction")("3/4") == __import__("fractions").Fraction(3, 4)


def test_needs_module_is_available_only_when_the_module_is_found() -> None:
    assert NeedsModule("xgrad.plugin", "unused")() == (True, "")
    assert NeedsModule("xgrad_no_such_package.device", "not built yet")() == (False, "not built yet")


def test_unavailable_gives_its_reason_and_refuses_to_open() -> None:
    stub = Unavailable("X backend not built yet")
    assert stub() == (False, "X backend not built yet")
    with pytest.raises(NotImplementedError, match="X backend not built yet"):
        stub.open("X")


def test_shared_api_version_hook_serves_a_plugin_module_that_imports_it() -> None:
    import xgrad.builtin_plugin

    assert xgrad_api_version() == PLUGIN_API_VERSION
    assert xgrad.builtin_plugin.xgrad_api_version is xgrad_api_version
    record = next(r for r in get_registry().plugins if r.name == "builtin")
    assert (record.status, record.api_version) == ("loaded", PLUGIN_API_VERSION)
