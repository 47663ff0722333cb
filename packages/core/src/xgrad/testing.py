"""pytest plugin for backend conformance tests (loaded by pytest through the `pytest11` entry point `xgrad`).

A test that takes the fixture `xgrad_device` runs once per available device that runs kernels, with the canonical
device name as its value and as its test id:

    def test_add(xgrad_device):
        assert (Tensor([1]) + 1).to(xgrad_device).tolist() == [2]

Third-party backends reuse the suite the same way. `pytest --xgrad-devices=CPU,FAKE` picks devices explicitly
(also ones that run no kernels). With no runnable device the tests are skipped, saying why.
This module is imported by pytest only; `import xgrad` does not import it. Being a pytest plugin, it is loaded by every
pytest run in an environment that has xgrad: it reaches `Tensor` through the package root (`xgrad.Tensor`, imported on
first access), so the engine loads only when a test probes a dtype.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import xgrad
from xgrad.device import Device, no_default_reason
from xgrad.errors import DeviceError, DTypeError
from xgrad.plugin import get_registry


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--xgrad-devices",
        default="",
        help="comma list of xgrad devices for the xgrad_device fixture (default: every available runnable device)",
    )


def device_params(selected: str = "") -> list[Any]:
    """The parameters of `xgrad_device`: one per device, or one skipped parameter saying why there is none."""
    if selected:
        names = [Device.canonicalize(n) for n in selected.split(",") if n.strip()]
        return [_param_for(name) for name in names]
    names = Device.get_available_devices(runs_kernels_only=True)
    if not names:
        return [pytest.param(None, id="no-device", marks=pytest.mark.skip(reason=no_default_reason(get_registry())))]
    return [pytest.param(name, id=name) for name in names]


def _param_for(name: str) -> Any:
    available, reason = get_registry().device_available(Device.parse(name).type)
    if available:
        return pytest.param(name, id=name)
    return pytest.param(name, id=name, marks=pytest.mark.skip(reason=f"device {name} is not available: {reason}"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "xgrad_device" in metafunc.fixturenames:
        try:
            params = device_params(str(metafunc.config.getoption("--xgrad-devices")))
        except DeviceError as e:
            raise pytest.UsageError(str(e)) from e
        metafunc.parametrize("xgrad_device", params, indirect=True)


@pytest.fixture
def xgrad_device(request: pytest.FixtureRequest) -> str:
    """The canonical name of the device under test (see the module docstring)."""
    return str(request.param)


_dtype_support: dict[tuple[str, str], str | None] = {}


def unsupported_reason(device: str, dtype: Any) -> str | None:
    """Why `device` cannot hold or compute `dtype` (the device's own DTypeError message), or None if it can.
    Found by running one tiny kernel, once per (device, dtype)."""
    key = (device, dtype.name)
    if key not in _dtype_support:
        try:
            xgrad.Tensor([0, 1], device=device, dtype=dtype).contiguous().realize()
            _dtype_support[key] = None
        except DTypeError as e:
            _dtype_support[key] = str(e)
    return _dtype_support[key]


def skip_unsupported(device: str, *dtypes: Any) -> None:
    """In a conformance test: skip, with the device's reason, when it cannot do one of `dtypes`."""
    for dt in dtypes:
        if (reason := unsupported_reason(device, dt)) is not None:
            pytest.skip(f"{dt.name} on {device}: {reason}")


# ---- fuzzing: one setting for every package's hypothesis fuzzers ----
def fuzz_long_run() -> bool:
    """Whether XGRAD_FUZZ_EXAMPLES asks for a long, random fuzzing run (the documented command) instead of CI's."""

    return "XGRAD_FUZZ_EXAMPLES" in os.environ


def fuzz_settings(ci_examples: int) -> Any:
    """hypothesis settings for a fuzz test: `ci_examples` derandomized examples (CI, reproducible), or with
    XGRAD_FUZZ_EXAMPLES=N set, N random ones. No deadline, no example database, no health checks: a fuzz example
    may be slow, and a failure is reported with its minimal example, not replayed from a database."""

    import hypothesis

    return hypothesis.settings(
        max_examples=int(os.environ.get("XGRAD_FUZZ_EXAMPLES", str(ci_examples))),
        deadline=None,
        derandomize=not fuzz_long_run(),
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
