"""Fixtures shared by every test: fail a test that leaks env vars, threads or process groups,
and fail the run if it leaves files, shared-memory segments or processes behind
(see helpers/leftovers.py)."""
from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # makes `helpers` importable from tests

# Ray reads its authentication mode once, when it is first imported, and any test module may be
# the first to import it (tests/cluster's importorskip is collected before tests/integration):
# ray_auth's token setting goes in before any test module is collected
from helpers import leftovers, ray_auth  # noqa: E402,F401

_RUN: dict = {}


def pytest_configure(config):
    """Give the run a private temporary directory and mark its children (before any test)."""
    if hasattr(config, "workerinput") or _RUN:  # pragma: no cover - one owner per run
        return
    base = tempfile.mkdtemp(prefix="pytest-accord-run-")
    _RUN.update(tmp=base, outer=os.environ.get("TMPDIR"), run_id=secrets.token_hex(8),
                shm=leftovers.shm_segments())
    os.environ["TMPDIR"] = base
    os.environ[leftovers.MARK] = _RUN["run_id"]
    tempfile.tempdir = None  # re-read TMPDIR


@pytest.hookimpl(trylast=True)  # after pytest's own, which tears down the last fixtures
def pytest_sessionfinish(session, exitstatus):
    """Fail the run if anything it created is still there (then remove the private directory)."""
    if not _RUN:
        return
    found = leftovers.find(_RUN["tmp"], _RUN["run_id"], _RUN["shm"], ignore_pids=_harness_pids())
    if found:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = ("the test run left things behind (each test must clean up what it creates):\n  "
                + "\n  ".join(found) + f"\n(kept: {_RUN['tmp']})")
        if reporter is not None:
            reporter.write_sep("=", "leftovers", red=True)
            reporter.write_line(text)
        else:  # pragma: no cover
            print(text, file=sys.stderr)
    else:
        # At exit, after multiprocessing removes its own pymp-* directory in there.
        from multiprocessing.util import Finalize

        Finalize(None, shutil.rmtree, args=(_RUN["tmp"],), kwargs={"ignore_errors": True}, exitpriority=-101)
    if _RUN["outer"] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = _RUN["outer"]
    os.environ.pop(leftovers.MARK, None)
    tempfile.tempdir = None


def _harness_pids() -> set[int]:
    """The harness's fork server and resource tracker: children of this process by design,
    alive until it exits."""
    import multiprocessing.forkserver as forkserver
    import multiprocessing.resource_tracker as resource_tracker

    pids = {getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None),
            getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)}
    return {p for p in pids if p}


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
    # Only if this process imported torch.distributed (importing torch here, in the teardown
    # of a test that never used it, can take longer than the test's timeout on a busy machine).
    dist = sys.modules.get("torch.distributed")
    pg_leak = dist is not None and dist.is_available() and dist.is_initialized()
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


@pytest.fixture
def killed_tmpdir(tmp_path_factory):
    """A TMPDIR for processes the test SIGKILLs on purpose: they cannot remove what they made
    (a launcher's job directory, a parameter server's socket directory), so it goes with this
    directory when the test ends."""
    path = tmp_path_factory.mktemp("killed")
    yield str(path)
    shutil.rmtree(path, ignore_errors=True)
