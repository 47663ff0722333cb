from __future__ import annotations

import subprocess
import sys

import pytest

from xgrad_webgpu import plugin


def test_plugin_offers_webgpu_device_and_wgsl_renderer() -> None:
    (device,) = plugin.xgrad_devices()
    assert device.name == "WEBGPU"
    assert device.priority < 10  # below CPU: WebGPU is the default only where the CPU backend is unavailable
    (renderer,) = plugin.xgrad_renderers()
    assert renderer.name == "WGSL" and renderer.available() == (True, "")
    assert plugin.xgrad_api_version() == 1


def test_without_wgpu_the_reason_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "module_exists", lambda name: name != "wgpu")
    ok, why = plugin.webgpu_available()
    assert not ok and "pip install wgpu" in why


def test_without_adapter_the_reason_names_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "module_exists", lambda name: True)
    monkeypatch.setattr(plugin, "probe_adapter", lambda: None)
    ok, why = plugin.webgpu_available()
    assert not ok and "mesa-vulkan-drivers" in why


def test_availability_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(plugin, "module_exists", lambda name: True)
    monkeypatch.setattr(plugin, "probe_adapter", broken)
    assert plugin.webgpu_available() == (False, "wgpu failed to look for an adapter: RuntimeError: driver exploded")


def test_availability_does_not_load_the_driver_here() -> None:
    """The adapter is looked for in a child process (a loaded Vulkan driver can break later native libraries)."""
    code = "import sys; from xgrad_webgpu import plugin; plugin.webgpu_available(); print('wgpu' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False"
