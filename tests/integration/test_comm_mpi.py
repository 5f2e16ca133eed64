"""The mpi backend under a real mpirun, on 2 and 3 ranks (skipped without mpirun or mpi4py)."""
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

MPIRUN = shutil.which("mpirun")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_comm_checks.py")

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(MPIRUN is None, reason="mpirun not found"),
    pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed"),
]


def _mpirun(nprocs: int, timeout: float) -> tuple[int, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(nprocs), sys.executable, SCRIPT],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpirun and every rank it started
        out, _ = proc.communicate()
        pytest.fail(f"mpirun -np {nprocs} timed out after {timeout}s:\n{out[-4000:]}")
    return proc.returncode, out


@pytest.mark.timeout(110)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_mpi_collectives(nprocs):
    code, out = _mpirun(nprocs, timeout=100)
    summaries = re.findall(r"rank (\d+): (\d+) checks, (\d+) failures", out)
    assert code == 0, out[-6000:]
    assert sorted(int(r) for r, _, _ in summaries) == list(range(nprocs)), out[-3000:]
    assert all(int(f) == 0 and int(n) > 250 for _, n, f in summaries), out[-3000:]


def _init_mpi_backend_without_mpirun(rank, size):
    from accord.engine import session

    try:
        session.init()
    except Exception as exc:  # noqa: BLE001 - the test inspects what was raised
        return type(exc).__name__, str(exc)
    session.shutdown()
    return "no error", ""


@pytest.mark.timeout(60)
def test_mpi_backend_outside_mpirun_says_how_to_start():
    from helpers.ranks import run_ranks

    out = run_ranks(_init_mpi_backend_without_mpirun, 2, init="accord", timeout=45,
                    env={"ACCORD_CPU_BACKEND": "mpi"})
    for kind, message in out:
        assert kind == "BackendError", (kind, message)
        assert "MPI_COMM_WORLD, which has 1 rank(s)" in message and "HINT: start the job with mpirun" in message
