from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType

from xgrad import Context
from xgrad.info import collect_info, format_info

RunXgrad = Callable[..., subprocess.CompletedProcess[str]]


def test_info_lists_plugins_devices_and_default(test_devices: ModuleType) -> None:
    text = format_info(collect_info())
    assert "xgrad_test_devices [no distribution, XGRAD_PLUGINS, module xgrad_test_devices]: loaded" in text
    assert "TESTOFF" in text and "unavailable: TESTOFF is off on purpose" in text
    assert "renderer TESTR" in text
    assert "default device: TESTHIGH" in text


def test_info_shows_changed_knobs(test_devices: ModuleType) -> None:
    with Context(BEAM=4):
        info = collect_info()
    assert info["changed_knobs"]["BEAM"] == 4
    assert "BEAM=4" in format_info(info)


def test_info_with_only_core_says_no_runnable_backend_installed(run_xgrad: RunXgrad) -> None:
    result = run_xgrad("info", XGRAD_DISABLE_PLUGIN_AUTOLOAD="1")
    assert result.returncode == 0, result.stderr
    assert "default device: none: no runnable backend is installed" in result.stdout
    assert "pip install packages/core packages/codegen packages/backend-cpu" in result.stdout


def test_info_json_is_one_object_with_every_plugin(run_xgrad: RunXgrad) -> None:
    result = run_xgrad("info", "--json", DEBUG="2", XGRAD_DISABLE_PLUGIN_AUTOLOAD="1")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["plugin_api_version"] == 1
    assert info["changed_knobs"] == {"DEBUG": 2, "XGRAD_DISABLE_PLUGIN_AUTOLOAD": 1}
    assert info["default_device"] is None
    assert "no runnable backend is installed" in info["default_device_error"]
    (builtin,) = info["plugins"]
    assert (builtin["name"], builtin["distribution"], builtin["status"]) == ("builtin", "xgrad-core", "loaded")
    assert {d["name"] for d in builtin["devices"]} == {"NULL", "DISK"}


def test_info_without_subcommand_runs_info(run_xgrad: RunXgrad) -> None:
    result = run_xgrad(XGRAD_DISABLE_PLUGIN_AUTOLOAD="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("xgrad 0.1.0")


def test_console_script_runs_info_json() -> None:
    script = pathlib.Path(sys.executable).parent / "xgrad"
    result = subprocess.run([str(script), "info", "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "builtin" in {p["name"] for p in json.loads(result.stdout)["plugins"]}
