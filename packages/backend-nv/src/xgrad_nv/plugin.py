"""Plugin hooks of the NV backend: device "NV" (NV:0 .. NV:n; NV:PTX / NV:CUDA pick the renderer), renderers CUDA and
PTX for compile-only work (DEV=NULL:CUDA:sm_90). `nv_available` says exactly why NV cannot run here, never raising."""

from __future__ import annotations

from xgrad.plugin import DeviceSpec, LazyFactory, NeedsModule, RendererSpec, hookimpl
from xgrad.plugin import xgrad_api_version as xgrad_api_version

ARCHS = "sm_80, sm_89, sm_90, sm_120"
NVRTC_FIX = "pip install 'nvidia-cuda-nvrtc==13.0.*' (or install a CUDA toolkit with nvcc)"
DRIVER_FIX = "install the NVIDIA driver (580 or newer: CUDA 13.0)"


def _mock_status() -> tuple[bool, str]:
    from xgrad_nv.compiler import find_tool, nvrtc_status

    ok, nvrtc = nvrtc_status()
    if not ok and find_tool("nvcc") is None:
        return True, f"mock GPU (MOCKGPU=1, PTX interpreter): only DEV=NV:PTX runs, CUDA C needs NVRTC: {NVRTC_FIX}"
    return True, f"mock GPU (MOCKGPU=1, PTX interpreter); {nvrtc if ok else 'nvcc'} builds CUDA C"


def _driver_status() -> tuple[bool, str]:
    from xgrad_nv.compiler import find_tool, load_nvrtc, nvrtc_status
    from xgrad_nv.driver import CUDADriver, CUDADriverError, load_libcuda

    try:
        lib = load_libcuda()
    except OSError as e:
        return False, f"libcuda.so.1 not found ({e}): {DRIVER_FIX}; or MOCKGPU=1 for the PTX interpreter"
    except AttributeError as e:
        return False, f"libcuda.so.1 lacks a function the backend needs ({e}): {DRIVER_FIX}"
    try:
        drv = CUDADriver(lib)
        count = drv.device_count()
        version = drv.driver_version()
    except CUDADriverError as e:
        return False, f"the CUDA driver does not start: {e}"
    if count == 0:
        return False, "no NVIDIA GPU visible to the driver (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
    ok, nvrtc_text = nvrtc_status()
    if not ok and find_tool("nvcc") is None:
        return False, f"{count} GPU(s), but NVRTC is missing: {NVRTC_FIX}"
    if (nvrtc := load_nvrtc()) is not None:
        need = nvrtc.version[0] * 1000 + nvrtc.version[1] * 10
        if version < need:
            have = f"{version // 1000}.{version % 1000 // 10}"
            return False, (
                f"the driver supports CUDA {have}, older than NVRTC {nvrtc.version_text}'s PTX ISA: "
                f"update the driver ({DRIVER_FIX}) or install an NVRTC of CUDA {have}"
            )
    names = ", ".join(drv.device_name(i) for i in range(count))
    return True, f"{count} GPU(s): {names}; CUDA {version // 1000}.{version % 1000 // 10}; {nvrtc_text}"


def nv_available() -> tuple[bool, str]:
    """(True, what runs) or (False, why NV is unavailable and what to install); never raises."""
    try:
        from xgrad.helpers import MOCKGPU

        return _mock_status() if MOCKGPU.value else _driver_status()
    except Exception as e:  # a broken install must show up in `xgrad info`, never break it
        return False, f"NV backend failed its availability check: {type(e).__name__}: {e}"


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [
        DeviceSpec(
            "NV",
            LazyFactory("xgrad_nv.device", "NVDevice"),
            priority=40,
            available=nv_available,
            description="NVIDIA GPUs through the CUDA driver (MOCKGPU=1: a PTX interpreter); NV:PTX: PTX renderer",
        )
    ]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [
        RendererSpec(
            "CUDA",
            LazyFactory("xgrad_nv.renderer", "CUDARenderer"),
            available=NeedsModule("xgrad_nv.renderer", "xgrad_nv.renderer is missing: reinstall xgrad-backend-nv"),
            default_arch="sm_90",
            description=f"CUDA C for NVRTC/nvcc; arch: {ARCHS}",
        ),
        RendererSpec(
            "PTX",
            LazyFactory("xgrad_nv.ptx", "PTXRenderer"),
            available=NeedsModule("xgrad_nv.ptx", "the PTX renderer (xgrad_nv.ptx) is not built yet"),
            default_arch="sm_90",
            description=f"PTX text for ptxas or the driver's JIT; arch: {ARCHS}",
        ),
    ]
