"""The guardian program: a launcher that dies (its pipe ends without ``q``) takes its process
groups and job directory with it; a launcher that ends normally leaves both alone."""
import ast
import os
import signal
import subprocess
import sys

from accord.run.processes.guardian import PROGRAM, Guardian, group_alive, start_process


def _sleeper():
    return start_process([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    for stream in (proc.stdout, proc.stderr):
        stream.close()


def test_a_dead_launcher_takes_its_groups_and_directories(tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "error-0.json").write_text("{}")
    worker = _sleeper()
    try:
        guardian = Guardian(grace=1.0)  # the unreaped worker counts as alive: the grace runs out
        guardian.watch(worker.pid)
        guardian.remove_on_death(str(job_dir))
        guardian._proc.stdin.close()  # what the launcher's death does to the pipe
        assert guardian._proc.wait(60) == 0
        assert worker.wait(30) in (-signal.SIGTERM, -signal.SIGKILL)
        assert not group_alive(worker.pid)
        assert not job_dir.exists()
    finally:
        _stop(worker)


def test_a_normal_end_kills_nothing(tmp_path):
    worker = _sleeper()
    try:
        guardian = Guardian(grace=5.0)
        guardian.watch(worker.pid)
        guardian.remove_on_death(str(tmp_path))
        guardian.close()
        assert guardian._proc.returncode == 0
        assert worker.poll() is None and tmp_path.exists()
    finally:
        _stop(worker)


def test_a_forgotten_group_is_left_alone(tmp_path):
    kept, killed = _sleeper(), _sleeper()
    try:
        guardian = Guardian(grace=1.0)
        guardian.watch(kept.pid)
        guardian.watch(killed.pid)
        guardian.forget(kept.pid)
        guardian._proc.stdin.close()
        assert guardian._proc.wait(60) == 0
        assert killed.wait(30) in (-signal.SIGTERM, -signal.SIGKILL)
        assert kept.poll() is None
    finally:
        _stop(kept)
        _stop(killed)


def test_the_program_runs_isolated_and_needs_nothing_of_accord(tmp_path):
    tree = ast.parse(open(PROGRAM, encoding="utf-8").read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not [name for name in imported if name.split(".")[0] == "accord"]
    # A PYTHONPATH module shadowing the standard library does not reach it (-I).
    (tmp_path / "signal.py").write_text("raise SystemExit('shadowed')\n")
    done = subprocess.run([sys.executable, "-I", "-S", PROGRAM, "1"], input=b"q\n", capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=60)
    assert done.returncode == 0, done.stderr
