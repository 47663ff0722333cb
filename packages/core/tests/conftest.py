from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest

from xgrad.helpers import KNOBS, Context
from xgrad.plugin import reset_registry

PLUGINS_DIR = pathlib.Path(__file__).parent / "plugins"
# shared helper modules of these tests (torch_compare.py): --import-mode=importlib leaves this directory off sys.path
if str(pathlib.Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(pathlib.Path(__file__).parent))


@pytest.fixture
def test_devices(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """A registry holding only the builtin plugin and plugins/xgrad_test_devices.py (entry points off)."""
    monkeypatch.syspath_prepend(str(PLUGINS_DIR))
    import xgrad_test_devices

    xgrad_test_devices.OPENED.clear()
    with Context(XGRAD_PLUGINS="xgrad_test_devices", XGRAD_DISABLE_PLUGIN_AUTOLOAD=1, XGRAD_BLOCK_PLUGINS="", DEV=""):
        reset_registry()
        yield xgrad_test_devices
    reset_registry()


@pytest.fixture
def run_xgrad() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `python -m xgrad <args>` (or `python -c <code>`) in a subprocess whose environment has no xgrad knob set
    except the keyword arguments: `run_xgrad("info", "--json", DEBUG="2")`."""

    def run(*args: str, code: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if k not in KNOBS}
        full_env.update(env)
        cmd = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "xgrad", *args]
        return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=120)

    return run
