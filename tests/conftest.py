"""Fixtures shared by every test: fail a test that leaks env vars, threads or process groups."""
from __future__ import annotations

import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # makes `helpers` importable from tests


# Variables pytest or torch set for themselves on first use, not a test's doing.
_SET_BY_LIBRARIES = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.is_alive()}


@pytest.fixture(autouse=True)
def no_leaks():
    """A test must leave the environment, threads and torch.distributed as it found them."""
    env_before = dict(os.environ)
    threads_before = _threads()
    yield
    env_after = dict(os.environ)
    changed = sorted(
        k for k in set(env_before) | set(env_after)
        if env_before.get(k) != env_after.get(k) and k not in _SET_BY_LIBRARIES
    )
    # multiprocessing's fork server and queue feeder threads belong to the harness, not the test.
    leaked = {
        t for t in _threads() - threads_before
        if not t.startswith(("QueueFeederThread", "pymp-", "Thread-"))
        or t.startswith("accord")
    }
    try:
        import torch.distributed as dist

        pg_leak = dist.is_available() and dist.is_initialized()
    except ImportError:  # pragma: no cover
        pg_leak = False
    if pg_leak:
        dist.destroy_process_group()
    for key in changed:  # restore so one leak does not cascade into other tests
        if key in env_before:
            os.environ[key] = env_before[key]
        else:
            os.environ.pop(key, None)
    problems = []
    if changed:
        problems.append(f"environment variables changed: {changed}")
    if leaked:
        problems.append(f"threads left running: {sorted(leaked)}")
    if pg_leak:
        problems.append("torch.distributed default process group left initialized")
    if problems:
        pytest.fail("test leaked state: " + "; ".join(problems))
