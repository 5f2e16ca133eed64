"""Elastic training across simulated hosts: accordrun --host-discovery-script grows the job onto
a host that appears, lets a removed host's workers leave, and re-forms without a worker that is
killed (its host blacklisted). The job's own logs (scripts/elastic_job.py) are checked by
elastic_check.py: the world size after each event, identical weights on every rank, every
sample once per epoch, and final weights equal to a one-process replay of the same steps.

One job goes through every event (sharing the session's cluster, plus h3): h1 x 2, + h2 x 2,
- h2, + h3 x 1, h3's worker killed. Another grows onto h2 with --sync-dst-dir: h2 gets the copy
of the working folder before its worker starts there."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from elastic_check import check_same_weights, check_samples, committed, first_step_after, load, replay, size_changes
from helpers.cluster_jobs import PYTHON, script, start_accordrun, wait_for_files

pytestmark = pytest.mark.timeout(420)


def _steps_at(log_dir: Path, size: int, since: float) -> int:
    """How many steps the job committed at world size ``size`` after ``since``."""
    try:
        return len({h["gstep"] for h in committed(load(log_dir)) if h["size"] == size and h["t"] > since})
    except (AssertionError, json.JSONDecodeError):  # a line being written, or a step not logged yet
        return 0


def _wait_steps(proc: subprocess.Popen, log_dir: Path, size: int, since: float, count: int = 3,
                timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _steps_at(log_dir, size, since) < count:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the job ended ({proc.returncode}) while waiting for size {size}:\n"
                        f"{out[-3000:]}\n{err[-5000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"no {count} steps at size {size} within {timeout}s:\n{err[-5000:]}")
        time.sleep(0.2)


def _set_hosts(log_dir: Path, text: str) -> float:
    tmp = log_dir / "hosts.tmp"
    tmp.write_text(text)
    os.replace(tmp, log_dir / "hosts")  # the script never sees a half-written file
    return time.time()


def _start(cluster, log_dir: Path, *extra: str) -> subprocess.Popen:
    _set_hosts(log_dir, "h1:2\n")
    return start_accordrun(cluster, "--host-discovery-script", f"cat {log_dir}/hosts",
                           "--discovery-interval", "0.5", "--min-np", "2", "--max-np", "6",
                           "--grace-period", "2", PYTHON, script("elastic_job.py"), str(log_dir), *extra)


def _stop(proc: subprocess.Popen, log_dir: Path) -> tuple[str, str]:
    (log_dir / "stop").touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-5000:]
    return out, err


def _check_history(log_dir: Path, out: str, sizes: list[int]) -> list[dict]:
    """World sizes, identical weights, samples once per epoch, final weights = the replay."""
    history = committed(load(log_dir))
    assert size_changes(history) == sizes, size_changes(history)
    check_same_weights(history)
    assert check_samples(history) >= 2
    done = [json.loads(line.split("DONE ", 1)[1]) for line in out.splitlines() if "DONE {" in line]
    assert sorted(d["m"] for d in done) == [0, 1] and all(d["size"] == 2 for d in done), out[-3000:]
    expected = replay(history)
    for d in done:
        assert [v for p in d["weights"] for v in p] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    return history


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_hosts_join_leave_and_fail_while_training(cluster, shared_dir):
    """hvd.elastic.run with a plain PyTorch loop: + h2 x 2, - h2, + h3 x 1, h3's worker killed."""
    if "h3" not in cluster.hosts:
        cluster.add_host("h3")  # stays for later tests of the session; they name their hosts
    log_dir = shared_dir
    proc = _start(cluster, log_dir)
    try:
        _wait_steps(proc, log_dir, 2, 0.0)
        added = _set_hosts(log_dir, "h1:2\nh2:2\n")  # growth
        _wait_steps(proc, log_dir, 4, added)
        removed = _set_hosts(log_dir, "h1:2\n")  # shrink
        _wait_steps(proc, log_dir, 2, removed)
        third = _set_hosts(log_dir, "h1:2\nh3:1\n")
        _wait_steps(proc, log_dir, 3, third)
        victim = [pid for pid, cmd in cluster.processes("h3") if cmd.startswith(PYTHON) and "elastic_job.py" in cmd]
        assert len(victim) == 1, cluster.processes("h3")
        killed = time.time()
        os.kill(victim[0], signal.SIGKILL)  # the worker itself, not its ssh session
        _wait_steps(proc, log_dir, 2, killed)
        out, err = _stop(proc, log_dir)
    finally:
        _kill(proc)
    history = _check_history(log_dir, out, [2, 4, 2, 3, 2])
    phases: dict[int, set] = {}
    for h in history:  # who ran in each phase
        phases.setdefault(h["size"], set()).update(h["members"])
    assert {0, 1, 2, 3} <= phases[4] and 4 in phases[3], phases
    assert "hosts left the job: stopping workers [2, 3] on ['h2']" in err, err[-5000:]
    assert err.count("leaves the job (its host was removed)") == 2 and "did not leave within" not in err
    assert "worker 4 on h3 ended (signal SIGKILL" in err or "worker 4 on h3 ended (exit code" in err, err[-5000:]
    assert "blacklisting h3 for the rest of the job" in err
    assert "started worker 5" not in err  # h3 stays out, though the script still prints it
    timings = {"host_added_to_first_step_s": first_step_after(history, added, 4),
               "host_added_third_to_first_step_s": first_step_after(history, third, 3),
               "worker_killed_to_next_step_s": first_step_after(history, killed, 2),
               "host_removed_to_first_step_s": first_step_after(history, removed, 2)}
    for member, at in ((2, added), (4, third)):  # where a new worker's time went
        start = json.loads((log_dir / f"start.{member}.json").read_text())
        timings[f"worker{member}_process_started_after_s"] = start["started"] - at
        timings[f"worker{member}_imports_s"] = start["imported"] - start["started"]
        timings[f"worker{member}_admitted_and_initialized_s"] = start["initialized"] - start["imported"]
    print("ELASTIC_TIMINGS " + json.dumps(timings))
    out_file = os.environ.get("ACCORD_ELASTIC_TIMINGS")
    if out_file:  # benchmarks/cluster_elastic.py collects these
        Path(out_file).write_text(json.dumps(timings))


