from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest

from xgrad import Context, Device
from xgrad.buffer import Allocator, RuntimeDevice, protocol_members, runtime_device_problems
from xgrad.errors import DeviceError, PluginError
from xgrad.plugin import (
    PLUGIN_API_VERSION,
    DeviceSpec,
    LazyFactory,
    NeedsModule,
    PluginRecord,
    Registry,
    Unavailable,
    XgradHookSpecs,
    get_registry,
    module_exists,
    normalize_name,
    reset_registry,
    xgrad_api_version,
)

PLUGINS_DIR = pathlib.Path(__file__).parent / "plugins"


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


# ---- the rules of issue 22: open-time validation, name clashes, the default's fallback, names in the knobs ----
@contextlib.contextmanager
def registry_of(plugins: str, autoload: int = 1, **knobs: str) -> Iterator[Registry]:
    """A fresh registry with tests/plugins on sys.path, XGRAD_PLUGINS=`plugins`, DEV unset and `knobs`."""
    sys.path.insert(0, str(PLUGINS_DIR))
    settings = {"XGRAD_BLOCK_PLUGINS": "", "XGRAD_PLUGIN_OVERRIDE": "", **knobs}
    try:
        with Context(XGRAD_PLUGINS=plugins, XGRAD_DISABLE_PLUGIN_AUTOLOAD=1 - autoload, DEV="", **settings):
            reset_registry()
            yield get_registry()
    finally:
        sys.path.remove(str(PLUGINS_DIR))
        reset_registry()


def _rec(registry: Registry, name: str) -> PluginRecord:
    return next(r for r in registry.plugins if r.name == name)


@pytest.mark.parametrize(
    ("device", "problem"),
    [
        (
            "BADNONE",
            "gave None for BADNONE, not a device that runs kernels (xgrad.buffer.RuntimeDevice): it returned None",
        ),
        ("BADHALF:1", "no method synchronize(); no attribute 'allocator'"),
        ("BADNORUN", "gave None for BADNORUN, not a device: it returned None"),
    ],
)
def test_factory_result_that_is_not_a_device_raises_plugin_error_naming_the_plugin(device: str, problem: str) -> None:
    with registry_of("xgrad_bad_devices", autoload=0):
        with pytest.raises(PluginError) as e:
            Device[device]
    message = str(e.value)
    assert message.startswith(f"plugin xgrad_bad_devices: the factory of device {device.split(':')[0]}")
    assert problem in message
    assert "XGRAD_BLOCK_PLUGINS=xgrad_bad_devices" in message


def test_renderer_factory_returning_none_raises_plugin_error_naming_the_plugin() -> None:
    with registry_of("xgrad_bad_devices", autoload=0):
        with pytest.raises(PluginError, match="plugin xgrad_bad_devices: the factory of renderer BADR returned None"):
            Device.renderer("BADR")


def test_factory_result_meeting_the_contract_opens() -> None:
    with registry_of("xgrad_test_devices,xgrad_bad_devices", autoload=0):
        assert Device["HALFNORUN"].name == "HALFNORUN"  # runs no kernels: a name is enough
        device = Device["TESTLOW"]
        assert runtime_device_problems(device) == []
        assert {"alloc", "free", "copyin", "copyout", "offset"} == set(protocol_members(Allocator))
        assert {"name", "allocator", "compile", "synchronize"} == set(protocol_members(RuntimeDevice))


def test_bundled_cpu_device_meets_the_runtime_device_protocol() -> None:
    if not get_registry().device_available("CPU")[0]:
        pytest.skip("no CPU backend here")
    assert runtime_device_problems(Device["CPU"]) == []


def test_default_skips_devices_that_fail_to_open_with_one_warning_each(capsys: pytest.CaptureFixture[str]) -> None:
    with registry_of("xgrad_test_devices,xgrad_bad_devices", autoload=0):
        capsys.readouterr()
        assert Device.DEFAULT == "TESTHIGH"  # BADNONE (30), BADHALF (20) and BADRAISE (10) outrank it
        first = capsys.readouterr().err
        reset_registry()
        assert Device.DEFAULT == "TESTHIGH"
        again = capsys.readouterr().err
    lines = [line for line in first.splitlines() if "failed to open" in line]
    assert [line.split()[2] for line in lines] == ["BADNONE", "BADHALF", "BADRAISE"]
    for line in lines:
        assert "plugin xgrad_bad_devices" in line and "XGRAD_BLOCK_PLUGINS=xgrad_bad_devices" in line
    assert "BADRAISE: driver missing on purpose" in lines[2]
    assert "failed to open" not in again  # once per process, not per registry


def test_default_is_none_when_every_device_fails_to_open_and_says_which() -> None:
    with registry_of("xgrad_bad_devices", autoload=0):
        with pytest.raises(DeviceError, match="devices that failed to open: BADNONE: .*BADHALF: .*BADRAISE: "):
            _ = Device.DEFAULT


