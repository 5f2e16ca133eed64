"""accordrun --min-np: an elastic job (hvd.elastic.run) carries on without a worker that dies,
while enough remain; below --min-np the first failure stops the job as usual. With
--host-discovery-script on this host: a script that fails, hangs or prints garbage is warned
about and the job keeps its hosts; a job below --min-np fails after --elastic-timeout."""
import contextlib
import importlib.util
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

TRAIN = lib.script("elastic_train.py")


def _done(stdout):
    return [json.loads(line.split("DONE ", 1)[1]) for line in stdout.splitlines() if "DONE {" in line]


@pytest.mark.timeout(90)
def test_min_np_job_finishes_on_the_survivors():
    proc = lib.accordrun("-np", "3", "--min-np", "2", lib.PYTHON, TRAIN, "--steps", "5",
                         "--die-rank", "2", "--die-step", "2", timeout=80)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = _done(proc.stdout)
    assert sorted(d["first_rank"] for d in done) == [0, 1]
    for d in done:
        assert d["size"] == 2
        assert d["sizes"] == [3, 3, 2, 2, 2]  # two committed steps on 3 ranks, then 2
    assert done[0]["weight"] == done[1]["weight"]  # the survivors still agree
    assert "elastic: rank 2 on localhost ended (exit code 3); continuing with 2 workers (--min-np 2)" in proc.stderr
    assert "elastic: the job finished on ranks [0, 1] (--min-np 2) without rank 2" in proc.stderr


@pytest.mark.timeout(60)
def test_below_min_np_the_failure_stops_the_job():
    proc = lib.accordrun("-np", "2", "--min-np", "2", lib.PYTHON, TRAIN, "--steps", "50",
                         "--die-rank", "1", "--die-step", "1", timeout=50)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "rank 1" in proc.stderr and "exit code 3" in proc.stderr
    assert not _done(proc.stdout)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv, fragment", [
    (["-np", "2", "--min-np", "3"], "--min-np must be between 1 and -np (2)"),
    (["-np", "2", "--min-np", "0"], "--min-np must be between 1 and -np (2)"),
    (["-np", "3", "--max-np", "2"], "--max-np 2 is below -np 3"),
    (["-np", "2", "--host-discovery-script", "exit 5"], "failed with exit code 5"),
    (["--host-discovery-script", "true"], "printed no host on its first run, and -np is not given"),
    (["--host-discovery-script", "echo localhost:2", "-H", "localhost:2"], "both name hosts"),
])
def test_bad_elastic_flags_exit_2_with_hint(argv, fragment):
    proc = lib.accordrun(*argv, lib.PYTHON, TRAIN)
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr and "HINT:" in proc.stderr
    assert not _done(proc.stdout)


JOB = str(Path(__file__).resolve().parents[1] / "cluster" / "scripts" / "elastic_job.py")


