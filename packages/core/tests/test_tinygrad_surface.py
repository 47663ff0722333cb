"""tinygrad code runs on xgrad with only the import changed: the surface outside `Tensor` methods that tinygrad
programs and test files touch (knobs and the DEV spec, helpers, device and renderer objects, the dtype module), used
the way tinygrad code uses it. Values are checked against numpy or torch where they matter."""

from __future__ import annotations

import gc
import os
import pathlib
import tempfile

import numpy as np
import pytest

from xgrad import Context, Device, GlobalCounters, Tensor, dtypes
from xgrad.errors import KnobError
from xgrad.helpers import (
    ALLREDUCE_CAST,
    CHECK_OOB,
    CI,
    DEV,
    EMULATED_DTYPES,
    IMAGE,
    KNOBS,
    OSX,
    WIN,
    disable_gc,
    getenv,
    polyN,
    temp,
)


# ---- knobs and the DEV device spec ----
def test_dev_knob_reads_interface_device_renderer_arch() -> None:
    with Context(DEV="MOCK+AMD:HIP:gfx1100"):
        assert (DEV.interface, DEV.type, DEV.renderer, DEV.arch) == ("MOCK", "AMD", "HIP", "gfx1100")
        assert DEV.device == "AMD:HIP:gfx1100"
        assert DEV.value == "MOCK+AMD:HIP:gfx1100"


def test_dev_knob_absent_parts_are_empty_strings() -> None:
    with Context(DEV="CPU"):
        assert (DEV.interface, DEV.renderer, DEV.arch) == ("", "", "")
        assert not DEV.arch.startswith("gfx")
    with Context(DEV=""):
        assert DEV.device == "" and not DEV


def test_dev_knob_keeps_colons_in_arch_and_the_index() -> None:
    with Context(DEV="NULL:HIP:gfx90a:xnack-"):
        assert (DEV.renderer, DEV.arch) == ("HIP", "gfx90a:xnack-")
    with Context(DEV="CPU:1"):
        assert DEV.targets[0].index == 1 and DEV.renderer == ""


def test_dev_knob_lists_several_targets() -> None:
    with Context(DEV="CPU;NULL:CUDA:sm_90"):
        assert [t.device for t in DEV.targets] == ["CPU", "NULL:CUDA:sm_90"]
        assert DEV.device == "CPU"


def test_dev_knob_interface_without_device_raises_knob_error() -> None:
    with Context(DEV="MOCK+"), pytest.raises(KnobError, match="no device after"):
        _ = DEV.device


def test_dev_interface_prefix_is_not_part_of_the_default_device() -> None:
    with Context(DEV="MOCK+cpu"):
        assert Device.DEFAULT == "CPU"


def test_dev_knob_is_still_a_registered_knob() -> None:
    assert KNOBS["DEV"].var is DEV
    with Context(DEV="CPU:1"):
        assert Device.DEFAULT == "CPU:1"
        assert Tensor([1.0]).device == "CPU:1"


def test_dev_knob_from_the_environment(run_xgrad: object) -> None:
    result = run_xgrad(  # type: ignore[operator]
        code="from xgrad.helpers import DEV; print(DEV.interface, DEV.type, DEV.renderer, DEV.arch)",
        DEV="MOCK+NULL:C:native",
    )
    assert result.stdout.split() == ["MOCK", "NULL", "C", "native"], result.stderr


@pytest.mark.parametrize(("knob", "value"), [(IMAGE, 0), (CHECK_OOB, 0), (EMULATED_DTYPES, ""), (ALLREDUCE_CAST, 1)])
def test_tinygrad_knobs_exist_as_documented_no_ops(knob: object, value: object) -> None:
    name = knob.key  # type: ignore[attr-defined]
    assert KNOBS[name].default == value and "no effect" in KNOBS[name].help
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    with Context(**{name: "bfloat16" if isinstance(value, str) else 1 - int(value)}):
        np.testing.assert_allclose((Tensor(a) * 2 + 1).sum(axis=1).numpy(), (a * 2 + 1).sum(axis=1))


def test_platform_constants() -> None:
    assert isinstance(OSX, bool) and isinstance(WIN, bool) and isinstance(CI, bool)
    assert OSX == (os.uname().sysname == "Darwin")
    assert getenv("XGRAD_SURELY_UNSET_VARIABLE", 7) == 7


def test_temp_names_a_path_in_the_temporary_directory() -> None:
    assert pathlib.Path(temp("model.bin")) == pathlib.Path(tempfile.gettempdir()) / "model.bin"
    assert temp("cache", append_user=True).startswith(str(pathlib.Path(tempfile.gettempdir()) / "cache."))


def test_polyn_is_horner_like_numpy_polyval() -> None:
    coeffs = [0.5, -1.25, 3.0, 2.0]
    assert polyN(1.5, coeffs) == pytest.approx(np.polyval(coeffs, 1.5))
    x = np.linspace(-2, 2, 9, dtype=np.float32)
    np.testing.assert_allclose(polyN(Tensor(x), coeffs).numpy(), np.polyval(coeffs, x), rtol=1e-6)


def test_disable_gc_as_context_and_decorator() -> None:
    assert gc.isenabled()
    with disable_gc():
        assert not gc.isenabled()
    assert gc.isenabled()

    @disable_gc()
    def inside() -> bool:
        return gc.isenabled()

    assert inside() is False and gc.isenabled()
    gc.disable()
    try:
        with disable_gc():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_global_counters_reset_kernel_count_and_mem_used() -> None:
    from xgrad.helpers import GlobalCounters as FromHelpers

    assert FromHelpers is GlobalCounters
    GlobalCounters.reset()
    assert GlobalCounters.kernel_count == 0 and GlobalCounters.global_ops == 0
    t = (Tensor.ones(256, 4).contiguous() + 1).realize()
    assert GlobalCounters.kernel_count >= 1
    assert GlobalCounters.mem_used >= 256 * 4 * 4
    assert GlobalCounters.mem_used_per_device[t.device] >= 256 * 4 * 4
    gc.collect()
    used = GlobalCounters.mem_used
    GlobalCounters.reset()
    assert GlobalCounters.mem_used == used and GlobalCounters.kernel_count == 0  # reset keeps the memory in use
    del t
    gc.collect()
    assert GlobalCounters.mem_used == used - 256 * 4 * 4  # its buffer is freed, and counted off


# ---- renderer and device objects ----
def test_renderer_supported_dtypes_is_a_method() -> None:
    supported = Device[Device.DEFAULT].renderer.supported_dtypes()
    assert dtypes.float32 in supported and dtypes.bfloat16 in supported  # bfloat16 is emulated where not native
    assert all(d in dtypes.all for d in supported)


def test_device_graph_is_none_without_device_graphs() -> None:
    assert Device[Device.DEFAULT].graph is None
    if Device.DEFAULT != "NULL":
        assert Device["NULL"].graph is None


def test_is_dtype_supported() -> None:
    from xgrad.device import is_dtype_supported

    assert is_dtype_supported(dtypes.float32) and is_dtype_supported(dtypes.int8, Device.DEFAULT)
    renderer = Device[Device.DEFAULT].renderer
    for d in dtypes.all:
        assert is_dtype_supported(d) == (d in renderer.supported_dtypes())
    with tempfile.NamedTemporaryFile() as f:
        assert is_dtype_supported(dtypes.float64, f"DISK:{f.name}")
