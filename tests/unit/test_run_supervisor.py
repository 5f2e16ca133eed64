"""The supervisor (start, watch, stop a job's processes) and the registry of runners."""
import signal
import sys
import time

import pytest

from accord.errors import ConfigError
from accord.run.processes import runners
from accord.run.processes.runners import LocalRunner, SshRunner, StartOptions, register_runner, runner_for
from accord.run.processes.ssh import SshOptions
from accord.run.processes.supervisor import Supervisor

pytestmark = pytest.mark.timeout(60)

OPTIONS = StartOptions(cwd=".", worker_cwd=".", grace=1.0, ssh=SshOptions(), secret_hex="00" * 32)
IGNORES_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(60)")


def test_runner_for_picks_local_or_ssh_and_the_registry_refuses_duplicates():
    assert isinstance(runner_for("localhost"), LocalRunner)
    assert isinstance(runner_for("node-that-is-not-here"), SshRunner)
    assert runner_for("node-that-is-not-here").remote and not runner_for("localhost").remote
    with pytest.raises(ConfigError, match="(?s)already registered.*HINT.*override=True"):
        register_runner("ssh", LocalRunner)
    with pytest.raises(ConfigError, match="(?s)unknown remote runner 'srun'; known: local, ssh.*HINT"):
        runner_for("node-that-is-not-here", remote="srun")

    class Recorder(LocalRunner):
        name = "recorder"
        remote = True

    saved = dict(runners._RUNNERS)
    try:
        register_runner("recorder", Recorder)
        assert isinstance(runner_for("node-that-is-not-here", remote="recorder"), Recorder)
    finally:
        runners._RUNNERS.clear()
        runners._RUNNERS.update(saved)


def test_supervisor_reaps_exits_and_stops_the_rest_with_term_then_kill():
    sup = Supervisor(grace=0.5)
    try:
        quick = sup.start("worker", 0, 0, "localhost", [sys.executable, "-c", "raise SystemExit(3)"],
                          {"PATH": "/usr/bin:/bin"}, {}, OPTIONS)
        stubborn = sup.start("worker", 1, 1, "localhost", [sys.executable, "-c", IGNORES_TERM],
                             {"PATH": "/usr/bin:/bin"}, {}, OPTIONS)
        polite = sup.start("server", 0, "server0", "localhost", [sys.executable, "-c", "import time; time.sleep(60)"],
                           {"PATH": "/usr/bin:/bin"}, {}, OPTIONS)
        assert stubborn.proc.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 20
        ended = []
        while not ended and time.monotonic() < deadline:
            ended = sup.reap()
            time.sleep(0.05)
        assert ended == [quick] and quick.returncode == 3
        assert sup.of_kind("server") == [polite] and sup.of_kind("worker") == [quick, stubborn]
        running = sup.stop(signal.SIGTERM)
        assert running == [stubborn, polite] and stubborn.stopped and polite.stopped
        assert polite.returncode == -signal.SIGTERM  # stopped by the signal
        assert stubborn.returncode == -signal.SIGKILL  # ignored it: killed after the grace period
        assert sup.reap() == []
    finally:
        sup.kill()
        sup.close()