def _wait_text(path: Path, text: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert proc.poll() is None, f"the job ended ({proc.returncode}):\n{path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{text!r} did not appear:\n{path.read_text()[-3000:]}"
        time.sleep(0.2)


@contextlib.contextmanager
def _accordrun_logging_stderr(err_path: Path, *args: str, **env: str) -> Iterator[subprocess.Popen]:
    """accordrun with ``args``, its stderr in ``err_path`` (read while it runs), stdout piped;
    killed on the way out if it still runs."""
    with open(err_path, "w") as err:
        proc = subprocess.Popen([lib.PYTHON, "-m", "accord.run", *args], stdout=subprocess.PIPE, stderr=err,
                                text=True, env=lib.cli_env(**env))
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _logged_steps(log_dir: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in log_dir.glob("log.*.jsonl"))


@pytest.mark.timeout(240)
def test_a_bad_discovery_script_is_warned_about_and_the_job_keeps_its_hosts(tmp_path):
    discover = tmp_path / "discover.sh"
    discover.write_text("echo localhost:2\n")
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:  # (--sleep: a few steps a second show it trains, without spinning)
        proc = subprocess.Popen(
            [lib.PYTHON, "-m", "accord.run", "--host-discovery-script", f"sh {discover}",
             "--discovery-interval", "0.5", "--grace-period", "1", lib.PYTHON, JOB, str(tmp_path),
             "--sleep", "0.1"], stdout=subprocess.PIPE, stderr=err, text=True,
            env=lib.cli_env(ACCORD_CPU_BACKEND="gloo"))
    try:
        deadline = time.monotonic() + 120
        while _logged_steps(tmp_path) < 4:
            assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()[-3000:]
            time.sleep(0.2)
        script = f"'sh {discover}'"
        for body, warning in [
            ("echo localhost:two\n", f"host discovery script {script} printed line 1 'localhost:two': "
                                     "slots must be a positive integer"),
            ("echo inventory down >&2; exit 3\n", f"host discovery script {script} failed with exit "
                                                   "code 3: inventory down"),
            ("sleep 30\n", f"host discovery script {script} did not finish within 2.5s (killed)"),
        ]:
            discover.write_text(body)
            _wait_text(err_path, warning, proc)
            assert "keeping the current hosts (localhost:2)" in err_path.read_text()
        steps = _logged_steps(tmp_path)
        deadline = time.monotonic() + 60
        while _logged_steps(tmp_path) < steps + 4:  # still training, on both workers
            assert proc.poll() is None and time.monotonic() < deadline, err_path.read_text()[-3000:]
            time.sleep(0.2)
        (tmp_path / "stop").touch()
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err_path.read_text()[-3000:]
    done = [json.loads(line.split("DONE ", 1)[1]) for line in out.splitlines() if "DONE {" in line]
    assert sorted(d["m"] for d in done) == [0, 1] and all(d["size"] == 2 and d["resets"] == [] for d in done)


@pytest.mark.timeout(120)
def test_below_min_np_the_job_fails_after_the_elastic_timeout(tmp_path):
    """Worker 1 (on 127.0.0.1) fails: that host is blacklisted (for good); worker 0 on localhost
    goes on alone, below --min-np 2, and nothing comes back within --elastic-timeout (the error
    says that is what ended the job)."""
    proc = lib.accordrun("--host-discovery-script", "echo localhost:1; echo 127.0.0.1:1", "--min-np", "2",
                         "--elastic-timeout", "3", "--discovery-interval", "0.5", "--grace-period", "1",
                         lib.PYTHON, TRAIN, "--steps", "500", "--die-rank", "1", "--die-step", "2", timeout=110)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "elastic: worker 1 on 127.0.0.1 ended (exit code 3); blacklisting 127.0.0.1 for the rest of the job" \
        in proc.stderr
    assert "error: the job stayed below --min-np 2 (1 workers) for --elastic-timeout 3s; discovered " \
        "hosts: localhost:1, 127.0.0.1:1; blacklisted: ['127.0.0.1']" in proc.stderr
    assert "HINT: make 'echo localhost:1; echo 127.0.0.1:1' print more hosts" in proc.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["exit", "SIGKILL"])
