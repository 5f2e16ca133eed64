"""--sync-dst-dir in elastic jobs: the copy a host gets before its first worker (run/elastic/sync.py,
the driver's use of it with fake copies), the rsync copies themselves (run/processes/folder_copy.py, with a fake
rsync on PATH), and parameter servers refused in elastic jobs (exit 2)."""
from __future__ import annotations

import os
import stat

import pytest
from test_run_elastic import FakeMember, FakePoller, FakeStore, FakeSupervisor, _cfg, _discover

from accord.errors import ConfigError, LaunchError
from accord.run.cli import main
from accord.run.elastic import driver as elastic_driver
from accord.run.elastic.config import ElasticConfig
from accord.run.elastic.sync import HostCopies
from accord.run.processes.folder_copy import FolderCopy
from accord.run.processes.ssh import SshOptions
from accord.worker_contract import ELASTIC_DEAD_KEY

pytestmark = pytest.mark.timeout(30)


class FakeCopy:
    def __init__(self, host, failure=None):
        self.host, self.ended, self.stopped = host, False, False
        self._failure = failure

    def done(self):
        return self.ended

    def stop(self):
        self.stopped = self.ended = True

    def failure(self):
        return "killed" if self.stopped else self._failure


class FakeCopier:
    """Records every copy started (in ``events``, shared with the workers started)."""

    timeout = 60.0

    def __init__(self, events=None, fail=(), missing=False):
        self.events = [] if events is None else events
        self.copies: dict[str | None, list[FakeCopy]] = {}
        self.fail, self.missing = set(fail), missing

    def start(self, host):
        self.events.append(("copy", host))
        if self.missing:
            raise LaunchError("--sync-dst-dir: cannot run rsync: No such file or directory")
        copy = FakeCopy(host, f"{host} (rsync exit 12: connection closed)" if host in self.fail else None)
        self.copies.setdefault(host, []).append(copy)
        return copy

    def error(self, failed):
        return LaunchError(f"--sync-dst-dir: could not copy /w to /tmp/job on {'; '.join(failed)}")

    def finish(self, host):
        for copy in self.copies[host]:
            copy.ended = True


# --- which hosts get a copy, and when --------------------------------------------------------------

def test_each_host_is_copied_once_and_every_local_name_is_this_host():
    copier = FakeCopier()
    copies = HostCopies(copier, copied=["h1"])
    assert copies.copied("h1") and not copies.copied("h2")
    assert copies.begin(["h1", "h2", "h2", "localhost", "127.0.0.1"]) == ["h2", "localhost"]
    assert copies.begin(["h2", "127.0.0.1"]) == []  # running already
    assert copies.finished() == []
    copier.finish("h2")
    copier.finish(None)
    assert copies.finished() == [("h2", None), ("localhost", None)]
    assert copies.copied("h2") and copies.copied("127.0.0.1")
    assert copies.begin(["h2", "localhost"]) == []
    assert copier.events == [("copy", "h2"), ("copy", None)]


def test_a_failed_copy_is_reported_once_and_tried_again_later():
    copier = FakeCopier(fail={"h2"})
    copies = HostCopies(copier)
    copies.begin(["h2"])
    copier.finish("h2")
    [(host, error)] = copies.finished()
    assert host == "h2" and "h2 (rsync exit 12: connection closed)" in str(error)
    assert copies.finished() == [] and not copies.copied("h2")
    assert copies.begin(["h2"]) == ["h2"]  # the host came back: copied again


def test_a_copy_that_cannot_start_or_takes_too_long_fails_and_close_stops_the_rest():
    clock = [0.0]
    copies = HostCopies(FakeCopier(missing=True), clock=lambda: clock[0])
    assert copies.begin(["h2"]) == []
    [(host, error)] = copies.finished()
    assert host == "h2" and "cannot run rsync" in str(error)
    copier = FakeCopier()
    copies = HostCopies(copier, clock=lambda: clock[0])
    copies.begin(["h2", "h3"])
    clock[0] = 61.0  # past the copier's timeout
    copier.finish("h3")
    assert [(h, e is None) for h, e in copies.finished()] == [("h2", False), ("h3", True)]
    assert copier.copies["h2"][0].stopped
    copies.begin(["h4"])
    copies.close()
    assert copier.copies["h4"][0].stopped


def test_nothing_to_copy_when_the_folder_is_the_copy(tmp_path):
    copies = HostCopies(FolderCopy(str(tmp_path), str(tmp_path) + "/", SshOptions()))
    assert copies.begin(["localhost"]) == [] and copies.copied("localhost")


# --- the driver: a host's first worker waits for its copy ------------------------------------------

