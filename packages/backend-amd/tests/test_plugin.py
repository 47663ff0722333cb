from __future__ import annotations

from xgrad_amd import plugin
from xgrad_amd.renderer import AMD_ARCHS, UNSUPPORTED_ARCHS, HIPRenderer


def test_plugin_offers_amd_device_and_hip_renderer() -> None:
    (device,) = plugin.xgrad_devices()
    assert device.name == "AMD"
    assert [r.name for r in plugin.xgrad_renderers()] == ["HIP"]
    assert plugin.xgrad_api_version() == 1


def test_plugin_arch_list_matches_renderer_table() -> None:
    assert plugin.SUPPORTED_ARCHS == tuple(AMD_ARCHS)
    assert "gfx950" in UNSUPPORTED_ARCHS and "gfx950" in plugin.UNSUPPORTED_NOTE


def test_hip_renderer_opens_for_every_arch() -> None:
    (spec,) = plugin.xgrad_renderers()
    assert spec.available() == (True, "")
    for arch in AMD_ARCHS:
        r = spec.factory(arch)
        assert isinstance(r, HIPRenderer) and r.arch == arch and r.tensor_cores


def test_device_availability_never_raises() -> None:
    (device,) = plugin.xgrad_devices()
    ok, why = device.available()
    assert isinstance(ok, bool) and (ok or why)
