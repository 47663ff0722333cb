"""scripts/gpu-check (bench/nv_check.py), the script prepared for a lent GPU, runs end to end here on the mock GPU
(MOCKGPU=1, a 32^3 matmul) from the sources, as it will there: every step, the JSON it writes, its exit status."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_gpu_check_runs_end_to_end_on_the_mock(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "nv_check.json"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("MOCKGPU", None)
    cmd = ["bash", "scripts/gpu-check", "--mock", "--size", "32", "--beam-steps", "1", "--json", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["verdict"] == "ok" and results["environment"]["nv_available"]
    for device in ("NV:CUDA", "NV:PTX"):
        conf = results["conformance"][device]
        assert conf["passed"] == conf["total"] >= 30 and not conf["failures"]
    for dtype in ("float16", "bfloat16"):
        row = results["matmul"][dtype]
        assert row["n"] == 32 and row["heuristic"]["ok"] and row["beam"]["ok"]
        assert row["heuristic"]["max_rel_err"] < 2e-2
        # the opts each kernel used: the heuristic's start with tensor cores; BEAM's are its own pick, which on the mock
        # (timed by the PTX interpreter's wall time) may be any candidate, the unoptimized kernel's empty list included
        assert row["heuristic"]["opts"][0].startswith("TC(") and row["beam"]["picked_by_beam"]
        assert isinstance(row["beam"]["opts"], list)
    # every tile shape of the bf16 matmul (and the untiled tensor cores) built, ran and matched the heuristic's output
    assert len(results["tiles"]) >= 6 and "TC(1,0)" in results["tiles"]
    assert all(t["ok"] for t in results["tiles"].values())
    assert "== done: all correct" in res.stdout
