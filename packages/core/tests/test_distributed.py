"""xgrad.distributed across real processes: each test launches a helper script of distributed_scripts/ with mpirun
(Open MPI in CI) and checks what it prints. The scripts compare against numpy and a single-process run themselves and
raise (a non-zero exit) on a mismatch; several checks share a launch, as mpirun costs about a second to start."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time

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


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_data_parallel_overlapped_buckets_equal_the_buckets_reduced_after_backward(mode: str) -> None:
    worst = oks(mpirun(2, "check_overlap.py", mode), 2)
    assert float(worst[0]) <= 1e-6  # asserted there too, per weight


@pytest.mark.parametrize("step", ["all_reduce", "overlap"])
def test_a_rank_that_dies_mid_step_is_named_by_the_others_within_the_timeout(step: str, tmp_path: pathlib.Path) -> None:
    if not launcher_flags():
        pytest.skip("the launcher is not Open MPI: the test keeps survivors alive with an Open MPI option")
    # by default mpirun kills the whole job when a rank exits non-zero; this option lets the survivors report
    proc = mpirun(
        3,
        "check_fault.py",
        step,
        str(tmp_path),
        flags=("--mca", "orte_abort_on_non_zero_status", "0"),
        env={"DIST_TIMEOUT": "3"},
        timeout=120,
    )
    found = {int(r): float(v) for r, v in re.findall(r"OK rank=(\d+) ([0-9.]+)", proc.stdout)}
    assert sorted(found) == [0, 2], proc.stdout + proc.stderr[-3000:]
    assert all(3 <= waited < 15 for waited in found.values()), found  # the timeout, then the watchdog's grace
    # the messages come in files: on mpirun's stdout another rank's output can land inside a line (CI saw it once)
    messages = sorted(p.name for p in tmp_path.glob("message.*"))
    assert messages == ["message.0", "message.2"], messages
    for name in messages:
        text = (tmp_path / name).read_text()
        assert "rank 1 did not answer" in text and "within 3 s" in text, text


# ---- two "hosts": network namespaces joined by a veth pair, mpirun reaching the second through an rsh agent ----
AGENT = """#!/bin/sh
# mpirun's rsh agent: "ssh" to host $1 = run the command in that address's network namespace, under its own hostname
host="$1"; shift
case "$host" in
  10.231.0.1) ns={a}; name=xghost0 ;;
  10.231.0.2) ns={b}; name=xghost1 ;;
  *) echo "no host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $name; $*"
"""


def _sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture
def two_hosts(tmp_path: pathlib.Path) -> pathlib.Path:
    """Two network namespaces on a veth pair (10.231.0.1 and .2); yields the rsh agent. Skips where they cannot be
    made (not root, no iproute2, a container without the capability)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("iproute2 (ip) and util-linux (unshare) are needed to make network namespaces")
    tag = f"{os.getpid() % 100000}"
    a, b = f"xgA{tag}", f"xgB{tag}"
    made = _sh("ip", "netns", "add", a)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {made.stderr.strip()}")
    try:
        steps = [
            ("ip", "netns", "add", b),
            ("ip", "link", "add", f"xv{tag}a", "type", "veth", "peer", "name", f"xv{tag}b"),
            ("ip", "link", "set", f"xv{tag}a", "netns", a),
            ("ip", "link", "set", f"xv{tag}b", "netns", b),
            ("ip", "-n", a, "addr", "add", "10.231.0.1/24", "dev", f"xv{tag}a"),
            ("ip", "-n", b, "addr", "add", "10.231.0.2/24", "dev", f"xv{tag}b"),
            ("ip", "-n", a, "link", "set", f"xv{tag}a", "up"),
            ("ip", "-n", b, "link", "set", f"xv{tag}b", "up"),
            ("ip", "-n", a, "link", "set", "lo", "up"),
            ("ip", "-n", b, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _sh(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot wire the network namespaces ({' '.join(step)}): {done.stderr.strip()}")
        agent = tmp_path / "agent.sh"
        agent.write_text(AGENT.format(a=a, b=b))
        agent.chmod(0o755)
        (tmp_path / "hosts").write_text("10.231.0.1 slots=1\n10.231.0.2 slots=1\n")
        yield agent
    finally:
        _sh("ip", "netns", "del", a)  # the veth pair goes with its namespaces
        _sh("ip", "netns", "del", b)


def test_training_across_two_hosts_in_network_namespaces(two_hosts: pathlib.Path, tmp_path: pathlib.Path) -> None:
    pytest.importorskip("sklearn", reason="the digits data set ships with scikit-learn")
    if not launcher_flags():
        pytest.skip("the launcher is not Open MPI: the hostfile and rsh-agent options are Open MPI's")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    mpirun_cmd = [
        str(MPIRUN),
        *launcher_flags(),
        "--hostfile",
        str(tmp_path / "hosts"),
        "-n",
        "2",
        "--mca",
        "plm_rsh_agent",
        str(two_hosts),
        "--mca",
        "btl",
        "tcp,self",  # over the veth pair: no shared memory between the "hosts"
        "--mca",
        "btl_tcp_if_include",
        "10.231.0.0/24",
        "--mca",
        "oob_tcp_if_include",
        "10.231.0.0/24",
        "-x",
        "NUM_CPU_THREADS=1",
        sys.executable,
        "-c",
        "import socket; print('HOST', socket.gethostname(), flush=True); import runpy, sys; "
        f"sys.argv = ['check_training.py', 'eager', {str(ckpt)!r}]; "
        f"runpy.run_path({str(SCRIPTS / 'check_training.py')!r}, run_name='__main__')",
    ]
    script = "hostname xghost0; exec " + shlex.join(mpirun_cmd)
    name_a = two_hosts.read_text().split("ns=")[1].split(";")[0]
    start = time.perf_counter()
    proc = subprocess.run(
        ["ip", "netns", "exec", name_a, "unshare", "--uts", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
    )
    worst = oks(proc, 2)
    assert float(worst[0]) <= 1e-5
    # each rank prints "HOST <its hostname>"; mpirun may interleave the two ranks' lines ("HOSTHOST xghost0\nxghost1")
    assert sorted(set(re.findall(r"xghost\d", proc.stdout))) == ["xghost0", "xghost1"], proc.stdout
    assert time.perf_counter() - start < 300


def test_data_parallel_with_every_optimizer_equals_one_process() -> None:
    worst = oks(mpirun(2, "check_optimizers.py"), 2)
    assert float(worst[0]) <= 1e-5