def test_a_failure_on_the_only_host_leaves_the_survivor_running_there(tmp_path, how):
    """localhost:2, --min-np 1: worker 1 ends mid-training (exit 3, or SIGKILL mid-step). Its host
    is blacklisted, but worker 0 still runs there and is all --min-np needs: it is kept, re-forms
    alone and finishes."""
    die = ["--die-rank", "1", "--die-step", "2"] if how == "exit" else ["--kill-rank", "1", "--kill-step", "2"]
    proc = lib.accordrun("--host-discovery-script", "echo localhost:2", "-np", "2", "--min-np", "1",
                         "--max-np", "2", "--discovery-interval", "0.5", "--grace-period", "1",
                         lib.PYTHON, TRAIN, "--steps", "5", *die, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = _done(proc.stdout)
    assert [(d["first_rank"], d["size"], d["sizes"]) for d in done] == [(0, 1, [2, 2, 1, 1, 1])], proc.stdout
    assert "elastic: worker 1 on localhost ended" in proc.stderr and "blacklisting localhost" in proc.stderr
    assert ("elastic: keeping workers [0] on localhost although it is blacklisted: without them 0 workers "
            "would run, fewer than --min-np 1") in proc.stderr
    assert "every host of the job is blacklisted" not in proc.stderr
    assert "hosts left the job" not in proc.stderr


PARITY = lib.script("elastic_parity.py")


_WAITING = {  # what the script prints before the marker, and what the launcher then says
    "one-slot": ("echo localhost:1", "printed 1 usable slot (localhost:1), fewer than -np 2; waiting up to "
                                     "--elastic-timeout 60s for more, running it every 0.2s"),
    "no-host": ("true", "printed no host; waiting up to --elastic-timeout 60s for 2 slots (-np 2), running "
                        "it every 0.2s"),
}


def _runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.timeout(40)
@pytest.mark.parametrize("before", sorted(_WAITING))
def test_too_few_slots_at_the_start_waits_for_them_then_runs(tmp_path, before):
    """horovodrun waits for -np slots before it starts (wait_for_available_slots): the script
    prints 1 slot for -np 2 (or no host at all: an autoscaling cluster without a node yet), then
    2 once the test writes the marker; the job then runs to the end on 2 workers."""
    script, waiting = _WAITING[before]
    marker, runs = tmp_path / "second-slot", tmp_path / "runs"
    discover = tmp_path / "discover.sh"
    discover.write_text(f"echo run >> {runs}; if [ -e {marker} ]; then echo localhost:2; else {script}; fi\n")
    err_path = tmp_path / "stderr.txt"
    with _accordrun_logging_stderr(err_path, "-np", "2", "--host-discovery-script", f"sh {discover}",
                                   "--discovery-interval", "0.2", "--elastic-timeout", "60", "--grace-period", "1",
                                   lib.PYTHON, PARITY, "--steps", "2", ACCORD_CPU_BACKEND="gloo") as proc:
        _wait_text(err_path, f"elastic: the discovery script {waiting}", proc, 15)
        seen = _runs(runs)
        deadline = time.monotonic() + 15
        while _runs(runs) < seen + 5:  # the launcher looked again, five times, and still had too few slots
            assert proc.poll() is None, err_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"the script ran {_runs(runs) - seen} times more in 15s"
            time.sleep(0.05)
        assert proc.poll() is None, err_path.read_text()[-3000:]
        assert "to start after waiting" not in err_path.read_text()  # no worker yet
        marker.touch()
        out, _ = proc.communicate(timeout=25)
    stderr = err_path.read_text()
    assert proc.returncode == 0, stderr[-3000:]
    assert "elastic: 2 workers to start after waiting" in stderr and "(localhost:2)" in stderr
    done = sorted((json.loads(line.split("DONE ", 1)[1]) for line in out.splitlines() if "DONE {" in line),
                  key=lambda d: d["rank"])
    assert [(d["start_rank"], d["rank"], d["size"], d["sizes"]) for d in done] == [(0, 0, 2, [2, 2]),
                                                                                   (1, 1, 2, [2, 2])]
    assert all(d["w"] == pytest.approx(-3.0) for d in done)  # both steps averaged over 2 ranks


@pytest.mark.timeout(30)
@pytest.mark.parametrize("script, waiting, printed", [
    ("echo localhost:1", "1 usable slot (localhost:1), fewer than -np 2; waiting up to --elastic-timeout 3s "
                         "for more", "1 usable slot: localhost:1"),
    ("true", "no host; waiting up to --elastic-timeout 3s for 2 slots (-np 2)", "no host"),
], ids=["one-slot", "no-host"])
def test_too_few_slots_until_the_elastic_timeout_fails_the_job(script, waiting, printed):
    proc = lib.accordrun("-np", "2", "--host-discovery-script", script, "--elastic-timeout", "3",
                         "--discovery-interval", "0.5", lib.PYTHON, "-c", "print('WORKER RAN')", timeout=25)
    assert proc.returncode == 1, proc.stderr[-3000:]  # as when the job stays below --min-np
    lines = proc.stderr.splitlines()
    assert lines[0] == f"accordrun: elastic: the discovery script printed {waiting}, running it every 0.5s"
    assert ("accordrun: error: timed out after --elastic-timeout 3s waiting for the 2 slots the job needs to "
            f"start (-np 2); the discovery script printed {printed}") in lines
    assert f"HINT: make '{script}' print hosts with at least 2 slots in all, lower -np, or raise " \
        "--elastic-timeout" in proc.stderr
    assert "WORKER RAN" not in proc.stdout  # (the "timed out after --elastic-timeout" line: what ended it)


@pytest.mark.timeout(30)
def test_a_signal_while_waiting_for_slots_exits_130_saying_nothing_had_started(tmp_path):
    err_path = tmp_path / "stderr.txt"
    with _accordrun_logging_stderr(err_path, "-np", "2", "--host-discovery-script", "echo localhost:1",
                                   "--discovery-interval", "0.2", "--elastic-timeout", "60",
                                   lib.PYTHON, "-c", "print('WORKER RAN')") as proc:
        _wait_text(err_path, "fewer than -np 2; waiting up to", proc, 15)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
    stderr = err_path.read_text()
    assert proc.returncode == 130, stderr[-3000:]
    assert "accordrun: received SIGINT before any worker started" in stderr, stderr[-3000:]
    assert "WORKER RAN" not in out


STORE_BIND = """
import os
port = int(os.environ["ACCORD_STORE_PORT"])
with open("/proc/net/tcp") as fh:  # the launcher's listening socket, seen from its worker
    rows = [line.split() for line in list(fh)[1:]]
binds = sorted({r[1].split(":")[0] for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == port})
print("STORE", os.environ["ACCORD_STORE_ADDR"], binds, flush=True)
"""


@pytest.mark.timeout(60)
def test_an_elastic_job_on_fixed_hosts_of_this_machine_keeps_its_store_on_loopback():
    """Its hosts never change and are all this one: no other host needs to reach the store."""
    proc = lib.accordrun("-np", "2", "-H", "localhost:1,127.0.0.1:1", "--min-np", "1",
                         lib.PYTHON, "-c", STORE_BIND, timeout=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if "STORE " in line]
    assert len(lines) == 2, proc.stdout
    for line in lines:
        assert line.endswith("STORE 127.0.0.1 ['0100007F']"), line  # 127.0.0.1, not 0.0.0.0
