"""The `>>>` examples in docstrings run and print what they say (on the default device)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import xgrad.mixin
from xgrad.dtype import dtypes
from xgrad.tensor import Tensor

MODULES = [
    "xgrad.tensor",
    "xgrad.engine.jit",
    "xgrad.engine.function",
    "xgrad.gradient",
    "xgrad.helpers",
    "xgrad.device",
    *(f"xgrad.mixin.{m.name}" for m in pkgutil.iter_modules(xgrad.mixin.__path__)),
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(
        module,
        extraglobs={"Tensor": Tensor, "dtypes": dtypes},
        verbose=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