def test_model_fit_grows_and_shrinks(cluster, shared_dir):
    """accord.Model.fit(elastic=True): + h2 x 2, then - h2."""
    proc = _start(cluster, shared_dir, "--fit")
    try:
        _wait_steps(proc, shared_dir, 2, 0.0)
        _wait_steps(proc, shared_dir, 4, _set_hosts(shared_dir, "h1:2\nh2:2\n"))
        _wait_steps(proc, shared_dir, 2, _set_hosts(shared_dir, "h1:2\n"))
        out, err = _stop(proc, shared_dir)
    finally:
        _kill(proc)
    _check_history(shared_dir, out, [2, 4, 2])
    assert err.count("leaves the job (its host was removed)") == 2, err[-5000:]


@pytest.mark.timeout(120)
def test_a_host_the_job_grows_onto_gets_the_sync_dst_dir_copy(cluster, shared_dir):
    """--sync-dst-dir: the job starts on h1 (copied at the launch); h2, printed later, gets the copy
    in its own /tmp before its worker starts there, and that worker runs from it."""
    project = shared_dir / "project"
    (project / "data").mkdir(parents=True)
    shutil.copy(script("elastic_in_dir.py"), project)
    (project / "data" / "payload.txt").write_text("copied")
    dest = f"/tmp/job-{uuid.uuid4().hex[:8]}"
    assert cluster.run("h2", ["test", "-e", dest]).returncode == 1  # nothing there before the job
    _set_hosts(shared_dir, "h1:1\n")
    proc = start_accordrun(cluster, "--host-discovery-script", f"cat {shared_dir}/hosts", "--discovery-interval",
                           "0.5", "--min-np", "1", "--max-np", "2", "--sync-dst-dir", dest, "--verbose",
                           PYTHON, "elastic_in_dir.py", str(shared_dir), cwd=project)
    try:
        wait_for_files([shared_dir / "report.0.json"], 45, proc)
        _set_hosts(shared_dir, "h1:1\nh2:1\n")
        try:
            wait_for_files([shared_dir / "report.1.json"], 45, proc)
        except pytest.fail.Exception:  # show the launcher's account (a failed worker on h2 is a warning)
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"no report from the worker on h2 within 45 s:\n{err[-5000:]}")
        (shared_dir / "stop").touch()
        out, err = proc.communicate(timeout=30)
    finally:
        _kill(proc)
    assert proc.returncode == 0, err[-5000:]
    got = [json.loads((shared_dir / f"report.{m}.json").read_text()) for m in (0, 1)]
    assert [(g["hostname"], g["cwd"], g["payload"]) for g in got] == [("h1", dest, "copied"), ("h2", dest, "copied")]
    assert cluster.run("h2", ["ls", f"{dest}/data"]).stdout.split() == ["payload.txt"]  # h2's own /tmp
    assert "elastic: copying the working folder to h2 (--sync-dst-dir) before starting workers there" in err, err
    assert err.index("copying the working folder to h2") < err.index("started worker 1 on h2"), err
