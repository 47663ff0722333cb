"""Plugin discovery across packages: real installed entry points, broken plugins, and the three plugin switches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from xgrad import Context, Device
from xgrad.plugin import PluginRecord, get_registry

InfoJson = Callable[..., dict[str, Any]]


def _record(name: str) -> PluginRecord:
    return next(r for r in get_registry().plugins if r.name == name)


def _plugin(info: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in info["plugins"] if p["name"] == name)


def test_fake_backend_discovered_through_installed_entry_point(plugins_path: None) -> None:
    record = _record("fake")
    assert record.source == "entry point"
    assert (record.dist_name, record.dist_version, record.module) == (
        "xgrad-fake-backend",
        "0.1.0",
        "xgrad_fake_backend",
    )
    assert (record.status, record.devices, record.renderers) == ("loaded", ["FAKE"], ["FAKE"])
    assert Device["fake"].name == "FAKE"
    assert Device["FAKE:1"].name == "FAKE:1"
    assert Device.renderer("FAKE").arch == "fake1"


def test_fake_backend_is_never_the_default(plugins_path: None) -> None:
    assert "FAKE" in Device.get_available_devices()
    assert "FAKE" not in Device.get_available_devices(runs_kernels_only=True)


@pytest.mark.parametrize(
    ("name", "dist", "device"),
    [
        ("cpu", "xgrad-backend-cpu", "CPU"),
        ("codegen", "xgrad-codegen", "PYTHON"),
        ("nv", "xgrad-backend-nv", "NV"),
        ("amd", "xgrad-backend-amd", "AMD"),
        ("webgpu", "xgrad-backend-webgpu", "WEBGPU"),
    ],
)
def test_in_repo_backend_discovered_through_entry_point(plugins_path: None, name: str, dist: str, device: str) -> None:
    record = _record(name)
    assert (record.status, record.dist_name, record.devices) == ("loaded", dist, [device])


def test_plugin_raising_at_import_is_recorded_failed(plugins_path: None) -> None:
    with Context(XGRAD_PLUGINS="xgrad_broken_import"):
        record = _record("xgrad_broken_import")
    assert record.status == "failed"
    assert record.reason == "import failed: RuntimeError: xgrad_broken_import is broken on purpose"
    assert _record("fake").status == "loaded"


def test_plugin_raising_in_hook_is_recorded_failed(plugins_path: None) -> None:
    with Context(XGRAD_PLUGINS="xgrad_broken_hook"):
        record = _record("xgrad_broken_hook")
    assert record.status == "failed"
    assert record.reason == "hook xgrad_devices raised ValueError: xgrad_broken_hook is broken on purpose"
    assert record.devices == []


def test_plugin_with_wrong_api_version_is_refused_with_fix(plugins_path: None) -> None:
    with Context(XGRAD_PLUGINS="xgrad_wrong_api"):
        record = _record("xgrad_wrong_api")
        assert "WRONGAPI" not in get_registry().devices
    assert record.status == "failed"
    assert record.api_version == 999
    assert "targets plugin API 999 but xgrad-core speaks 1" in record.reason
    assert "\n" not in record.reason


def test_plugin_returning_garbage_is_recorded_failed(plugins_path: None) -> None:
    with Context(XGRAD_PLUGINS="xgrad_garbage"):
        record = _record("xgrad_garbage")
    assert record.status == "failed"
    assert record.reason == "hook xgrad_devices returned ['CPU'], not a list of DeviceSpec"


def test_broken_plugins_do_not_break_info(info_json: InfoJson) -> None:
    broken = ["xgrad_broken_import", "xgrad_broken_hook", "xgrad_wrong_api", "xgrad_garbage", "no_such_module"]
    info = info_json(XGRAD_PLUGINS=",".join(broken))
    for name in broken:
        plugin = _plugin(info, name)
        assert plugin["status"] == "failed" and plugin["reason"], name
    assert _plugin(info, "fake")["status"] == "loaded"


def test_disable_autoload_env_loads_no_entry_point(info_json: InfoJson) -> None:
    info = info_json(XGRAD_DISABLE_PLUGIN_AUTOLOAD="1")
    assert [p["name"] for p in info["plugins"]] == ["builtin"]


def test_disable_autoload_env_still_loads_explicit_plugins(info_json: InfoJson) -> None:
    info = info_json(XGRAD_DISABLE_PLUGIN_AUTOLOAD="1", XGRAD_PLUGINS="xgrad_fake_backend")
    assert [p["name"] for p in info["plugins"]] == ["builtin", "xgrad_fake_backend"]
    fake = _plugin(info, "xgrad_fake_backend")
    assert (fake["source"], fake["status"]) == ("XGRAD_PLUGINS", "loaded")
    assert [d["name"] for d in fake["devices"]] == ["FAKE"]


def test_plugins_env_naming_an_entry_point_module_loads_it_once(info_json: InfoJson) -> None:
    info = info_json(XGRAD_PLUGINS="xgrad_fake_backend")
    assert [p["name"] for p in info["plugins"] if "fake" in p["name"]] == ["fake"]


@pytest.mark.parametrize("blocked", ["fake", "xgrad-fake-backend", "xgrad_fake_backend", "XGRAD_Fake.Backend", "FAKE"])
def test_block_plugins_env_blocks_by_name_distribution_or_module(info_json: InfoJson, blocked: str) -> None:
    info = info_json(XGRAD_BLOCK_PLUGINS=f"nv,{blocked}")
    fake = _plugin(info, "fake")
    assert (fake["status"], fake["reason"], fake["devices"]) == ("blocked", "named in XGRAD_BLOCK_PLUGINS", [])
    assert _plugin(info, "nv")["status"] == "blocked"
    assert _plugin(info, "cpu")["status"] == "loaded"


def test_block_plugins_env_blocks_explicit_plugin(info_json: InfoJson) -> None:
    info = info_json(XGRAD_PLUGINS="xgrad_broken_import", XGRAD_BLOCK_PLUGINS="xgrad_broken_import")
    assert _plugin(info, "xgrad_broken_import")["status"] == "blocked"
