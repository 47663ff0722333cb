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
    # its buffer is freed and counted off (the collection may also free garbage earlier tests left in cycles)
    assert GlobalCounters.mem_used <= used - 256 * 4 * 4


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


# ---- the dtype module ----
def test_dtypes_dict_names_every_dtype_and_alias() -> None:
    from xgrad.dtype import DTYPES_DICT

    assert DTYPES_DICT["float"] is dtypes.float32 and DTYPES_DICT["half"] is dtypes.float16
    assert DTYPES_DICT["uchar"] is dtypes.uint8 and DTYPES_DICT["bfloat16"] is dtypes.bfloat16
    assert set(DTYPES_DICT.values()) == set(dtypes.all)
    assert not {"void", "index", "weakint", "weakfloat"} & set(DTYPES_DICT)


def test_invalid_is_a_picklable_singleton() -> None:
    import pickle

    from xgrad.dtype import Invalid, InvalidType

    assert InvalidType() is Invalid and repr(Invalid) == "Invalid"
    assert pickle.loads(pickle.dumps(Invalid)) is Invalid
    assert pickle.loads(pickle.dumps([Invalid, (Invalid,)]))[1][0] is Invalid


def test_strong_dtype_makes_weak_dtypes_concrete() -> None:
    from xgrad.dtype import strong_dtype

    assert strong_dtype(dtypes.weakint) is dtypes.default_int
    assert strong_dtype(dtypes.weakfloat) is dtypes.default_float
    assert strong_dtype(dtypes.uint8) is dtypes.uint8
    with Context(DEFAULT_FLOAT="half"):
        assert strong_dtype(dtypes.weakfloat) is dtypes.float16


def test_scalar_converters_match_numpy_and_ml_dtypes() -> None:
    from xgrad.dtype import float_to_bf16, float_to_fp8, float_to_fp16, fp8_to_float

    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.normal(0, 100, 200), [0.0, -0.0, 1e-8, 65504.0, 65520.0, 1e6, np.inf, -np.inf]])
    with np.errstate(over="ignore"):
        want16 = xs.astype(np.float16)
    for x, w in zip(xs, want16, strict=True):
        assert float_to_fp16(float(x)) == float(w)
        # bfloat16 keeps float32's exponent: round the float32 bits to the top 16, ties to even
        bits = np.array([x], dtype=np.float32).view(np.uint32)[0]
        rounded = (int(bits) + 0x7FFF + ((int(bits) >> 16) & 1)) >> 16 << 16
        assert float_to_bf16(float(np.float32(x))) == float(np.array([rounded], dtype=np.uint32).view(np.float32)[0])
    assert np.isnan(float_to_bf16(float("nan"))) and np.isnan(float_to_fp16(float("nan")))
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for d, ml in [(dtypes.fp8e4m3, ml_dtypes.float8_e4m3fn), (dtypes.fp8e5m2, ml_dtypes.float8_e5m2)]:
        for b in range(256):
            want = float(np.array([b], dtype=np.uint8).view(ml)[0])
            got = fp8_to_float(b, d)
            assert got == want or (np.isnan(got) and np.isnan(want))
        for x in rng.normal(0, 10, 100):
            assert float_to_fp8(float(x), d) == int(np.array([x], dtype=ml).view(np.uint8)[0])


def test_truncate_indexes_like_tinygrads_table() -> None:
    from xgrad.dtype import truncate

    assert truncate[dtypes.int8](200) == -56 == truncate(dtypes.int8)(200)
    assert truncate[dtypes.float16](1.0001) == 1.0


def test_can_lossless_cast_matches_numpy_safe_casts_but_64_bit_ints_to_double() -> None:
    from xgrad.dtype import can_lossless_cast, to_np_dtype

    std = [d for d in dtypes.all if d.fmt is not None]
    for a in std:
        for b in std:
            want = bool(np.can_cast(to_np_dtype(a), to_np_dtype(b), "safe"))
            if a in (dtypes.int64, dtypes.uint64) and b == dtypes.float64:
                want = False  # tinygrad's table: a double holds 53 bits
            assert can_lossless_cast(a, b) == want, (a, b)
    assert can_lossless_cast(dtypes.fp8e4m3, dtypes.half) and can_lossless_cast(dtypes.bfloat16, dtypes.float)
    assert not can_lossless_cast(dtypes.half, dtypes.bfloat16) and not can_lossless_cast(dtypes.bfloat16, dtypes.half)
    assert can_lossless_cast(dtypes.bool, dtypes.fp8e5m2)


