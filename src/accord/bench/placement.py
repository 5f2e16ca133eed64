"""Where the benchmark's ranks come from: an outside launcher, or workers we start ourselves.

Under accordrun, torchrun, mpirun or SLURM (detected from the environment, as ``hvd.init()``
does) this process is one rank of that job; otherwise the benchmark spawns its own workers
(:mod:`accord.bench.launch`). Torch-free, and below the option parsing that depends on it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from accord import config
from accord.runtime import environments


@dataclass(frozen=True)
class Placement:
    """How the benchmark's ranks are started."""

    external: bool  # True: an outside launcher started this process as one rank
    source: str  # "accord", "torchrun", "openmpi", ..., or "single"
    rank: int  # this process's rank (0 when we spawn the workers)
    size: int  # ranks in the job (``--nproc-per-node`` when we spawn them)
    local_size: int
    is_mpi: bool


def placement(nproc_per_node: int) -> Placement:
    """Detect an outside launcher; without one, plan ``nproc_per_node`` spawned workers."""
    env = environments.detect(config.snapshot())
    if env.source != "single":
        local = env.local_size if env.local_size is not None else env.size
        return Placement(True, env.source, env.rank, env.size, local, env.is_mpi)
    return Placement(False, "spawn", 0, nproc_per_node, nproc_per_node, False)


def default_threads(local_size: int) -> int:
    """Intra-op threads per rank so that the ranks on this host share its cores."""
    return max(1, (os.cpu_count() or 1) // max(1, local_size))
