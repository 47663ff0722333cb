from __future__ import annotations

import pytest

from xgrad_nv import plugin


def test_plugin_offers_nv_device_and_renderers() -> None:
    (device,) = plugin.xgrad_devices()
    assert device.name == "NV"
    assert [r.name for r in plugin.xgrad_renderers()] == "CUDA,PTX".split(",")
    assert plugin.xgrad_api_version() == 1


def test_stub_is_unavailable_and_refuses_to_open() -> None:
    (device,) = plugin.xgrad_devices()
    assert device.available() == (False, "NV device not built yet")
    with pytest.raises(NotImplementedError, match="not built yet"):
        device.factory("NV")
