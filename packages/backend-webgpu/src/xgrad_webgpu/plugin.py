"""Plugin hooks of the WEBGPU backend: device "WEBGPU" and renderer "WGSL". Modules are imported only when first used.

Priority 5, below the CPU backend's 10: WebGPU is picked only with `DEV=WEBGPU` (or `device="WEBGPU"`) where a C
compiler exists, because on machines without a GPU the adapter is usually Mesa's lavapipe, a CPU Vulkan driver that
is much slower than the C backend. Where the CPU backend is unavailable WebGPU becomes the default.
"""

from __future__ import annotations

import subprocess
import sys

from xgrad.plugin import DeviceSpec, LazyFactory, NeedsModule, RendererSpec, hookimpl, module_exists
from xgrad.plugin import xgrad_api_version as xgrad_api_version

DEVICE_MODULE = "xgrad_webgpu.device"
RENDERER_MODULE = "xgrad_webgpu.renderer"
NO_WGPU = "the wgpu package is not installed: pip install wgpu (or the backend's extra: xgrad-backend-webgpu[wgpu])"
NO_ADAPTER = "no WebGPU adapter: install a Vulkan driver (without a GPU: apt-get install mesa-vulkan-drivers)"


# Run in a child process: loading a Vulkan driver is not free of side effects. lavapipe brings its own LLVM, and a
# native library loaded after it can break (z3 aborts with std::bad_variant_access once lavapipe was loaded first),
# so asking "is there an adapter?" must not load the driver into the asking process; only opening the device does.
PROBE = (
    "import wgpu\n"
    "a = wgpu.gpu.request_adapter_sync(power_preference='high-performance')\n"
    "print('XGRAD-ADAPTER', a.info['device'] if a else '')\n"
)
PROBE_TIMEOUT_S = 120


def probe_adapter() -> str | None:
    """The name of the adapter WebGPU would use, found in a child process; None if there is none."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    lines = [line for line in done.stdout.splitlines() if line.startswith("XGRAD-ADAPTER")]
    if done.returncode != 0 or not lines:
        log = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise RuntimeError(log)
    name = lines[-1].removeprefix("XGRAD-ADAPTER").strip()
    return name or None


def webgpu_available() -> tuple[bool, str]:
    """Never raises. Looks for an adapter in a child process (about a second on lavapipe); opens no device."""
    if not module_exists("wgpu"):
        return False, NO_WGPU
    try:
        adapter = probe_adapter()
    except Exception as e:  # a broken wgpu-native install, a driver that crashes on enumeration, a hang, ...
        return False, f"wgpu failed to look for an adapter: {type(e).__name__}: {e}"
    if adapter is None:
        return False, NO_ADAPTER
    return True, ""


renderer_available = NeedsModule(RENDERER_MODULE, f"WGSL renderer missing (module {RENDERER_MODULE})")
_open_webgpu = LazyFactory(DEVICE_MODULE, "WebGPUDevice")
_make_renderer = LazyFactory(RENDERER_MODULE, "WGSLRenderer")


@hookimpl
def xgrad_devices() -> list[DeviceSpec]:
    return [
        DeviceSpec(
            "WEBGPU",
            _open_webgpu,
            priority=5,
            available=webgpu_available,
            description="WGSL kernels on wgpu (Vulkan/Metal/D3D12; lavapipe without a GPU)",
        )
    ]


@hookimpl
def xgrad_renderers() -> list[RendererSpec]:
    return [
        RendererSpec(
            "WGSL",
            _make_renderer,
            available=renderer_available,
            default_arch="shader-f16",
            description="WGSL compute shaders; arch: comma-separated WebGPU features (shader-f16 enables float16)",
        )
    ]
