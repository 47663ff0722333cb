from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from xgrad.helpers import Context
from xgrad_nv import compiler, plugin


def test_plugin_offers_nv_device_and_renderers() -> None:
    (device,) = plugin.xgrad_devices()
    assert device.name == "NV"
    assert [r.name for r in plugin.xgrad_renderers()] == ["CUDA", "PTX"]
    assert plugin.xgrad_api_version() == 1


def test_cuda_renderer_is_available_for_compile_only_work() -> None:
    cuda = plugin.xgrad_renderers()[0]
    assert cuda.available() == (True, "")
    assert cuda.factory("sm_80").arch == "sm_80"


def test_without_libcuda_nv_is_unavailable_naming_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver(name: str = "libcuda.so.1") -> ctypes.CDLL:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr("xgrad_nv.driver.load_libcuda", no_driver)
    with Context(MOCKGPU=0):
        ok, why = plugin.nv_available()
    assert not ok
    assert "libcuda.so.1" in why and "580" in why and "MOCKGPU=1" in why


def test_nvrtc_missing_is_named_with_the_wheel_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "find_nvrtc", lambda: None)
    ok, why = compiler.nvrtc_status()
    assert not ok and "nvidia-cuda-nvrtc==13.0" in why


def test_old_driver_is_named_with_the_ptx_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver for CUDA 12.4 cannot load NVRTC 13.0's PTX: NV says so instead of failing at the first launch."""

    class OldDriver:
        def __init__(self, lib: object) -> None:
            pass

        def device_count(self) -> int:
            return 1

        def driver_version(self) -> int:
            return 12040

        def device_name(self, i: int) -> str:
            return "old GPU"

    monkeypatch.setattr("xgrad_nv.driver.load_libcuda", lambda name="libcuda.so.1": object())
    monkeypatch.setattr("xgrad_nv.driver.CUDADriver", OldDriver)
    with Context(MOCKGPU=0):
        ok, why = plugin.nv_available()
    if compiler.load_nvrtc() is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc==13.0.*)")
    assert not ok and "CUDA 12.4" in why and "NVRTC 13.0" in why and "update the driver" in why


def test_no_gpu_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoGPU:
        def __init__(self, lib: object) -> None:
            pass

        def device_count(self) -> int:
            return 0

        def driver_version(self) -> int:
            return 13000

    monkeypatch.setattr("xgrad_nv.driver.load_libcuda", lambda name="libcuda.so.1": object())
    monkeypatch.setattr("xgrad_nv.driver.CUDADriver", NoGPU)
    with Context(MOCKGPU=0):
        assert plugin.nv_available() == (
            False,
            "no NVIDIA GPU visible to the driver (check nvidia-smi and CUDA_VISIBLE_DEVICES)",
        )


def test_availability_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str = "libcuda.so.1") -> ctypes.CDLL:
        raise RuntimeError("boom")

    monkeypatch.setattr("xgrad_nv.driver.load_libcuda", broken)
    with Context(MOCKGPU=0):
        ok, why = plugin.nv_available()
    assert not ok and "RuntimeError: boom" in why


def test_mock_gpu_is_available() -> None:
    with Context(MOCKGPU=1):
        ok, why = plugin.nv_available()
    assert ok and "MOCKGPU=1" in why


def nv_entry(mock: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "xgrad", "info", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MOCKGPU": mock},
    ).stdout
    (nv,) = [p for p in json.loads(out)["plugins"] if p["name"] == "nv"]
    (device,) = nv["devices"]
    assert isinstance(device, dict)
    return device


def test_xgrad_info_says_why_nv_is_unavailable() -> None:
    """`xgrad info` in a fresh process shows the same verdict as the check here (no GPU here or in CI: the reason)."""
    device = nv_entry("0")
    with Context(MOCKGPU=0):
        ok, why = plugin.nv_available()
    assert (device["available"], device["reason"]) == (ok, "" if ok else why)
    if not ok:
        assert "install" in why or "check" in why or "update" in why


def test_xgrad_info_shows_the_mock_gpu_available() -> None:
    device = nv_entry("1")
    assert device["available"] is True
