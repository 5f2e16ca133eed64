"""Ending a Ray cluster a test started, with every process Ray started for it.

``ray.shutdown()`` (and ``Cluster.shutdown()``) stop the GCS and the raylets; the agents a raylet
starts (the dashboard agent, the runtime-env agent) notice that their parent is gone only at
their next check, which a loaded machine can delay past the run's leftover check, and they are
no longer this process's descendants by then. So they are listed before Ray shuts down and
waited for afterwards, with SIGKILL for what outlives a bound.
"""
from __future__ import annotations

import os
from typing import Callable

import psutil


def _is_ray(proc: psutil.Process) -> bool:
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return False
    return any("/ray/" in a or a.startswith("ray::") or os.path.basename(a) in ("raylet", "gcs_server")
               for a in argv)


def ray_descendants() -> list[psutil.Process]:
    """This process's descendants that Ray started (its GCS, raylets, agents and workers)."""
    return [p for p in psutil.Process().children(recursive=True) if _is_ray(p)]


def shutdown_reaped(*shutdowns: Callable[[], None], timeout: float = 30.0) -> list[int]:
    """Call ``shutdowns`` in order, then wait up to ``timeout`` seconds for every Ray process
    that ran before them to end, and SIGKILL the rest.

    Returns:
        The pids that had to be killed (empty when Ray ended them all itself).
    """
    before = ray_descendants()
    try:
        for shutdown in shutdowns:
            shutdown()
    finally:
        _, alive = psutil.wait_procs(before, timeout=timeout)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5.0)
    return [p.pid for p in alive]
