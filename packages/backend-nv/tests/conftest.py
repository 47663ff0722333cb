"""The NV tests' shared helper modules (nv_ops.py, nv_cubin_check.py: --import-mode=importlib leaves this directory off
sys.path) and the `mockgpu` fixture."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator

import pytest

from xgrad.helpers import Context
from xgrad.plugin import reset_registry

if str(pathlib.Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))


@pytest.fixture
def mockgpu() -> Iterator[None]:
    """MOCKGPU=1 (DEV unset) on a registry built for it, and a fresh registry afterwards: availability is checked
    once per registry, so neither a check made before (NV unavailable) nor this one (NV available, so the default
    device) may leak into other tests."""
    with Context(MOCKGPU=1, DEV=""):
        reset_registry()
        yield
    reset_registry()
