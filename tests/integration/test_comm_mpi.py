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
