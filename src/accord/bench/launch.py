"""Where the benchmark's ranks come from: an outside launcher, or workers we start ourselves.

Under accordrun, torchrun, mpirun or SLURM (detected from the environment, as ``hvd.init()``
does) this process *is* one rank: the worker runs here and rank 0 reports. Otherwise
``--nproc-per-node`` workers are started with :func:`accord.spawn` (each with the worker
contract and ``OMP_NUM_THREADS`` set to the requested threads) and rank 0's result comes back
to this process, which reports.

Torch-free: the parent of spawned workers never imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

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
    import os

    return max(1, (os.cpu_count() or 1) // max(1, local_size))


def run_workers(fn: Callable[[Any], Any], options: Any, where: Placement, threads: int) -> Any:
    """Run ``fn(options)`` on every rank; return rank 0's result here (None on other ranks).

    ``fn`` must be importable (module level) and ``options`` picklable: spawned workers
    unpickle both.

    Raises:
        WorkerFailedError: a spawned worker raised or died (the others are stopped).
    """
    if where.external:
        return fn(options)
    from accord.run.spawn import spawn

    results = spawn(fn, args=(options,), nprocs=where.size,
                    env={"OMP_NUM_THREADS": str(threads)}, grace_period=2.0)
    return results[0]


# Torch-free trampolines: spawn pickles these by name; the workers import the heavy modules.
def collectives_worker(options: Any) -> Any:
    """Run :func:`accord.bench.collectives.run` on this rank."""
    from accord.bench.collectives import run

    return run(options)


def train_worker(options: Any) -> Any:
    """Run :func:`accord.bench.train.run` on this rank."""
    from accord.bench.train import run

    return run(options)