def test_str_of_a_dtype_is_tinygrads_spelling() -> None:
    assert str(dtypes.float32) == "dtypes.float" and str(dtypes.float16) == "dtypes.half"
    assert str(dtypes.float64) == "dtypes.double" and str(dtypes.int32) == "dtypes.int"
    assert str(dtypes.uint8) == "dtypes.uchar" and str(dtypes.int64) == "dtypes.long"
    assert str(dtypes.bfloat16) == "dtypes.bfloat16" and str(dtypes.bool) == "dtypes.bool"
    assert repr(dtypes.float32) == "dtypes.float32"


@pytest.mark.parametrize(
    ("method", "dtype"),
    [
        ("short", dtypes.int16),
        ("long", dtypes.int64),
        ("int", dtypes.int32),
        ("half", dtypes.float16),
        ("float", dtypes.float32),
        ("double", dtypes.float64),
        ("bfloat16", dtypes.bfloat16),
        ("bool", dtypes.bool),
    ],
)
def test_cast_shorthands(method: str, dtype: object) -> None:
    x = np.array([-3.7, 0.0, 2.5, 1000.25], dtype=np.float32)
    out = getattr(Tensor(x), method)()
    assert out.dtype == dtype
    if dtype != dtypes.bfloat16:
        np.testing.assert_array_equal(out.numpy(), x.astype(out.numpy().dtype))


def test_weak_float_promotion() -> None:
    assert (Tensor([1, 2]) * 1.5).dtype == dtypes.default_float  # int tensor * Python float -> default float
    assert (Tensor([1.0], dtype=dtypes.half) * 1.5).dtype == dtypes.half  # the float tensor's dtype wins
    assert (Tensor([True]) + 1.5).dtype == dtypes.default_float
    assert (Tensor([1], dtype=dtypes.uint8) + 300).dtype == dtypes.uint8  # Python ints are weak too
    assert (Tensor([1], dtype=dtypes.int8) * 2.0).dtype == dtypes.default_float
    with Context(DEFAULT_FLOAT="half"):
        assert (Tensor([1, 2]) / 2).dtype == dtypes.half


def test_default_float_and_int_are_assignable_dtype_values() -> None:
    assert dtypes.default_float is dtypes.float32 and dtypes.default_int is dtypes.int32
    assert np.dtype(dtypes.default_float.fmt) == np.float32  # how tinygrad code makes numpy arrays
    try:
        dtypes.default_float = dtypes.float16
        dtypes.default_int = dtypes.int64
        assert Tensor([1.5]).dtype == dtypes.float16 and Tensor([1]).dtype == dtypes.int64
        assert (Tensor([1, 2]) * 0.5).dtype == dtypes.float16
    finally:
        dtypes.default_float = dtypes.float32
        dtypes.default_int = dtypes.int32
    assert Tensor([1.5]).dtype == dtypes.float32
    from xgrad.errors import DTypeError

    with pytest.raises(DTypeError, match="default_float must be a float dtype"):
        dtypes.default_float = dtypes.int8


# ---- errors: xgrad's typed errors are also the builtin types tinygrad raises ----
def test_errors_derive_from_tinygrads_builtin_types() -> None:
    from xgrad.errors import CompileError, DeviceError, DTypeError, IndexingError, JitError, ShapeError, XgradError
    from xgrad.nn.optim import OptimizerError

    for cls in (DeviceError, CompileError, JitError, OptimizerError):
        assert issubclass(cls, RuntimeError) and issubclass(cls, XgradError)
    assert issubclass(ShapeError, ValueError) and issubclass(DTypeError, TypeError)
    assert issubclass(IndexingError, IndexError)


