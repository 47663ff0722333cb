from __future__ import annotations

from types import ModuleType

from xgrad import Context
from xgrad.plugin import reset_registry
from xgrad.testing import device_params


def test_device_params_cover_available_runnable_devices(test_devices: ModuleType) -> None:
    params = device_params()
    assert [p.id for p in params] == ["TESTHIGH", "TESTLOW", "TESTBROKEN"]
    assert [p.values for p in params] == [("TESTHIGH",), ("TESTLOW",), ("TESTBROKEN",)]


def test_device_params_without_devices_is_one_skip_saying_why() -> None:
    with Context(XGRAD_DISABLE_PLUGIN_AUTOLOAD=1, XGRAD_PLUGINS=""):
        reset_registry()
        try:
            (param,) = device_params()
        finally:
            reset_registry()
    assert param.id == "no-device"
    (mark,) = param.marks
    assert mark.name == "skip"
    assert "no runnable backend is installed" in mark.kwargs["reason"]


def test_device_params_selected_names_skip_unavailable(test_devices: ModuleType) -> None:
    low, off = device_params("testlow:0,TESTOFF")
    assert (low.id, low.marks) == ("TESTLOW", ())
    assert off.id == "TESTOFF"
    assert "TESTOFF is off on purpose" in off.marks[0].kwargs["reason"]


def test_xgrad_device_fixture_gives_a_canonical_name(xgrad_device: str) -> None:
    from xgrad import Device

    assert Device.canonicalize(xgrad_device) == xgrad_device
