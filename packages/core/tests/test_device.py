from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from xgrad import Context, Device
from xgrad.device import DeviceName
from xgrad.errors import DeviceError
from xgrad.helpers import DEV
from xgrad.plugin import get_registry, reset_registry


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("CPU", "CPU"),
        ("cpu", "CPU"),
        ("cpu:0", "CPU"),
        ("CPU:1", "CPU:1"),
        (" nv:2 ", "NV:2"),
        ("NULL:CUDA:sm_90", "NULL:CUDA:sm_90"),
        ("null:0:cuda:sm_90", "NULL:cuda:sm_90"),
        ("NULL:HIP:gfx90a:xnack-", "NULL:HIP:gfx90a:xnack-"),
        ("NULL:1:PTX", "NULL:1:PTX"),
        ("python::sm_90", "PYTHON::sm_90"),  # no renderer named: the device's own, for that arch
        ("disk:/tmp/Some File:0", "DISK:/tmp/Some File:0"),
    ],
)
def test_canonicalize_normalises_type_and_index(name: str, canonical: str) -> None:
    assert Device.canonicalize(name) == canonical


@pytest.mark.parametrize("name", ["", "   ", ":1", "CPU:-1", "NULL::", "CPU:1::"])
def test_canonicalize_rejects_malformed_name(name: str) -> None:
    with pytest.raises(DeviceError):
        Device.canonicalize(name)


def test_parse_splits_renderer_and_arch() -> None:
    assert Device.parse("null:cuda:sm_90") == DeviceName("NULL", 0, "cuda", "sm_90")
    assert Device.parse("CPU:3") == DeviceName("CPU", 3)
    assert Device.parse("DISK:/a/b") == DeviceName("DISK", path="/a/b")


def test_default_follows_dev_knob_inside_context() -> None:
    with Context(DEV="cpu:0"):
        assert Device.DEFAULT == "CPU"
        with Context(DEV="null:CUDA:sm_90"):
            assert Device.DEFAULT == "NULL:CUDA:sm_90"
        assert Device.DEFAULT == "CPU"


def test_default_picks_highest_priority_runnable_device(test_devices: ModuleType) -> None:
    # TESTOFF (50) is unavailable, TESTNORUN (99) runs no kernels, TESTRAISES (98) has a raising check
    assert Device.DEFAULT == "TESTHIGH"


def test_default_is_found_again_in_a_rebuilt_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """DEFAULT is remembered per registry: a registry with other plugins answers anew."""
    with Context(DEV=""):
        installed = Device.DEFAULT
        monkeypatch.syspath_prepend(str(Path(__file__).parent / "plugins"))
        with Context(XGRAD_PLUGINS="xgrad_test_devices", XGRAD_DISABLE_PLUGIN_AUTOLOAD=1, XGRAD_BLOCK_PLUGINS=""):
            reset_registry()
            assert Device.DEFAULT == "TESTHIGH"
        reset_registry()
        assert Device.DEFAULT == installed


def test_default_setter_sets_dev_knob(test_devices: ModuleType) -> None:
    with Context(DEV=""):
        Device.DEFAULT = "testlow:0"
        assert DEV.value == "TESTLOW"
        assert Device.DEFAULT == "TESTLOW"
    assert Device.DEFAULT == "TESTHIGH"


def test_default_without_runnable_backend_says_how_to_install_one() -> None:
    with Context(XGRAD_DISABLE_PLUGIN_AUTOLOAD=1, XGRAD_PLUGINS="", DEV=""):
        reset_registry()
        try:
            with pytest.raises(DeviceError, match="no runnable backend is installed") as e:
                _ = Device.DEFAULT
            assert "pip install packages/core packages/codegen packages/backend-cpu" in str(e.value)
        finally:
            reset_registry()


def test_getitem_opens_lazily_once_per_canonical_name(test_devices: ModuleType) -> None:
    get_registry()
    assert test_devices.OPENED == []
    dev = Device["testlow"]
    assert dev is Device["TESTLOW:0"]
    assert dev.name == "TESTLOW"
    assert Device["TESTLOW:1"] is not dev
    assert test_devices.OPENED == ["TESTLOW", "TESTLOW:1"]


def test_getitem_name_cache_is_dropped_when_the_registry_is_rebuilt(test_devices: ModuleType) -> None:
    """Device[name] remembers each name as given (the launch hot path); a rebuilt registry opens devices anew."""
    first = Device["testlow"]
    assert Device["testlow"] is first  # the remembered name
    reset_registry()
    second = Device["testlow"]
    assert second is not first and Device["testlow"] is second
    assert test_devices.OPENED == ["TESTLOW", "TESTLOW"]


def test_getitem_unknown_device_lists_availability(test_devices: ModuleType) -> None:
    with pytest.raises(DeviceError) as e:
        Device["NOPE"]
    msg = str(e.value)
    assert "no installed plugin offers a device named NOPE" in msg
    assert "TESTHIGH (plugin xgrad_test_devices): available" in msg
    assert "TESTOFF (plugin xgrad_test_devices): unavailable: TESTOFF is off on purpose" in msg


def test_getitem_unavailable_device_says_why(test_devices: ModuleType) -> None:
    with pytest.raises(DeviceError, match="device TESTOFF:2 is not available: TESTOFF is off on purpose"):
        Device["testoff:2"]


def test_getitem_failing_factory_raises_device_error(test_devices: ModuleType) -> None:
    with pytest.raises(DeviceError, match="opening device TESTBROKEN .* refuses to open on purpose"):
        Device["TESTBROKEN"]


def test_availability_check_that_raises_counts_as_unavailable(test_devices: ModuleType) -> None:
    available, reason = get_registry().device_available("TESTRAISES")
    assert not available
    assert reason == "availability check raised OSError: availability check broken on purpose"


def test_get_available_devices_orders_by_priority(test_devices: ModuleType) -> None:
    tests_only = [n for n in Device.get_available_devices() if n.startswith("TEST")]
    assert tests_only == ["TESTNORUN", "TESTHIGH", "TESTLOW", "TESTBROKEN"]
    assert Device.get_available_devices(runs_kernels_only=True) == ["TESTHIGH", "TESTLOW", "TESTBROKEN"]


def test_renderer_uses_default_arch_when_none_given(test_devices: ModuleType) -> None:
    assert Device.renderer("TESTR").arch == "t1"
    assert Device.renderer("testr", "t2").arch == "t2"


def test_renderer_unknown_name_lists_renderers(test_devices: ModuleType) -> None:
    with pytest.raises(DeviceError, match="renderers: TESTR"):
        Device.renderer("NOPE")


def test_device_cache_is_dropped_when_registry_is_rebuilt(test_devices: ModuleType) -> None:
    first = Device["TESTLOW"]
    reset_registry()
    assert Device["TESTLOW"] is not first


def test_import_xgrad_loads_no_plugin_and_opens_no_device(
    run_xgrad: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    code = (
        "import sys, xgrad; print(sorted(m for m in sys.modules if m.startswith(('pluggy', 'xgrad.plugin', 'xgrad_'))))"
    )
    result = run_xgrad(code=code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_null_with_an_arch_but_no_renderer_is_refused() -> None:
    with pytest.raises(DeviceError, match="NULL:CUDA:sm_90"):
        Device["NULL::sm_90"]
