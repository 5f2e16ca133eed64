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
    """Ray's own programs and Python scripts only: other processes may carry Ray's folders in
    their command line (multiprocessing's fork server is given ``sys.path``, where importing Ray
    puts its ``ray/thirdparty_files``), and must be left alone."""
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return False
    if not argv:
        return False
    if argv[0].startswith("ray::") or os.path.basename(argv[0]) in ("raylet", "gcs_server"):
        return True
    if os.path.basename(argv[0]).startswith("python") and "-c" not in argv[1:]:
        script = next((a for a in argv[1:] if not a.startswith("-")), "")
        return "/ray/" in script and script.endswith(".py")
    return False


def _harness() -> set[int]:
    """multiprocessing's fork server and resource tracker: this process's children by design."""
    import multiprocessing.forkserver as forkserver
    import multiprocessing.resource_tracker as resource_tracker

    pids = {getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None),
            getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)}
    return {p for p in pids if p}


def ray_descendants() -> list[psutil.Process]:
    """This process's descendants that Ray started (its GCS, raylets, agents and workers)."""
    harness = _harness()
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in harness and _is_ray(p)]


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
