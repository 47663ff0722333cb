"""The device type, its module, the version check and the fallback knob."""

from __future__ import annotations

import warnings

import pytest
import torch

import xgrad_torch
from xgrad import Context
from xgrad.errors import XgradError
from xgrad_torch.ops import UnsupportedOpError
from xgrad_torch.registration import TorchVersionError, check_torch


def test_import_registers_the_xgrad_device_and_its_module() -> None:
    assert torch._C._get_privateuse1_backend_name() == "xgrad"
    t = torch.ones(2).to("xgrad:0")
    assert t.device == torch.device("xgrad", 0) and t.is_xgrad
    assert torch.ones(2).xgrad().is_xgrad
    assert torch.xgrad.is_available() and torch.xgrad.device_count() == 1 and torch.xgrad.current_device() == 0
    torch.xgrad.synchronize()
    assert next(torch.nn.Linear(2, 2).xgrad().parameters()).device.type == "xgrad"


def test_backward_runs_on_the_callers_thread() -> None:
    assert not torch._C._is_multithreading_enabled()


def test_old_torch_is_refused_with_the_fix() -> None:
    for old in ("2.9.1", "1.13.0+cpu"):
        with pytest.raises(TorchVersionError, match=r"torch>=2\.10") as err:
            check_torch(old)
        assert isinstance(err.value, XgradError)
    check_torch("2.10.0")
    check_torch(torch.__version__)


def test_unregistered_op_falls_back_to_cpu_with_one_warning_naming_it() -> None:
    x = torch.tensor([3.0, 1.0, 2.0, 1.0]).to("xgrad")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = torch.kthvalue(x, 2)
        second = torch.kthvalue(x * 2, 2)
    names = [str(w.message) for w in caught if "aten::kthvalue" in str(w.message)]
    assert len(names) <= 1 and (names or "aten::kthvalue" in xgrad_torch.ops._warned)
    assert first.values.device.type == "xgrad" and first.values.item() == 1.0 and second.values.item() == 2.0


def test_strict_knob_raises_naming_the_op() -> None:
    x = torch.tensor([3.0, 1.0]).to("xgrad")
    with Context(XGRAD_TORCH_STRICT=1), pytest.raises(UnsupportedOpError, match="aten::kthvalue"):
        torch.kthvalue(x, 1)
