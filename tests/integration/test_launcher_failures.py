"""accordrun failure handling through the real CLI: the first failure stops every worker,
the root cause is reported, and no process survives (checked by pid)."""
import importlib.util
import signal
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

FAIL = lib.script("fail.py")


def _run_fail(tmp_path, *fail_args, np_="3", launcher_args=()):
    """Run fail.py; return (completed process, all worker and grandchild pids).

    The run may take 30 s, half of the 60 s the ranks that do not fail sleep: a job that returns
    at all had them stopped."""
    proc = lib.accordrun("-np", np_, *launcher_args, lib.PYTHON, FAIL, "--pid-dir", str(tmp_path), *fail_args,
                         timeout=30)
    pids = [int(p) for f in tmp_path.glob("*.pids") for p in f.read_text().split()]
    return proc, pids


@pytest.mark.timeout(30)
def test_worker_exit_3_stops_job_and_launcher_exits_3(tmp_path):
    proc, pids = _run_fail(tmp_path, "--fail-rank", "1", "--code", "3", "--grandchild")
    try:
        assert proc.returncode == 3, proc.stderr
        err = proc.stderr
        assert "Root Cause (first observed failure):" in err
        assert "rank       : 1 (local_rank 1, host localhost)" in err and "status     : exit code 3" in err
        assert "rank 1 failing with exit" in err.split("Root Cause")[1]  # last stderr lines
        assert "Stopped by the launcher: ranks 0, 2" in err
        assert len(pids) == 6 and lib.wait_dead(pids, 5) == []  # workers and their children
    finally:
        lib.kill_all(pids)


@pytest.mark.timeout(30)
def test_sigkilled_worker_is_reported_by_signal(tmp_path):
    proc, pids = _run_fail(tmp_path, "--fail-rank", "0", "--mode", "kill", np_="2")
    try:
        assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
        assert "killed by SIGKILL (signal 9)" in proc.stderr and "rank       : 0" in proc.stderr
        assert lib.wait_dead(pids, 5) == []
    finally:
        lib.kill_all(pids)


@pytest.mark.timeout(30)
def test_uncaught_exception_traceback_comes_from_the_error_file(tmp_path):
    proc, pids = _run_fail(tmp_path, "--fail-rank", "1", "--mode", "raise", np_="2")
    try:
        assert proc.returncode == 1, proc.stderr
        cause = proc.stderr.split("Root Cause")[1]
        assert "error      : ValueError: bad value on rank 1" in cause
        assert "traceback  :" in cause and 'fail.py", line' in cause
    finally:
        lib.kill_all(pids)


@pytest.mark.timeout(30)
def test_record_decorator_reports_without_accord_init(tmp_path):
    proc, pids = _run_fail(tmp_path, "--fail-rank", "0", "--mode", "record", np_="2")
    try:
        assert proc.returncode == 1
        assert "error      : KeyError: 'missing key on rank 0'" in proc.stderr
    finally:
        lib.kill_all(pids)


@pytest.mark.timeout(45)
def test_worker_ignoring_sigterm_is_killed_after_the_grace(tmp_path):
    # rank 1 notes the SIGTERM it ignores; the grace (5 s) leaves it ample time to, on any
    # machine, before the launcher's SIGKILL
    proc, pids = _run_fail(tmp_path, "--fail-rank", "0", "--code", "5", "--ignore-term",
                              "--delay", "0.5", np_="2", launcher_args=("--grace-period", "5"))
    try:
        assert proc.returncode == 5, proc.stderr
        assert (tmp_path / "1.term").exists(), "rank 1 got no SIGTERM before it was killed"
        assert not (tmp_path / "0.term").exists()  # rank 0 failed by itself
        # rank 1 outlived the SIGTERM, yet the job ended long before its 60 s sleep: SIGKILL
        assert lib.wait_dead(pids, 5) == []
    finally:
        lib.kill_all(pids)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_launcher_stops_every_worker(tmp_path, sig):
    launcher = lib.start_accordrun("-np", "2", "--grace-period", "2", lib.PYTHON, FAIL, "--pid-dir",
                                   str(tmp_path), "--grandchild")
    pids: list[int] = []
    try:
        pids = lib.wait_for_pids(tmp_path, 2)
        assert all(lib.alive(p) for p in pids)
        launcher.send_signal(sig)  # what Ctrl-C does to the foreground launcher
        out, err = launcher.communicate(timeout=15)
        assert launcher.returncode == 128 + sig, err
        assert f"received {signal.Signals(sig).name}; stopped ranks [0, 1]" in err
        assert lib.wait_dead(pids, 5) == []
    finally:
        lib.reap(launcher, pids)


@pytest.mark.timeout(30)
def test_sigkilled_launcher_takes_workers_down(tmp_path, killed_tmpdir):
    launcher = lib.start_accordrun("-np", "2", "--grace-period", "1", lib.PYTHON, FAIL, "--pid-dir",
                                   str(tmp_path), "--grandchild", "--ignore-term",
                                   env=lib.cli_env(TMPDIR=killed_tmpdir))
    pids: list[int] = []
    try:
        pids = lib.wait_for_pids(tmp_path, 2)
        launcher.kill()  # SIGKILL: no handler runs; the guardian must notice
        launcher.communicate(timeout=10)
        assert lib.wait_dead(pids, 10) == []
    finally:
        lib.kill_all(pids)


@pytest.mark.timeout(30)
def test_start_timeout_names_missing_ranks(tmp_path):
    pytest.importorskip("accord.store.connection")
    # the ranks sleep 120 s: the job ending within the 30 s the run allows shows the start
    # timeout ended it, as its message says
    proc = lib.accordrun("-np", "3", "--start-timeout", "2", lib.PYTHON, lib.script("checkin.py"), "1", "120",
                         timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert "ranks [1] (on localhost) did not check in" in proc.stderr and "HINT:" in proc.stderr
    assert "[0]<stdout>:rank 0 checked in" in proc.stdout and "[2]<stdout>:rank 2 checked in" in proc.stdout


@pytest.mark.timeout(30)
def test_start_timeout_met_runs_normally(tmp_path):
    pytest.importorskip("accord.store.connection")
    proc = lib.accordrun("-np", "2", "--start-timeout", "10", lib.PYTHON, lib.script("checkin.py"), "-1", "0.5")
    assert proc.returncode == 0, proc.stderr
