from __future__ import annotations

import pytest

from xgrad_webgpu.plugin import webgpu_available


@pytest.fixture(scope="session")
def webgpu() -> str:
    """The WEBGPU device name, or a skip saying why it is unavailable here."""
    ok, why = webgpu_available()
    if not ok:
        pytest.skip(f"WEBGPU is not available: {why}")
    return "WEBGPU"