def _driver(tmp_path, copier, hosts="echo h1:1", min_np=1, np=None, **elastic):
    cfg = _cfg(([] if np is None else ["-np", str(np)])
               + ["--host-discovery-script", hosts, "--min-np", str(min_np), "python3", "t.py"], tmp_path)
    clock = [0.0]
    said: list[str] = []
    members: dict[int, FakeMember] = {}

    def start(i, slot, joining):
        copier.events.append(("worker", i, slot.hostname, joining))
        members[i] = FakeMember(i, slot.hostname, slot=slot)
        return members[i]

    copies = HostCopies(copier, cfg.job_hosts, clock=lambda: clock[0])  # the launcher copied these
    store = FakeStore()
    driver = elastic_driver.ElasticDriver(cfg, ElasticConfig(cfg.elastic.discovery_script, **elastic),
                                          FakeSupervisor(), store, start, lambda m: ("failure", m.index),
                                          said.append, clock=lambda: clock[0], copies=copies)
    driver._poller = FakePoller()
    driver.start()
    return driver, store, said, clock


def test_a_joining_host_is_copied_to_once_before_its_first_worker(tmp_path):
    copier = FakeCopier()
    driver, store, said, clock = _driver(tmp_path, copier)
    assert copier.events == [("worker", 0, "h1", False)]  # h1: copied at the launch
    _discover(driver, clock, "h1:1\nh2:2\n")
    assert not driver.poll() and not driver.poll()  # the copy runs; the driver keeps watching
    assert copier.events[1:] == [("copy", "h2")]
    copier.finish("h2")
    assert not driver.poll()
    assert copier.events[1:] == [("copy", "h2"), ("worker", 1, "h2", True), ("worker", 2, "h2", True)]
    assert said[-1] == "elastic: started worker 2 on h2 (rank 2 of 3 once admitted)"
    _discover(driver, clock, "h1:1\nh2:3\n")  # more slots on a host that has the copy: no new copy
    assert not driver.poll()
    assert copier.events[-2:] == [("worker", 2, "h2", True), ("worker", 3, "h2", True)]


def test_local_hosts_are_copied_to_once(tmp_path):
    copier = FakeCopier()
    driver, store, said, clock = _driver(tmp_path, copier)
    _discover(driver, clock, "h1:1\nlocalhost:1\n127.0.0.1:1\n")
    assert not driver.poll()
    copier.finish(None)
    assert not driver.poll()
    assert copier.events[1:] == [("copy", None), ("worker", 1, "localhost", True), ("worker", 2, "127.0.0.1", True)]


def test_a_failed_copy_blacklists_the_host_without_failing_the_job(tmp_path):
    copier = FakeCopier(fail={"h2"})
    driver, store, said, clock = _driver(tmp_path, copier)
    _discover(driver, clock, "h1:1\nh2:1\nh3:1\n")
    assert not driver.poll()
    copier.finish("h2")
    copier.finish("h3")
    assert not driver.poll() and not driver.poll()
    assert copier.events[1:] == [("copy", "h2"), ("copy", "h3"), ("worker", 1, "h3", True)]
    assert driver.blacklist.is_blocked("h2", 1e9) and not driver.outcome.error
    assert ELASTIC_DEAD_KEY.format(member=1) not in store  # no worker was counted for h2
    assert any(s.startswith("warning: could not start a worker on h2: --sync-dst-dir: could not copy")
               and s.endswith("blacklisting it") for s in said), said


def test_first_workers_after_a_wait_start_once_their_hosts_have_the_copy(tmp_path):
    copier = FakeCopier()
    driver, store, said, clock = _driver(tmp_path, copier, hosts="true", np=2, start_np=2, elastic_timeout=30.0)
    _discover(driver, clock, "h1:1\nh2:1\n")
    assert not driver.poll()
    assert copier.events == [("copy", "h1"), ("copy", "h2")]
    copier.finish("h1")
    clock[0] = 40.0  # past --elastic-timeout: the wait is over, the copy is not timed by it
    assert not driver.poll() and not driver.outcome.error
    copier.finish("h2")
    assert not driver.poll()
    assert copier.events[2:] == [("worker", 0, "h1", False), ("worker", 1, "h2", False)]


def test_a_failed_copy_to_a_first_host_fails_the_start(tmp_path):
    copier = FakeCopier(fail={"h2"})
    driver, store, said, clock = _driver(tmp_path, copier, hosts="true", np=2, start_np=2)
    _discover(driver, clock, "h1:1\nh2:1\n")
    assert not driver.poll()
    copier.finish("h1")
    copier.finish("h2")
    with pytest.raises(LaunchError, match=r"could not copy /w to /tmp/job on h2 \(rsync exit 12"):
        driver.poll()
    assert [e for e in copier.events if e[0] == "worker"] == []


# --- the copies themselves (a fake rsync) ----------------------------------------------------------

