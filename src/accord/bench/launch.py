"""Running the benchmark's ranks where :mod:`accord.bench.placement` says they are.

Under an outside launcher this process *is* one rank: the worker runs here and rank 0 reports.
Otherwise ``--nproc-per-node`` workers are started with :func:`accord.spawn` (each with the
worker contract and ``OMP_NUM_THREADS`` set to the requested threads) and rank 0's result comes
back to this process, which reports.

Torch-free: the parent of spawned workers never imports torch.
"""
from __future__ import annotations

from typing import Any, Callable

from accord.bench.placement import Placement


def run_workers(fn: Callable[[Any], Any], options: Any, where: Placement, threads: int) -> Any:
    """Run ``fn(options)`` on every rank; return rank 0's result here (None on other ranks).

    ``fn`` must be importable (module level) and ``options`` picklable: spawned workers
    unpickle both.

    Raises:
        WorkerFailedError: a spawned worker raised or died (the others are stopped).
    """
    if where.external:
        return fn(options)
    from accord.run.functions.spawn import spawn

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
