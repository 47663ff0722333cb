from __future__ import annotations

import pytest

from xgrad_webgpu import plugin


def test_plugin_offers_webgpu_device_and_renderers() -> None:
    (device,) = plugin.xgrad_devices()
    assert device.name == "WEBGPU"
    assert [r.name for r in plugin.xgrad_renderers()] == "WGSL".split(",")
    assert plugin.xgrad_api_version() == 1


def test_stub_is_unavailable_and_refuses_to_open() -> None:
    (device,) = plugin.xgrad_devices()
    assert device.available() == (False, "WEBGPU backend not built yet")
    with pytest.raises(NotImplementedError, match="not built yet"):
        device.factory("WEBGPU")
