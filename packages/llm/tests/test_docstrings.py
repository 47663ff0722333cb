"""The `>>>` examples in xgrad_llm's docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["xgrad_llm.gguf", "xgrad_llm.quants"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), verbose=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"no examples found in {name}"
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