def test_bool_and_len_of_a_tensor_raise_type_error() -> None:
    with pytest.raises(TypeError, match="truth value"):
        bool(Tensor([1, 2]))
    with pytest.raises(TypeError, match="0-d"):
        len(Tensor(3.0))


def test_unavailable_device_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError):
        Device["NO_SUCH_DEVICE_XYZ"]


def test_reshape_mismatch_raises_value_error() -> None:
    with pytest.raises(ValueError):
        Tensor.ones(2, 3).reshape(4, 2)


# ---- TinyJit ----
def test_jit_realizes_lazy_inputs() -> None:
    from xgrad import TinyJit

    f = TinyJit(lambda a, b: (a * b + 1).realize())
    rng = np.random.default_rng(1)
    for _ in range(4):
        x, y = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
        out = f(Tensor(x) + 0, (Tensor(y) * 2).exp())  # lazy inputs, as tinygrad code passes them
        np.testing.assert_allclose(out.numpy(), x * np.exp(y * 2) + 1, rtol=1e-5)
    assert f.calls == 2  # captured, and replayed


# ---- random ----
def test_uniform_with_an_int_dtype_covers_low_to_high() -> None:
    t = Tensor.uniform(4000, low=-5, high=5, dtype=dtypes.int32)
    assert t.dtype == dtypes.int32
    values, counts = np.unique(t.numpy(), return_counts=True)
    assert values.tolist() == list(range(-5, 5)) and counts.min() > 250  # every value, about equally often


def test_randint_argument_rules_raise_type_error() -> None:
    with pytest.raises(TypeError):
        Tensor.randint(3, low=0.5, high=3)
    with pytest.raises(TypeError):
        Tensor.randint(3, high=3, dtype=dtypes.float32)


def test_multinomial_of_one_weight() -> None:
    assert Tensor([2.0]).multinomial(3, replacement=True).tolist() == [0, 0, 0]
    assert Tensor([[0.5]]).multinomial(1).tolist() == [[0]]


# ---- indexing ----
def test_index_lists_mixing_slices_and_int_lists_like_numpy() -> None:
    a = np.arange(20).reshape(4, 5)
    t = Tensor(a)
    np.testing.assert_array_equal(t[:, [1, 3]].numpy(), a[:, [1, 3]])
    np.testing.assert_array_equal(t[[slice(None), [0, 3, 4]]].numpy(), a[(slice(None), [0, 3, 4])])
    np.testing.assert_array_equal(t[[1, slice(1, 4)]].numpy(), a[1, 1:4])
    np.testing.assert_array_equal(t[[0, 2]].numpy(), a[[0, 2]])  # a list of ints stays an advanced index


def test_index_errors_are_tinygrads_types() -> None:
    t = Tensor.ones(4, 5)
    with pytest.raises(ValueError, match="step cannot be zero"):
        t[::0]
    with pytest.raises(IndexError):
        t[1.5]
    with pytest.raises(IndexError):
        t["a"]


# ---- nn ----
@pytest.mark.parametrize(("kernel", "dilation"), [(3, 1), (4, 1), (3, 2), ((2, 5), 1)])
def test_conv2d_padding_same_and_valid_like_torch(kernel: int | tuple[int, int], dilation: int) -> None:
    torch = pytest.importorskip("torch")
    kh, kw = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 7, 8)).astype(np.float32)
    w = rng.standard_normal((3, 2, kh, kw)).astype(np.float32)
    for padding in ("same", "valid"):
        want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=padding, dilation=dilation)
        got = Tensor(x).conv2d(Tensor(w), padding=padding, dilation=dilation)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


def test_conv2d_padding_strings_errors() -> None:
    x, w = Tensor.ones(1, 2, 7, 7), Tensor.ones(3, 2, 3, 3)
    with pytest.raises(RuntimeError, match="stride 1"):
        x.conv2d(w, padding="same", stride=2)
    with pytest.raises(RuntimeError, match="not a padding string"):
        x.conv2d(w, padding="bogus")
    with pytest.raises(ValueError):
        x.conv2d(w, padding="bogus")
