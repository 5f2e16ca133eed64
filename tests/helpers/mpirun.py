"""Running a worker script under a bare ``mpirun`` (no accord or other launcher variables)."""
from __future__ import annotations

import shutil
import subprocess
import sys

from accord import config

# Launchers' variables that would make bootstrap pick another path than MPI's.
_FOREIGN = ("ACCORD_", "HOROVOD_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "SLURM_", "PMI_", "TORCHELASTIC_")


def mpi_ready() -> bool:
    """True when both mpirun and mpi4py are installed."""
    if shutil.which("mpirun") is None:
        return False
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def run_under_mpirun(script: str, nprocs: int, *args: str, timeout: float = 100,
                     **env: str) -> subprocess.CompletedProcess[str]:
    """``mpirun -np N python script args`` with this environment minus other launchers'
    variables, plus ``env`` (OMP_NUM_THREADS=1 unless given)."""
    clean = {k: v for k, v in config.snapshot().items() if not k.startswith(_FOREIGN)}
    clean["OMP_NUM_THREADS"] = "1"
    clean.update(env)
    return subprocess.run(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(nprocs), sys.executable,
         script, *args], env=clean, capture_output=True, text=True, timeout=timeout)
