"""xgrad-core without codegen or any backend: file work on the DISK device still runs (issue 22): safe_load,
safe_load_metadata, torch_load, a file as a tensor, and reading what they give to numpy.

The child process sees only core's sources, numpy and pluggy (`python -S`: no site-packages, so no installed
backend, no entry point and no editable install), exactly what `pip install xgrad-core` gives."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pluggy
import torch
from safetensors.numpy import save_file

import xgrad

CORE_SRC = pathlib.Path(xgrad.__file__).parent.parent

CHILD = """
import json, sys
import numpy as np
from xgrad import Tensor, Device
from xgrad.nn.state import safe_load, safe_load_metadata, torch_load
import importlib.util
assert importlib.util.find_spec("xgrad_codegen") is None and importlib.util.find_spec("xgrad_cpu") is None
fn = sys.argv[1]
tensors = safe_load(fn)
out = {name: [str(t.device), str(t.dtype), t.numpy().tolist()] for name, t in tensors.items()}
out["a.reshape"] = tensors["a"].reshape(3, 2).numpy().tolist()
_, data_start, header = safe_load_metadata(fn)
out["metadata"] = header["__metadata__"]
raw = Tensor(__import__("pathlib").Path(fn))
out["raw"] = [str(raw.dtype), raw.shape[0], bytes(raw.numpy()[data_start:data_start + 4]).hex()]
out["torch"] = {name: t.numpy().tolist() for name, t in torch_load(sys.argv[2]).items()}
out["devices"] = Device.get_available_devices()
print(json.dumps(out))
"""


def _core_only_path(tmp_path: pathlib.Path) -> str:
    """A PYTHONPATH of core's sources and a folder holding only numpy (with its libraries) and pluggy."""
    deps = tmp_path / "deps"
    deps.mkdir()
    for module in (np, pluggy):
        package = pathlib.Path(module.__file__ or "").parent
        for entry in package.parent.iterdir():
            if entry.name == package.name or entry.name == f"{package.name}.libs":
                (deps / entry.name).symlink_to(entry)
    return os.pathsep.join([str(CORE_SRC), str(deps)])


def test_disk_work_runs_with_core_alone(tmp_path: pathlib.Path) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3) * 1.5
    b = np.array([-(2**40), 0, 7], dtype=np.int64)
    c = np.array([[True, False]], dtype=np.bool_)
    fn = tmp_path / "w.safetensors"
    save_file({"a": a, "b": b, "c": c}, str(fn), metadata={"format": "np"})
    torch_file = tmp_path / "w.pt"
    torch.save({"w": torch.from_numpy(a), "n": torch.from_numpy(b)}, torch_file)
    env = {k: v for k, v in os.environ.items() if k not in xgrad.helpers.KNOBS and k != "PYTHONPATH"}
    env["PYTHONPATH"] = _core_only_path(tmp_path)
    done = subprocess.run(
        [sys.executable, "-S", "-c", CHILD, str(fn), str(torch_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = json.loads(done.stdout)
    assert {name: out[name][0] for name in "abc"} == dict.fromkeys("abc", f"DISK:{fn.resolve()}")
    assert out["a"][2] == a.tolist() and out["b"][2] == b.tolist() and out["c"][2] == c.tolist()
    assert out["a.reshape"] == a.reshape(3, 2).tolist()
    assert out["metadata"] == {"format": "np"}
    data_start = 8 + int.from_bytes(fn.read_bytes()[:8], "little")
    assert out["raw"][1:] == [fn.stat().st_size, fn.read_bytes()[data_start : data_start + 4].hex()]
    assert out["torch"] == {"w": a.tolist(), "n": b.tolist()}
    assert out["devices"] == ["DISK", "NULL"]  # no runnable device: nothing else was found


def test_core_alone_still_refuses_compute_with_the_install_hint(tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in xgrad.helpers.KNOBS and k != "PYTHONPATH"}
    env["PYTHONPATH"] = _core_only_path(tmp_path)
    code = "from xgrad import Tensor\nTensor([1, 2]).numpy()"
    done = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "DeviceError: no runnable backend is installed" in done.stderr
    assert "pip install packages/core packages/codegen packages/backend-cpu" in done.stderr


def test_core_only_path_hides_the_backends(tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = _core_only_path(tmp_path)
    code = "import importlib.metadata as m; print(len(list(m.entry_points(group='xgrad.backends'))))"
    done = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "0", done.stderr