def _fake_rsync(tmp_path, body):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    rsync = bin_dir / "rsync"
    rsync.write_text("#!/bin/sh\n" + body)
    rsync.chmod(rsync.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_folder_copy_names_each_failed_host_and_rsyncs_message(tmp_path):
    env = _fake_rsync(tmp_path, 'case "$*" in *h2:*) echo "rsync: connection unexpectedly closed" >&2; exit 12;; '
                                'esac\nexit 0\n')
    copier = FolderCopy("/w", "/tmp/job", SshOptions(), env, timeout=10)
    copier.run(["h1"])
    with pytest.raises(LaunchError) as info:
        copier.run(["h1", "h2"])
    text = str(info.value)
    assert "could not copy /w to /tmp/job on h2 (rsync exit 12: rsync: connection unexpectedly closed)" in text
    assert "h1" not in text.splitlines()[0] and "HINT:" in text
    copy = copier.start("h2")
    copy.wait(10)
    assert copy.done() and copy.failure() == copy.failure() == (  # read once, asked twice
        "h2 (rsync exit 12: rsync: connection unexpectedly closed)")


def test_folder_copy_kills_a_copy_past_its_timeout_and_says_when_rsync_is_missing(tmp_path):
    env = _fake_rsync(tmp_path, "exec sleep 120\n")
    with pytest.raises(LaunchError, match=r"on h2 \(rsync exit -9: no message\)"):
        FolderCopy("/w", "/tmp/job", SshOptions(), env, timeout=0.5).run(["h2"])
    with pytest.raises(LaunchError, match="cannot run rsync"):
        FolderCopy("/w", "/tmp/job", SshOptions(), {"PATH": str(tmp_path / "nothing")}).run(["h2"])


def test_folder_copy_here_copies_the_folder(tmp_path):
    (tmp_path / "src" / "data").mkdir(parents=True)
    (tmp_path / "src" / "data" / "payload.txt").write_text("copied")
    FolderCopy(str(tmp_path / "src"), str(tmp_path / "dst" / "job"), SshOptions(), dict(os.environ)).run([None])
    assert (tmp_path / "dst" / "job" / "data" / "payload.txt").read_text() == "copied"


# --- parameter servers are not for elastic jobs ----------------------------------------------------

@pytest.mark.parametrize("argv, refused, kind", [
    (["-np", "1", "--ps", "mxnet", "--host-discovery-script", "true"], "--ps mxnet", "--host-discovery-script"),
    (["--num-servers", "2", "--host-discovery-script", "echo h1:2"], "--num-servers 2", "--host-discovery-script"),
    (["--ps", "mxnet", "--num-servers", "1", "-H", "h1:1,h2:1", "--min-np", "1"], "--ps mxnet and --num-servers 1",
     "--min-np with -H/--hostfile/--ips naming two or more hosts"),
])
def test_parameter_servers_in_an_elastic_job_exit_2_with_a_hint(argv, refused, kind, tmp_path, capsys):
    with pytest.raises(ConfigError) as info:
        _cfg(argv + ["python3", "t.py"], tmp_path)
    first, hint = str(info.value).splitlines()
    assert first.startswith(f"{refused} cannot be used in an elastic job ({kind})") and hint.startswith("HINT: drop")
    assert main(argv + ["python3", "t.py"]) == 2
    assert "cannot be used in an elastic job" in capsys.readouterr().err


def test_no_server_is_still_fine_in_an_elastic_job_and_servers_on_one_host_with_min_np(tmp_path):
    assert _cfg(["--num-servers", "0", "--host-discovery-script", "echo h1:1", "python3", "t.py"],
                tmp_path).num_servers == 0
    cfg = _cfg(["-np", "2", "--min-np", "1", "--num-servers", "1", "python3", "t.py"], tmp_path)
    assert cfg.elastic is None and cfg.num_servers == 1  # one host: no elastic driver, servers as before


def test_folder_copy_stops_its_copies_when_asked(tmp_path):
    pid_file = tmp_path / "rsync.pids"
    env = _fake_rsync(tmp_path, f"echo $$ >> {pid_file}\nexec sleep 120\n")
    asked = []

    def stop_when():
        asked.append(1)
        return len(asked) >= 3

    # the copies sleep 120 s and the copy's own timeout is 60 s, both past the test's 30 s:
    # run returns only if it killed them
    assert FolderCopy("/w", "/tmp/job", SshOptions(), env, timeout=60).run(["h2", "h3"], stop_when) is False
    assert len(asked) == 3  # stopped at the third ask
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2, pids
    for pid in pids:  # killed and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    env = _fake_rsync(tmp_path, "exit 0\n")
    assert FolderCopy("/w", "/tmp/job", SshOptions(), env, timeout=60).run(["h2"], lambda: False) is True

