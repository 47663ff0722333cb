from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from xgrad.helpers import KNOBS, Context
from xgrad.plugin import reset_registry

BROKEN_PLUGINS_DIR = pathlib.Path(__file__).parent / "fixtures" / "plugins"


@pytest.fixture
def plugins_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """tests/fixtures/plugins on sys.path, default plugin knobs, and a fresh registry before and after."""
    monkeypatch.syspath_prepend(str(BROKEN_PLUGINS_DIR))
    with Context(XGRAD_PLUGINS="", XGRAD_DISABLE_PLUGIN_AUTOLOAD=0, XGRAD_BLOCK_PLUGINS="", DEV=""):
        reset_registry()
        yield
    reset_registry()


@pytest.fixture
def info_json() -> Callable[..., dict[str, Any]]:
    """`python -m xgrad info --json` in a subprocess with no xgrad knob set except the keyword arguments;
    tests/fixtures/plugins is on PYTHONPATH."""

    def run(**env: str) -> dict[str, Any]:
        full_env = {k: v for k, v in os.environ.items() if k not in KNOBS}
        full_env["PYTHONPATH"] = os.pathsep.join([str(BROKEN_PLUGINS_DIR), os.environ.get("PYTHONPATH", "")])
        full_env.update(env)
        cmd = [sys.executable, "-m", "xgrad", "info", "--json"]
        result = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        info: dict[str, Any] = json.loads(result.stdout)
        return info

    return run
