"""xgrad.distributed across real processes: each test launches a helper script of distributed_scripts/ with mpirun
(Open MPI in CI) and checks what it prints. The scripts compare against numpy and a single-process run themselves and
raise (a non-zero exit) on a mismatch; several checks share a launch, as mpirun costs about a second to start."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

SCRIPTS = pathlib.Path(__file__).parent / "distributed_scripts"
MPIRUN = shutil.which("mpirun")


def _missing() -> str | None:
    if MPIRUN is None:
        return "mpirun is not installed (Debian: apt install openmpi-bin)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def launcher_flags() -> list[str]:
    """Open MPI refuses root without --allow-run-as-root, and more ranks than cores without --oversubscribe."""
    out = subprocess.run([str(MPIRUN), "--version"], capture_output=True, text=True).stdout
    if "Open MPI" not in out and "OpenRTE" not in out:
        return []
    return (["--allow-run-as-root"] if os.geteuid() == 0 else []) + ["--oversubscribe"]


def mpirun(
    n: int,
    script: str,
    *args: str,
    flags: tuple[str, ...] = (),
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    cmd = [str(MPIRUN), *launcher_flags(), *flags, "-n", str(n), sys.executable, str(SCRIPTS / script), *args]
    run_env = {**os.environ, "NUM_CPU_THREADS": "1", **(env or {})}  # ranks share the cores
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=run_env)


def oks(proc: subprocess.CompletedProcess[str], n: int) -> dict[int, str]:
    """Each rank's "OK rank=<r> <value>" (the ranks' lines may interleave on mpirun's stdout)."""
    assert proc.returncode == 0, f"mpirun exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    found = {int(r): v for r, v in re.findall(r"OK rank=(\d+) ([0-9.e+-]+)", proc.stdout)}
    assert sorted(found) == list(range(n)), proc.stdout
    return found


@pytest.mark.parametrize("ranks", [2, 4])
def test_each_collective_matches_numpy_over_dtypes_and_shapes(ranks: int) -> None:
    checks = oks(mpirun(ranks, "check_collectives.py"), ranks)
    assert all(int(v) > 300 for v in checks.values())  # the number of checks each rank made


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_data_parallel_digits_cnn_equals_one_process_on_the_whole_batch(mode: str, tmp_path: pathlib.Path) -> None:
    pytest.importorskip("sklearn", reason="the digits data set ships with scikit-learn")
    args = (mode, str(tmp_path)) if mode == "eager" else (mode,)  # the checkpoint round trip once
    worst = oks(mpirun(2, "check_training.py", *args), 2)
    assert float(worst[0]) <= 1e-5  # rank 0's largest difference to the single process (asserted there too)
    if mode == "eager":
        assert (tmp_path / "dp.safetensors").stat().st_size > 0