def test_bundled_plugins_win_name_clashes_unless_overridden() -> None:
    with registry_of("xgrad_clash_devices") as registry:
        if "CPU" not in registry.devices:
            pytest.skip("the CPU backend is not installed")
        clash = _rec(registry, "xgrad_clash_devices")
        assert registry.devices["CPU"][1].name == "cpu"
        assert registry.devices["NULL"][1].name == "builtin"
        assert registry.renderers["C"][1].name == "cpu"
        assert clash.devices == ["TESTLOW"] and clash.renderers == []
        assert (
            "device CPU ignored: plugin cpu (xgrad-backend-cpu) has it (bundled with xgrad); "
            "set XGRAD_PLUGIN_OVERRIDE=xgrad_clash_devices to use this one"
        ) in clash.problems
        assert not hasattr(Device["CPU"], "plugin")
    for spelling in ("xgrad_clash_devices", "XGRAD-Clash.Devices"):
        with registry_of("xgrad_clash_devices", XGRAD_PLUGIN_OVERRIDE=spelling) as registry:
            clash = _rec(registry, "xgrad_clash_devices")
            assert clash.devices == ["CPU", "NULL", "TESTLOW"] and clash.renderers == ["C"]
            assert Device["CPU"].plugin == "xgrad_clash_devices"
            assert Device.renderer("C").plugin == "xgrad_clash_devices"
            cpu = _rec(registry, "cpu")
            assert "CPU" not in cpu.devices
            assert "device CPU given to plugin xgrad_clash_devices, named in XGRAD_PLUGIN_OVERRIDE" in cpu.problems


def test_name_clash_between_third_party_plugins_goes_to_the_first_loaded_whatever_the_order_of_hooks() -> None:
    for plugins, winner in [
        ("xgrad_test_devices,xgrad_clash_devices", "xgrad_test_devices"),
        ("xgrad_clash_devices,xgrad_test_devices", "xgrad_clash_devices"),
    ]:
        for _ in range(2):  # the same knobs give the same registry every time
            with registry_of(plugins, autoload=0) as registry:
                assert registry.devices["TESTLOW"][1].name == winner
                loser = _rec(
                    registry, "xgrad_clash_devices" if winner == "xgrad_test_devices" else "xgrad_test_devices"
                )
                assert f"device TESTLOW ignored: plugin {winner} has it (loaded first)" in loser.problems


@pytest.mark.parametrize(
    "spelling", ["xgrad_test_devices", "xgrad-test-devices", "Xgrad.Test_Devices", "XGRAD__TEST--DEVICES"]
)
def test_block_plugins_compares_names_as_pep_503_normalises_them(spelling: str) -> None:
    with registry_of("xgrad_test_devices", autoload=0, XGRAD_BLOCK_PLUGINS=f"nothing, {spelling}") as registry:
        record = _rec(registry, "xgrad_test_devices")
        assert (record.status, record.reason) == ("blocked", "named in XGRAD_BLOCK_PLUGINS")
        assert "TESTLOW" not in registry.devices


def test_normalize_name_follows_pep_503() -> None:
    assert normalize_name("Xgrad_Fake.Backend") == "xgrad-fake-backend"
    assert normalize_name("a-_.b") == "a-b"
    assert normalize_name("xgrad-cpu") != normalize_name("xgradcpu")


def test_plugin_import_lets_keyboard_interrupt_through() -> None:
    with pytest.raises(KeyboardInterrupt):
        with registry_of("xgrad_interrupt_import", autoload=0):
            pass


def test_plugin_import_calling_sys_exit_is_recorded_failed() -> None:
    with registry_of("xgrad_exit_import,xgrad_test_devices", autoload=0) as registry:
        record = _rec(registry, "xgrad_exit_import")
        assert (record.status, record.reason) == (
            "failed",
            "import failed: SystemExit: xgrad_exit_import exits on purpose",
        )
        assert _rec(registry, "xgrad_test_devices").status == "loaded"


FALLBACK_CODE = (
    "from xgrad import Device, Tensor\n"
    "print(Device.DEFAULT)\n"
    "print((Tensor([1, 2]) + 1).tolist())\n"
    "print(Device.DEFAULT)\n"
)


@pytest.mark.parametrize("broken", ["bad CC", "no compiler"])
def test_default_falling_back_from_cpu_warns_once_with_the_info_reason(
    run_xgrad: Callable[..., subprocess.CompletedProcess[str]], tmp_path: pathlib.Path, broken: str
) -> None:
    if not get_registry().device_available("CPU")[0]:
        pytest.skip("no CPU backend here")
    # webgpu blocked: where wgpu finds an adapter it would be the fallback instead of PYTHON (it warns the same way);
    # nv and amd too: the warning names every unavailable device ranked above the fallback, and here only CPU's reason
    # is under test
    env = {"XGRAD_BLOCK_PLUGINS": "webgpu,nv,amd"}
    env.update({"CC": "/nonexistent/cc"} if broken == "bad CC" else {"PATH": str(tmp_path)})  # an empty PATH
    done = run_xgrad(code=FALLBACK_CODE, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["PYTHON", "[2, 3]", "PYTHON"]
    info = json.loads(run_xgrad("info", "--json", **env).stdout)
    cpu = next(d for p in info["plugins"] for d in p["devices"] if d["name"] == "CPU")
    assert not cpu["available"] and cpu["reason"]
    assert done.stderr.splitlines() == [
        f"xgrad: the default device is PYTHON, a fallback, because CPU: {cpu['reason']}. Fix that (`xgrad info` lists "
        "every device) or set DEV=PYTHON to choose it and silence this warning"
    ]


def test_default_chosen_with_dev_or_with_a_working_compiler_does_not_warn(
    run_xgrad: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    done = run_xgrad(code=FALLBACK_CODE, CC="/nonexistent/cc", DEV="PYTHON")
    assert (done.returncode, done.stderr) == (0, "")
    if get_registry().device_available("CPU")[0]:
        done = run_xgrad(code=FALLBACK_CODE)
        assert (done.returncode, done.stdout.split()[0], done.stderr) == (0, "CPU", "")
