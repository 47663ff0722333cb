from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xgrad.helpers import KNOBS
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


def test_xgrad_info_without_rocm_names_the_library_and_the_archs(tmp_path: Path) -> None:
    """`xgrad info` in a process where no libamdhip64 can be found (an empty LD_LIBRARY_PATH and no ROCm folder on a
    machine without ROCm): the AMD device is unavailable, naming the library, the fix and every supported arch."""
    env = {k: v for k, v in os.environ.items() if k not in KNOBS}
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "xgrad", "info", "--json"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (amd,) = [p for p in json.loads(done.stdout)["plugins"] if p["name"] == "amd"]
    (device,) = amd["devices"]
    if device["available"]:
        pytest.skip("this machine has ROCm and an AMD GPU")
    assert "libamdhip64.so" in device["reason"] or "no AMD GPU" in device["reason"]
    for arch in AMD_ARCHS:
        assert arch in device["reason"] and arch in amd["renderers"][0]["description"]
    assert "gfx950 unsupported" in device["reason"]
