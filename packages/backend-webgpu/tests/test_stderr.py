"""The user's stderr stays clean of Vulkan driver noise (issue 22): Mesa prints `error: XDG_RUNTIME_DIR is invalid
or not set in the environment.` while WebGPU looks for an adapter on a headless machine."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from xgrad.helpers import KNOBS
from xgrad_webgpu.device import DRIVER_NOISE, without_driver_noise

PROGRAM = (
    "from xgrad import Tensor\n"
    "x = Tensor([[1.0, -2.0], [3.5, 4.0]], device='WEBGPU')\n"
    "print(((x * 2).relu().sum(axis=1)).tolist())\n"
)


def test_a_program_on_webgpu_writes_nothing_to_stderr_without_xdg_runtime_dir(webgpu: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in KNOBS and k != "XDG_RUNTIME_DIR"}  # as on a headless box
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    expected = np.maximum(np.array([[1.0, -2.0], [3.5, 4.0]]) * 2, 0).sum(axis=1)
    assert done.stdout.strip() == str(expected.tolist())
    assert done.stderr == ""


def test_without_driver_noise_drops_only_the_noise_lines(capfd: pytest.CaptureFixture[str]) -> None:
    (noise,) = DRIVER_NOISE
    with without_driver_noise():
        os.write(2, f"{noise}\nreal problem: keep me\n  {noise}  \n".encode())
        print("python-level line", file=sys.stderr)
    err = capfd.readouterr().err  # (pytest's capture takes Python-level writes apart from fd 2's)
    assert sorted(err.splitlines()) == ["python-level line", "real problem: keep me"]


def test_without_driver_noise_restores_stderr_when_the_body_raises(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), without_driver_noise():
        os.write(2, b"kept before the error\n")
        raise RuntimeError("boom")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "kept before the error\nafter\n"
