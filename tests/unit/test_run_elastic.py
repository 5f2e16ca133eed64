"""The pure parts of elastic jobs with host discovery: the script's output, running the script
(fails, hangs, garbage), the blacklist and its cooldown, the plan of workers to start and stop,
the flags, and the driver's decisions (with a fake supervisor, store and clock)."""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

import pytest

from accord.errors import ConfigError, LaunchError, RendezvousError
from accord.run.cli import build_parser, main
from accord.run.config.launch_config import config_from_args, describe
from accord.run.elastic import driver as elastic_driver
from accord.run.elastic.blacklist import Blacklist
from accord.run.elastic.config import ElasticConfig
from accord.run.elastic.discovery import DiscoveryError, DiscoveryResult, parse_discovery_output, run_discovery
from accord.run.elastic.plan import Plan, plan_changes, planned_slots, usable_hosts
from accord.run.elastic.store import ElasticStore
from accord.run.processes.job_store import JobStore
from accord.run.spec.assignment import Slot, assign_slots
from accord.run.spec.hosts import HostSlots
from accord.run.spec.worker_env import elastic_env
from accord.runtime.topology import topology_from_hostnames
from accord.worker_contract import (
    ELASTIC_DEAD_KEY,
    ELASTIC_LATEST_KEY,
    ELASTIC_LAUNCH_KEY,
    ELASTIC_LAUNCHED_KEY,
    ELASTIC_LEAVING_KEY,
    ELASTIC_MEMBERS_KEY,
    ELASTIC_UPDATE_KEY,
    ELASTIC_UPDATES_KEY,
)
from tests.helpers.elastic_fakes import FakePoller, FakeStore, FakeSupervisor

pytestmark = pytest.mark.timeout(30)


# --- the script's output ---------------------------------------------------------------------------

def test_output_lines_with_and_without_slots():
    text = "h1:2\n\n# a comment\nh2   # bare: --slots-per-host\n10.0.0.7:4\nh1:3\n"
    assert parse_discovery_output(text, 5, "d.sh") == [
        HostSlots("h1", 3), HostSlots("h2", 5), HostSlots("10.0.0.7", 4)]  # h1 named twice: last count
    assert parse_discovery_output("", None, "d.sh") == []


def test_bracketed_ipv6_hosts_are_read_as_dash_h_reads_them():
    assert parse_discovery_output("[::1]:2\n[fe80::1]\n", 3, "d.sh") == [
        HostSlots("::1", 2), HostSlots("fe80::1", 3)]


@pytest.mark.parametrize("text, fragment", [
    ("h1:x\n", "line 1 'h1:x': slots must be a positive integer"),
    ("h1:2\nh2:0\n", "line 2 'h2:0': slots must be a positive integer"),
    ("bad host!\n", "not a host name"),
    (":3\n", "not a host name"),
    ("h1:2:3\n", "not a host name"),  # as -H reads it: a bare IPv6 address needs brackets
    ("h1:+2\n", "slots must be a positive integer"),  # counts in plain digits, as -H takes them
    ("h1:1_0\n", "slots must be a positive integer"),  # int() would read 10
    ("h1:\u0662\n", "slots must be a positive integer"),  # an Arabic-Indic 2
    ("h1: 2x\n", "slots must be a positive integer"),
    ("[::1\n", "not a host name"),
])
def test_garbage_names_the_script_and_the_line(text, fragment):
    with pytest.raises(DiscoveryError) as info:
        parse_discovery_output(text, 1, "./discover.sh")
    assert "host discovery script './discover.sh' printed" in str(info.value)
    assert fragment in str(info.value) and "HINT:" in str(info.value)


def test_bare_host_needs_slots_per_host():
    with pytest.raises(DiscoveryError, match="(?s)without a slot count.*--slots-per-host"):
        parse_discovery_output("h1\n", None, "d.sh")


@pytest.mark.parametrize("lines, slots_per_host, expected", [
    # the MPI Operator's discover_hosts.sh for Horovod: pod.workers-service:slots per running worker
    (["job-worker-0.job-worker:2", "job-worker-1.job-worker:2"], None,
     [HostSlots("job-worker-0.job-worker", 2), HostSlots("job-worker-1.job-worker", 2)]),
    # its v2beta1 form: bare pod.service.namespace.svc names, slots from --slots-per-host
    (["job-worker-0.job.default.svc", "job-worker-1.job.default.svc"], 4,
     [HostSlots("job-worker-0.job.default.svc", 4), HostSlots("job-worker-1.job.default.svc", 4)]),
])
def test_the_mpi_operators_discover_hosts_script_runs_unchanged(tmp_path, lines, slots_per_host, expected):
    script = tmp_path / "discover_hosts.sh"  # as the operator writes it into /etc/mpi
    script.write_text("#!/bin/sh\n" + "".join(f"echo {line}\n" for line in lines))
    script.chmod(0o755)
    assert run_discovery(str(script), slots_per_host, timeout=10) == expected


def test_running_the_script(tmp_path):
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\necho h1:2\necho h2\n")
    script.chmod(0o755)
    assert run_discovery(str(script), 3, timeout=10) == [HostSlots("h1", 2), HostSlots("h2", 3)]
    assert run_discovery("printf 'h5:1\\n'", None, timeout=10) == [HostSlots("h5", 1)]  # a shell command


def test_failing_script_says_exit_code_and_stderr():
    with pytest.raises(DiscoveryError) as info:
        run_discovery("echo no inventory >&2; exit 3", None, timeout=10)
    assert "failed with exit code 3: no inventory" in str(info.value)


@pytest.mark.timeout(60)  # under the script's 120 s sleep: run_discovery returns only if it killed it
def test_hanging_script_is_killed_at_its_timeout(tmp_path):
    pid_file = tmp_path / "script.pid"
    with pytest.raises(DiscoveryError, match=r"did not finish within 0.5s \(killed\)"):  # the timeout ended it
        run_discovery(f"echo $$ > {pid_file}; exec sleep 120", None, timeout=0.5)
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(int(pid_file.read_text()), 0)


# --- blacklist -------------------------------------------------------------------------------------

def test_blacklist_without_cooldown_is_for_good():
    bl = Blacklist()
    assert bl.add("h3", now=100.0) is None
    assert bl.is_blocked("h3", 1e9) and not bl.is_blocked("h1", 100.0)
    assert bl.blocked(5e8) == {"h3"}


def test_blacklist_cooldown_backs_off_exponentially_from_min_and_caps_at_max():
    """Horovod's formula: the n-th failure keeps the host out MIN * 2**n s plus a jitter of up to
    MIN, within [MIN, MAX]."""
    bl = Blacklist((10.0, 300.0), rng=random.Random(7))
    jitter = random.Random(7)
    expected = []
    for n in range(1, 7):
        expected.append(min(300.0, 10.0 * 2 ** n + jitter.uniform(0.0, 1.0) * 10.0))
    untils = [bl.add("h3", now=1000.0 * n) - 1000.0 * n for n in range(1, 7)]
    assert untils == pytest.approx(expected)
    assert 20.0 <= untils[0] <= 30.0 and 40.0 <= untils[1] <= 50.0 and 80.0 <= untils[2] <= 90.0
    assert untils[-1] == 300.0  # 640+ s capped at MAX
    assert bl.failures("h3") == 6
    until = bl.add("h1", now=0.0)
    assert bl.is_blocked("h1", until - 0.01) and not bl.is_blocked("h1", until + 0.01)
    tight = Blacklist((1.0, 2.0), rng=random.Random(1))
    assert tight.add("h", now=0.0) == 2.0  # 2-3 s, capped at MAX (Horovod's test range)


# --- the plan --------------------------------------------------------------------------------------

def test_plan_grows_onto_new_hosts_up_to_max_np():
    usable = [HostSlots("h1", 2), HostSlots("h2", 2), HostSlots("h3", 2)]
    workers = [(0, "h1"), (1, "h1")]
    assert plan_changes(usable, workers, max_np=None) == Plan(start=["h2", "h2", "h3", "h3"])
    assert plan_changes(usable, workers, max_np=3) == Plan(start=["h2"])
    assert plan_changes(usable, workers, max_np=2).empty


def test_plan_removes_a_gone_host_and_the_newest_beyond_slots():
    workers = [(0, "h1"), (1, "h1"), (2, "h2"), (3, "h2"), (4, "h1")]
    assert plan_changes([HostSlots("h1", 3)], workers, None) == Plan(remove=[2, 3])
    assert plan_changes([HostSlots("h1", 1), HostSlots("h2", 2)], workers, None) == Plan(remove=[1, 4])


def test_plan_skips_blacklisted_hosts():
    usable = usable_hosts([HostSlots("h1", 2), HostSlots("h3", 1)], blocked={"h3"})
    assert usable == [HostSlots("h1", 2)]
    assert plan_changes(usable, [(0, "h1"), (5, "h3")], None) == Plan(start=["h1"], remove=[5])


def test_a_blacklisted_host_whose_workers_are_kept_keeps_them_and_gets_no_new_one():
    hosts = [HostSlots("h1", 2), HostSlots("h3", 3)]
    usable = usable_hosts(hosts, blocked={"h1"}, kept={"h1": 1})
    assert usable == [HostSlots("h1", 1), HostSlots("h3", 3)]  # discovery order kept
    assert plan_changes(usable, [(0, "h1")], 2) == Plan(start=["h3"], remove=[])
    assert usable_hosts(hosts, blocked={"h1", "h3"}, kept={"h1": 0}) == []


# --- flags -----------------------------------------------------------------------------------------

def _cfg(argv, tmp_path):
    return config_from_args(build_parser().parse_args(argv), {"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path))


def test_flags_with_a_discovery_script(tmp_path):
    cfg = _cfg(["--host-discovery-script", "echo h1:2; echo h2:2", "--max-np", "6",
                "--discovery-interval", "0.5", "--reset-limit", "3",
                "--blacklist-cooldown-range", "5", "20", "python3", "t.py"], tmp_path)
    assert cfg.num_proc == 4 and cfg.min_np == 4  # -np: the first hosts' slots; --min-np: -np
    assert [(s.rank, s.hostname) for s in cfg.slots] == [(0, "h1"), (1, "h1"), (2, "h2"), (3, "h2")]
    e = cfg.elastic
    assert (e.max_np, e.discovery_interval, e.reset_limit, e.cooldown_range) == (6, 0.5, 3, (5.0, 20.0))
    assert not e.elastic_timeout_given and e.elastic_timeout == 600
    cfg = _cfg(["-np", "2", "--min-np", "1", "--host-discovery-script", "echo h1:4",
                "--elastic-timeout", "30", "python3", "t.py"], tmp_path)
    assert (cfg.num_proc, cfg.min_np, cfg.elastic.elastic_timeout_given) == (4, 1, True)


def test_an_elastic_job_starts_on_every_slot_up_to_max_np_and_np_is_the_least_it_needs(tmp_path):
    """horovodrun: in elastic mode -np is "the number of processes required before training can
    start"; the job runs on every discovered slot up to --max-np (--min-np defaults to -np)."""
    script = ["--host-discovery-script", "echo h1:2; echo h2:2"]
    cfg = _cfg(["-np", "2"] + script + ["python3", "t.py"], tmp_path)
    assert (cfg.num_proc, cfg.min_np) == (4, 2)
    assert [(s.rank, s.hostname) for s in cfg.slots] == [(0, "h1"), (1, "h1"), (2, "h2"), (3, "h2")]
    cfg = _cfg(["-np", "2", "--max-num-proc", "3", "--min-num-proc", "1"] + script + ["python3", "t.py"], tmp_path)
    assert (cfg.num_proc, cfg.min_np, cfg.elastic.max_np) == (3, 1, 3)  # horovodrun's long spellings too
    # more than the script prints: the job waits for slots (horovodrun's wait_for_available_slots)
    cfg = _cfg(["-np", "5"] + script + ["python3", "t.py"], tmp_path)
    assert (cfg.num_proc, cfg.min_np, cfg.elastic.start_np) == (4, 5, 5)
    assert len(cfg.slots) == 4
    with pytest.raises(ConfigError, match=r"--max-np 4 is below -np 5"):  # can never start: exit 2
        _cfg(["-np", "5", "--max-np", "4"] + script + ["python3", "t.py"], tmp_path)


def test_min_np_with_two_or_more_hosts_is_an_elastic_job_on_fixed_hosts(tmp_path):
    """horovodrun -H a:2,b:2 --min-np N runs its elastic driver on those hosts: every slot is
    used (up to --max-np), and --reset-limit / --blacklist-cooldown-range apply."""
    cfg = _cfg(["-np", "2", "--min-np", "2", "-H", "h1:2,h2:2", "--reset-limit", "3",
                "--blacklist-cooldown-range", "1", "5", "python3", "t.py"], tmp_path)
    e = cfg.elastic
    assert e is not None and e.discovery_script is None
    assert (e.reset_limit, e.cooldown_range, e.max_np) == (3, (1.0, 5.0), None)
    assert (cfg.num_proc, cfg.min_np) == (4, 2)
    assert [s.hostname for s in cfg.slots] == ["h1", "h1", "h2", "h2"]
    cfg = _cfg(["-np", "2", "--min-np", "1", "-H", "h1:2,h2:2", "--max-np", "3", "python3", "t.py"], tmp_path)
    assert cfg.num_proc == 3
    # one host: accord's own --min-np (the failed worker is left out), as before; Horovod refuses it
    cfg = _cfg(["-np", "3", "--min-np", "2", "-H", "h1:4", "python3", "t.py"], tmp_path)
    assert cfg.elastic is None and (cfg.num_proc, cfg.min_np) == (3, 2)
    with pytest.raises(ConfigError, match=r"-np 5 is more than the 4 slots the hosts have"):
        _cfg(["-np", "5", "--min-np", "2", "-H", "h1:2,h2:2", "python3", "t.py"], tmp_path)
    with pytest.raises(ConfigError, match=r"--discovery-interval needs --host-discovery-script"):
        _cfg(["--min-np", "2", "-H", "h1:2,h2:2", "--discovery-interval", "1", "python3", "t.py"], tmp_path)
    with pytest.raises(ConfigError, match=r"--reset-limit needs --host-discovery-script \(or --min-np with -H"):
        _cfg(["-np", "3", "--min-np", "2", "-H", "h1:4", "--reset-limit", "1", "python3", "t.py"], tmp_path)


def test_elastic_workers_are_marked_as_horovodrun_marks_them():
    assert elastic_env(3, True, 2, None) == {"ACCORD_ELASTIC": "1", "HOROVOD_ELASTIC": "1", "ACCORD_ELASTIC_ID": "3",
                                             "ACCORD_ELASTIC_JOIN": "1", "ACCORD_ELASTIC_MIN_NP": "2"}


@pytest.mark.parametrize("argv, fragment", [
    (["--slots-per-host", "2"], "--slots-per-host needs --host-discovery-script"),
    (["--host-discovery-script", "echo h1:2", "-H", "h1:2"], "both name hosts"),
    (["--host-discovery-script", "exit 4"], "failed with exit code 4"),
    (["--host-discovery-script", "echo 'h1:??'"], "slots must be a positive integer"),
    (["--host-discovery-script", "true"], "printed no host on its first run, and -np is not given"),
    (["--host-discovery-script", "echo h1:2", "--blacklist-cooldown-range", "9", "3"], "MAX is below MIN"),
    (["--host-discovery-script", "echo h1:2", "--discovery-interval", "0"], "--discovery-interval must be > 0"),
    (["--host-discovery-script", "echo h1:2", "--min-np", "3"], "--min-np must be between 1 and -np (2)"),
])
def test_bad_elastic_flags(argv, fragment, tmp_path):
    with pytest.raises(ConfigError) as info:
        _cfg(argv + ["python3", "t.py"], tmp_path)
    assert fragment in str(info.value) and "HINT:" in str(info.value)


# --- the driver's decisions ------------------------------------------------------------------------

@dataclass(eq=False)
class FakeMember:
    index: int
    host: str
    returncode: int | None = None
    stopped: bool = False
    kind: str = "worker"
    slot: Slot | None = None  # the coordinates it was started with


def _driver(tmp_path, hosts="echo h1:2", min_np=2, np=None, **elastic):
    cfg = _cfg(([] if np is None else ["-np", str(np)])
               + ["--host-discovery-script", hosts, "--min-np", str(min_np), "python3", "t.py"], tmp_path)
    clock = [0.0]
    said: list[str] = []
    started: list[tuple[int, str, bool]] = []
    sup, store = FakeSupervisor(), FakeStore()
    members: dict[int, FakeMember] = {}

    def start(i, slot, joining):
        started.append((i, slot.hostname, joining))
        members[i] = FakeMember(i, slot.hostname, slot=slot)
        return members[i]

    settings = ElasticConfig(cfg.elastic.discovery_script, **elastic)
    driver = elastic_driver.ElasticDriver(cfg, settings, sup, store, start, lambda m: ("failure", m.index),
                                          said.append, clock=lambda: clock[0])
    driver._poller = FakePoller()
    driver.start()
    return driver, sup, store, members, started, said, clock


def _publish(store, epoch, members):
    """What the leader of re-formation ``epoch`` publishes (accord.torch.elastic.reform)."""
    store.set(ELASTIC_MEMBERS_KEY.format(epoch=epoch), json.dumps({"members": members, "updates": 0}))
    store.set(ELASTIC_LATEST_KEY, epoch)


def _discover(driver, clock, text=None, error=None):
    hosts = None if text is None else parse_discovery_output(text, None, "d.sh")
    driver._poller.queue.append(DiscoveryResult(hosts, None if error is None else DiscoveryError(error), clock[0]))


def test_driver_grows_and_shrinks_with_the_hosts(tmp_path):
    driver, sup, store, members, started, said, clock = _driver(tmp_path, max_np=3)
    assert started == [(0, "h1", False), (1, "h1", False)]
    _discover(driver, clock, "h1:2\nh2:2\n")
    assert not driver.poll()
    assert started[2:] == [(2, "h2", True)]  # --max-np 3
    _discover(driver, clock, "h1:2\n")  # h2 gone: its worker is asked to leave, the others told
    clock[0] = 5.0
    assert not driver.poll()
    assert store[ELASTIC_LEAVING_KEY.format(member=2)] == "1"
    n = store[ELASTIC_UPDATES_KEY]
    assert store[ELASTIC_UPDATE_KEY.format(n=n)] == "removed"
    members[2].returncode = 0  # it left at the next commit
    sup.ended.append(members[2])
    assert not driver.poll()
    assert driver.outcome.removed == [2] and not driver.outcome.succeeded
    clock[0] = 100.0  # a leaving worker that does not leave is stopped after the grace period
    _discover(driver, clock, "h1:1\n")
    driver.poll()
    clock[0] = 140.0
    driver.poll()
    assert sup.asked == [1]


def test_driver_blacklists_a_failing_host_and_keeps_min_np(tmp_path):
    """A failure blacklists its host (every worker there leaves, as in Horovod)."""
    driver, sup, store, members, started, said, clock = _driver(tmp_path, hosts="echo h1:2; echo h3:1", min_np=2)
    members[2].returncode = 137
    sup.ended.append(members[2])
    assert not driver.poll()
    assert driver.outcome.lost == [("failure", 2)]
    assert store[ELASTIC_DEAD_KEY.format(member=2)] == "1"
    assert driver.blacklist.is_blocked("h3", 1e9)
    assert any("worker 2 on h3 ended" in s and "blacklisting h3 for the rest of the job" in s for s in said)
    _discover(driver, clock, "h1:2\nh3:1\n")  # h3 still printed: blacklisted, not used
    assert not driver.poll() and len(started) == 3
    for i in (0, 1):
        members[i].returncode = 0
        sup.ended.append(members[i])
    assert driver.poll()
    assert driver.outcome.succeeded == [0, 1] and not driver.outcome.failures


def test_driver_waits_below_min_np_then_fails_after_the_elastic_timeout(tmp_path):
    driver, sup, store, members, started, said, clock = _driver(tmp_path, hosts="echo h1:1; echo h2:1",
                                                                elastic_timeout=30.0)
    members[1].returncode = 1
    sup.ended.append(members[1])
    assert not driver.poll()
    assert any("below --min-np 2; waiting up to --elastic-timeout 30s" in s for s in said)
    clock[0] = 29.0
    assert not driver.poll()
    clock[0] = 31.0
    assert driver.poll()
    assert "stayed below --min-np 2 (1 workers) for --elastic-timeout 30s" in driver.outcome.error
    assert "blacklisted: ['h2']" in driver.outcome.error and "HINT:" in driver.outcome.error


def test_driver_recovers_when_a_host_comes_in_time(tmp_path):
    driver, sup, store, members, started, said, clock = _driver(
        tmp_path, hosts="echo h1:1; echo h2:1", elastic_timeout=30.0, cooldown_range=(1.0, 1.0))
    members[1].returncode = 1
    sup.ended.append(members[1])
    driver.poll()
    assert len(started) == 2  # h2 is blacklisted for 1 s
    clock[0] = 2.0  # h2's cooldown is over: it gets a worker again
    _discover(driver, clock, "h1:1\nh2:1\n")
    driver.poll()
    assert started[-1] == (2, "h2", True)
    clock[0] = 40.0
    assert not driver.poll() and driver.outcome.error is None


def test_bad_discovery_is_warned_once_and_the_hosts_kept(tmp_path):
    driver, sup, store, members, started, said, clock = _driver(tmp_path)
    for _ in range(3):
        _discover(driver, clock, error="host discovery script 'd.sh' failed with exit code 1")
        assert not driver.poll()
    warnings = [s for s in said if "failed with exit code 1" in s]
    assert len(warnings) == 1 and "keeping the current hosts (h1:2)" in warnings[0]
    assert len(started) == 2 and not sup.asked


def test_reset_limit(tmp_path):
    driver, sup, store, members, started, said, clock = _driver(tmp_path, reset_limit=1)
    _discover(driver, clock, "h1:2\nh2:1\n")
    assert not driver.poll()  # one change: within the limit
    _publish(store, 1, [0, 1, 2])  # the workers re-formed for it
    _discover(driver, clock, "h1:2\n")
    assert driver.poll()
    assert "workers changed 2 times (re-formations), more than --reset-limit 1" in driver.outcome.error


def test_changes_before_the_workers_re_form_are_one_reset(tmp_path):
    """A failure blacklists its host, then the host's other worker is told to leave: the workers
    re-form once for both, so it is one reset (Horovod counts re-formations)."""
    driver, sup, store, members, started, said, clock = _driver(tmp_path, hosts="echo h1:2; echo h2:2",
                                                                reset_limit=1)
    members[3].returncode = 1
    sup.ended.append(members[3])
    assert not driver.poll()
    assert store[ELASTIC_LEAVING_KEY.format(member=2)] == "1"  # h2's other worker leaves too
    assert driver.limits.resets == 1 and driver.outcome.error is None
    _publish(store, 1, [0, 1])  # they re-formed, as workers 0 and 1
    members[2].returncode = 0
    sup.ended.append(members[2])
    assert not driver.poll() and driver.outcome.removed == [2]
    members[1].returncode = 1  # a second failure needs a second re-formation: over the limit
    sup.ended.append(members[1])
    assert driver.poll() and driver.limits.resets == 2 and "--reset-limit 1" in driver.outcome.error


def test_driver_on_fixed_hosts_blacklists_a_failing_host_and_never_polls(tmp_path):
    cfg = _cfg(["-np", "2", "--min-np", "2", "-H", "h1:2,h2:2", "python3", "t.py"], tmp_path)
    sup, store, started, said = FakeSupervisor(), FakeStore(), [], []
    members: dict[int, FakeMember] = {}

    def start(i, slot, joining):
        started.append((i, slot.hostname, joining))
        members[i] = members.get(i) or FakeMember(i, slot.hostname)
        return members[i]

    driver = elastic_driver.ElasticDriver(cfg, cfg.elastic, sup, store, start, lambda m: ("failure", m.index),
                                          said.append, clock=lambda: 0.0)
    driver.start()
    assert driver._poller is None and started == [(0, "h1", False), (1, "h1", False), (2, "h2", False),
                                                  (3, "h2", False)]
    members[0].returncode = 1
    sup.ended.append(members[0])
    assert not driver.poll()
    assert driver.outcome.lost == [("failure", 0)] and driver.blacklist.is_blocked("h1", 1e9)
    assert store[ELASTIC_LEAVING_KEY.format(member=1)] == "1" and len(started) == 4
    # worker 1 is marked to leave, and that announced, before worker 0 is marked dead (which the
    # survivors' re-formation waits for): they re-form once, without both
    order = list(store)
    dead = order.index(ELASTIC_DEAD_KEY.format(member=0))
    assert order.index(ELASTIC_LEAVING_KEY.format(member=1)) < dead
    assert order.index(ELASTIC_UPDATE_KEY.format(n=1)) < dead and store[ELASTIC_UPDATE_KEY.format(n=1)] == "removed"
    for i in (1, 2, 3):
        members[i].returncode = 0
        sup.ended.append(members[i])
    assert driver.poll() and driver.outcome.succeeded == [2, 3] and driver.outcome.removed == [1]
    driver.close()


# --- too few slots at the start: wait for -np, up to --elastic-timeout (horovodrun) ---------------------

def test_np_above_the_first_slots_is_a_job_that_waits_and_fixed_hosts_still_exit_2(tmp_path):
    cfg = _cfg(["-np", "3", "--host-discovery-script", "echo h1:1", "--ranks-filter", "2",
                "python3", "t.py"], tmp_path)
    assert (cfg.num_proc, cfg.min_np, cfg.elastic.start_np) == (1, 3, 3)  # --ranks-filter: up to -np
    cfg = _cfg(["-np", "2", "--host-discovery-script", "echo h1:4", "python3", "t.py"], tmp_path)
    assert (cfg.num_proc, cfg.elastic.start_np) == (4, 2)  # enough: no wait
    with pytest.raises(ConfigError, match=r"(?s)-np 3 is more than the 2 slots the hosts have.*HINT"):
        _cfg(["-np", "3", "--min-np", "1", "-H", "h1:1,h2:1", "python3", "t.py"], tmp_path)


def _waiting_driver(tmp_path, **elastic):
    return _driver(tmp_path, hosts="echo h1:1", min_np=1, elastic_timeout=30.0, discovery_interval=0.5,
                   **elastic)


def test_driver_waits_for_np_slots_then_starts_on_every_usable_slot(tmp_path):
    driver, sup, store, members, started, said, clock = _waiting_driver(tmp_path, start_np=3, max_np=3)
    assert started == [] and said == [
        "elastic: the discovery script printed 1 usable slot (h1:1), fewer than -np 3; waiting up to "
        "--elastic-timeout 30s for more, running it every 0.5s"]
    clock[0] = 5.0
    _discover(driver, clock, "h1:1\nh2:1\n")
    assert not driver.poll() and started == []
    _discover(driver, clock, error="host discovery script 'd.sh' failed with exit code 1")
    assert not driver.poll() and started == []  # warned; the hosts it had are kept
    assert "keeping the current hosts (h1:1, h2:1)" in said[-1]
    clock[0] = 12.0
    _discover(driver, clock, "h1:2\nh2:2\n")
    assert not driver.poll()
    # every usable slot up to --max-np, as first workers (ranks by host order), not as joiners
    assert started == [(0, "h1", False), (1, "h1", False), (2, "h2", False)]
    assert [_coords(members[i].slot)[:6] for i in range(3)] == [(0, 3, 0, 2, 0, 2), (1, 3, 1, 2, 0, 1),
                                                                (2, 3, 0, 1, 1, 2)]
    assert said[-1] == "elastic: 3 workers to start after waiting 12.0s for hosts (h1:2, h2:2)"
    assert ELASTIC_UPDATES_KEY not in store and not any(k.startswith("accord/elastic/launch") for k in store)
    clock[0] = 100.0  # long past --elastic-timeout: the wait is over, nothing fails
    assert not driver.poll() and driver.outcome.error is None and len(started) == 3
    for i in range(3):
        members[i].returncode = 0
        sup.ended.append(members[i])
    assert driver.poll() and driver.outcome.succeeded == [0, 1, 2]


def test_driver_gives_up_waiting_after_the_elastic_timeout(tmp_path):
    driver, sup, store, members, started, said, clock = _waiting_driver(tmp_path, start_np=2)
    clock[0] = 29.0
    _discover(driver, clock, "h1:1\n")
    assert not driver.poll()
    clock[0] = 30.5
    assert driver.poll() and started == []
    error = driver.outcome.error
    assert error.splitlines()[0] == (
        "error: timed out after --elastic-timeout 30s waiting for the 2 slots the job needs to start "
        "(-np 2); the discovery script printed 1 usable slot: h1:1")
    assert "HINT: make 'echo h1:1' print hosts with at least 2 slots in all, lower -np, or raise " \
        "--elastic-timeout" in error


def test_a_first_discovery_without_hosts_waits_given_np_and_exits_2_without(tmp_path, capsys):
    """An autoscaling cluster without a node yet: horovodrun (whose -np is required) waits for
    -np slots; accordrun too, and without -np says to pass it (exit 2)."""
    cfg = _cfg(["-np", "2", "--host-discovery-script", "true", "--gpus", "0", "--ranks-filter", "1",
                "no-such-program", "t.py"], tmp_path)
    assert (cfg.num_proc, cfg.hosts, cfg.slots, cfg.min_np, cfg.elastic.start_np) == (0, (), (), 2, 2)
    # the store listens beyond loopback, as for every discovery job: a host printed later may be
    # another machine; the command is not looked up here, as for remote first hosts
    assert cfg.remote and cfg.command == ("no-such-program", "t.py")
    assert (describe(cfg)["np"], describe(cfg)["start_np"]) == (0, 2)  # --verbose: what it waits for
    assert main(["--host-discovery-script", "true", "python3", "t.py"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "accordrun: error: host discovery script 'true' printed no host on its first run, and -np is not "
        "given: there is no number of workers to wait for",
        "HINT: pass -np N, the fewest workers the job needs to start (horovodrun requires it): the job then "
        "waits up to --elastic-timeout for the script to print N slots"]


def test_driver_without_hosts_at_first_waits_then_starts_or_gives_up(tmp_path):
    driver, sup, store, members, started, said, clock = _driver(
        tmp_path, hosts="true", min_np=1, np=2, start_np=2, elastic_timeout=30.0, discovery_interval=0.5)
    assert started == [] and said == [
        "elastic: the discovery script printed no host; waiting up to --elastic-timeout 30s for 2 slots "
        "(-np 2), running it every 0.5s"]
    clock[0] = 3.0
    _discover(driver, clock, "h1:1\n")
    assert not driver.poll() and started == []
    _discover(driver, clock, "h1:2\n")
    assert not driver.poll() and started == [(0, "h1", False), (1, "h1", False)]
    assert said[-1] == "elastic: 2 workers to start after waiting 3.0s for hosts (h1:2)"
    driver, sup, store, members, started, said, clock = _driver(
        tmp_path, hosts="true", min_np=1, np=2, start_np=2, elastic_timeout=30.0)
    clock[0] = 30.5
    assert driver.poll() and started == []
    assert driver.outcome.error.splitlines()[0] == (
        "error: timed out after --elastic-timeout 30s waiting for the 2 slots the job needs to start "
        "(-np 2); the discovery script printed no host")


def test_blacklisted_hosts_do_not_count_towards_the_slots_to_start_on(tmp_path):
    driver, sup, store, members, started, said, clock = _waiting_driver(tmp_path, start_np=2)
    driver.blacklist.add("h2", now=0.0)  # for good
    _discover(driver, clock, "h1:1\nh2:4\n")
    assert not driver.poll() and started == []
    _discover(driver, clock, "h1:1\nh2:4\nh3:1\n")
    assert not driver.poll() and started == [(0, "h1", False), (1, "h3", False)]


def test_a_joiner_that_cannot_be_started_is_marked_dead(tmp_path):
    """It was counted as launched, so without the dead mark the next re-formation would wait
    (up to 10 s) for it to ask to join."""
    driver, sup, store, members, started, said, clock = _driver(tmp_path, hosts="echo h1:1", min_np=1)
    real_start = driver._start_worker

    def start(i, slot, joining):
        if slot.hostname == "h2":
            raise LaunchError(f"could not start worker {i} on h2: no such program")
        return real_start(i, slot, joining)

    driver._start_worker = start
    _discover(driver, clock, "h1:1\nh2:1\nh3:1\n")
    assert not driver.poll()
    assert store[ELASTIC_LAUNCHED_KEY] == 2
    assert store[ELASTIC_LAUNCH_KEY.format(n=1)] == "1" and store[ELASTIC_LAUNCH_KEY.format(n=2)] == "2"
    assert store.get(ELASTIC_DEAD_KEY.format(member=1)) == "1"  # h2's worker: never started
    assert ELASTIC_DEAD_KEY.format(member=2) not in store  # h3's worker runs
    assert sorted(driver.workers) == [0, 2] and driver.blacklist.is_blocked("h2", 1e9)
    assert any("could not start a worker on h2" in s and "blacklisting it" in s for s in said)


# --- the driver's store: only a store that went away is absorbed ------------------------------------

def _driver_on(store, tmp_path):
    cfg = _cfg(["--host-discovery-script", "echo h1:2", "python3", "t.py"], tmp_path)
    return elastic_driver.ElasticDriver(cfg, cfg.elastic, FakeSupervisor(), store, lambda *a: None,
                                        lambda m: None, lambda text: None)


def test_reformations_is_0_before_the_first_and_once_the_store_is_gone(tmp_path):
    store = JobStore("127.0.0.1", 0, os.urandom(32))
    try:
        conn = store.connection()
        driver = _driver_on(conn, tmp_path)
        assert driver.store.reformations() == 0  # nothing published yet
        conn.add(ELASTIC_LATEST_KEY, 3)
        assert driver.store.reformations() == 3
        store._server.close()  # the job shuts down: the store goes away under the driver
        assert driver.store.reformations() == 0 and conn.closed
    finally:
        store.close()


def test_every_store_access_absorbs_only_a_store_that_went_away():
    """The driver's writes (dead, leaving, launched, the announcement of a change) and reads
    (admitted, the last members) let every error through but RendezvousError from a closed
    connection: then a write is warned about and a read answers as before any re-formation."""
    accesses = [lambda es: es.dead(3), lambda es: es.leaving(3), lambda es: es.launched(3),
                lambda es: es.announce("added"), lambda es: es.admitted(3), lambda es: es.latest_members(),
                lambda es: es.reformations()]
    for error in (KeyError("k"), TypeError("bad call"), ValueError("bug"),
                  RendezvousError("the rendezvous store rejected SET: bad key")):  # answered: a bug
        for access in accesses:
            with pytest.raises(type(error)):
                access(ElasticStore(_FailingStore(error), lambda text: None))
    said = []
    gone = ElasticStore(_FailingStore(RendezvousError("the store closed the connection"), closed=True), said.append)
    assert [access(gone) for access in accesses] == [None, None, None, None, False, None, 0]
    assert said == [f"warning: could not write {what} to the job's store: the store closed the connection"
                    for what in (ELASTIC_DEAD_KEY.format(member=3), ELASTIC_LEAVING_KEY.format(member=3),
                                 "the launch of worker 3", "the host change")]


def test_a_store_gone_under_the_driver_is_warned_about_not_raised(tmp_path):
    store = JobStore("127.0.0.1", 0, os.urandom(32))
    said = []
    try:
        conn = store.connection()
        es = ElasticStore(conn, said.append)
        es.dead(1)
        assert conn.check([ELASTIC_DEAD_KEY.format(member=1)]) and not es.admitted(1)
        store._server.close()
        es.dead(2)
        assert not es.admitted(1) and conn.closed
        assert len(said) == 1 and said[0].startswith(
            f"warning: could not write {ELASTIC_DEAD_KEY.format(member=2)} to the job's store: ")
    finally:
        store.close()


class _FailingStore(FakeStore):
    """Every request fails with ``error``."""

    def __init__(self, error, closed=False):
        super().__init__()
        self.error, self.closed = error, closed

    def set(self, key, value):
        raise self.error

    def add(self, key, delta):
        raise self.error

    def get(self, key, default=None, timeout=None):
        raise self.error

    def check(self, keys):
        raise self.error


class _BrokenStore(FakeStore):
    def __init__(self, error):
        super().__init__()
        self.error = error

    def check(self, keys):
        raise self.error


def test_reformations_lets_any_other_error_propagate(tmp_path):
    """Only a store that went away (the client raised RendezvousError and closed its connection)
    reads as "no re-formation"; a bug is not swallowed."""
    for error in (KeyError("accord/elastic/latest"), TypeError("bad call"), RuntimeError("bug")):
        with pytest.raises(type(error)):
            _driver_on(_BrokenStore(error), tmp_path).store.reformations()
        with pytest.raises(type(error)):  # the kind of a removal's announcement reads the store too
            _driver_on(_BrokenStore(error), tmp_path)._removal_kind()
    gone = _BrokenStore(RendezvousError("the store closed the connection"))
    gone.closed = True
    assert _driver_on(gone, tmp_path).store.reformations() == 0
    assert _driver_on(gone, tmp_path)._removal_kind() == "removed"
    store = JobStore("127.0.0.1", 0, os.urandom(32))
    try:  # the store answers, with an error: the connection still works, so it is our bug
        conn = store.connection()
        conn.set(ELASTIC_LATEST_KEY, "not a number")
        with pytest.raises(RendezvousError, match="not a counter"):
            _driver_on(conn, tmp_path).store.reformations()
        assert not conn.closed
    finally:
        store.close()


# --- --blacklist-cooldown-range bounds (horovodrun's: 1 <= MIN, MAX <= 3600) ---------------------------

@pytest.mark.parametrize("low, high, why", [
    ("0", "10", "MIN must be at least 1 second"),
    ("0.5", "10", "MIN must be at least 1 second"),
    ("-1", "10", "MIN must be at least 1 second"),
    ("10", "3601", "MAX must be at most 3600 seconds"),
    ("1", "7200", "MAX must be at most 3600 seconds"),
    ("9", "3", "MAX is below MIN"),
])
def test_cooldown_range_out_of_bounds_exits_2_naming_flag_and_values(low, high, why, capsys):
    argv = ["--host-discovery-script", "echo localhost:2", "--blacklist-cooldown-range", low, high, "python3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == f"accordrun: error: --blacklist-cooldown-range {float(low):g} {float(high):g}: {why}" \
        + (" (as in horovodrun)" if "MIN must" in why else " (one hour, as in horovodrun)" if "MAX must" in why else "")
    assert lines[1].startswith("HINT: pass MIN MAX with 1 <= MIN <= MAX <= 3600 seconds"), err
    with_fixed_hosts = ["-np", "2", "--min-np", "2", "-H", "h1:1,h2:1", "--blacklist-cooldown-range", low, high,
                        "python3"]
    assert main(with_fixed_hosts) == 2 and why in capsys.readouterr().err


@pytest.mark.parametrize("low, high", [("1", "3600"), ("1", "1"), ("3600", "3600"), ("1.5", "2")])
def test_cooldown_range_at_the_bounds_is_accepted(low, high, tmp_path):
    cfg = _cfg(["--host-discovery-script", "echo h1:2", "--blacklist-cooldown-range", low, high,
                "python3", "t.py"], tmp_path)
    assert cfg.elastic.cooldown_range == (float(low), float(high))


# --- the place a worker added later starts with ----------------------------------------------------

@pytest.mark.parametrize("hostnames", [["a"], ["a", "a", "b", "b"], ["a", "b", "a"], ["b", "a", "c", "a", "b"],
                                       ["a", "b", "b", "c", "a", "a"]])
def test_planned_slots_match_what_init_derives_from_the_host_names(hostnames):
    slots = planned_slots(hostnames)
    for rank, slot in enumerate(slots):
        topo = topology_from_hostnames(rank, hostnames)
        assert (slot.rank, slot.size, slot.local_rank, slot.local_size, slot.cross_rank, slot.cross_size) == \
            (topo.rank, topo.size, topo.local_rank, topo.local_size, topo.cross_rank, topo.cross_size)
        assert slot.hostname == hostnames[rank]
        assert slot.host_index == list(dict.fromkeys(hostnames)).index(hostnames[rank])


def test_planned_slots_of_hosts_in_order_are_the_launch_assignment():
    assert planned_slots(["h1", "h1", "h2", "h2", "h3"]) == assign_slots(
        [HostSlots("h1", 2), HostSlots("h2", 2), HostSlots("h3", 1)], 5)


def _coords(slot):
    return (slot.rank, slot.size, slot.local_rank, slot.local_size, slot.cross_rank, slot.cross_size,
            slot.hostname, slot.host_index)


def test_a_worker_added_to_a_growing_job_starts_with_its_rank_in_the_grown_job(tmp_path):
    driver, sup, store, members, started, said, clock = _driver(tmp_path)
    _discover(driver, clock, "h1:2\nh2:2\n")
    assert not driver.poll()
    assert started[2:] == [(2, "h2", True), (3, "h2", True)]
    # both of h2's workers join at one re-formation: 4 ranks, h2 the second host
    assert _coords(members[2].slot) == (2, 4, 0, 2, 1, 2, "h2", 1)
    assert _coords(members[3].slot) == (3, 4, 1, 2, 1, 2, "h2", 1)
    assert any("started worker 3 on h2 (rank 3 of 4 once admitted)" in s for s in said)


def test_a_replacement_worker_starts_with_the_rank_of_the_re_formed_job_not_its_id(tmp_path):
    """Worker 1 fails, its host comes back after the cooldown: its replacement, worker 2, will
    be rank 1 of 2 (the survivor, then it), as horovodrun starts it; its id would say 2 of 3."""
    driver, sup, store, members, started, said, clock = _driver(
        tmp_path, hosts="echo h1:1; echo h2:1", min_np=1, cooldown_range=(1.0, 1.0))
    members[1].returncode = 1
    sup.ended.append(members[1])
    driver.poll()
    _publish(store, 1, [0])  # the survivor re-formed alone
    clock[0] = 2.0
    _discover(driver, clock, "h1:1\nh2:1\n")
    driver.poll()
    assert started[-1] == (2, "h2", True)
    assert _coords(members[2].slot) == (1, 2, 0, 1, 1, 2, "h2", 1)


def test_joiners_come_after_the_staying_members_in_the_published_order(tmp_path):
    """The last re-formation's order counts (a worker admitted late comes after one admitted
    earlier), members that leave drop out, and workers still waiting to join come first among
    the new ones; a change that removes and adds is announced as "added", so that the workers
    do not skip the state's sync that the new ones wait in."""
    driver, sup, store, members, started, said, clock = _driver(tmp_path, hosts="echo h1:1", min_np=1)
    _discover(driver, clock, "h1:1\nh2:1\nh3:1\n")
    driver.poll()
    assert [_coords(members[i].slot)[:2] for i in (1, 2)] == [(1, 3), (2, 3)]
    _publish(store, 1, [0, 2, 1])  # worker 1 asked to join late: admitted after worker 2
    _discover(driver, clock, "h1:1\nh3:1\nh4:1\nh5:1\n")  # h2 leaves, h4 and h5 come
    updates = store.get(ELASTIC_UPDATES_KEY, 0)
    driver.poll()
    assert store[ELASTIC_LEAVING_KEY.format(member=1)] == "1"
    assert _coords(members[3].slot) == (2, 4, 0, 1, 2, 4, "h4", 2)  # after 0 (h1) and 2 (h3)
    assert _coords(members[4].slot) == (3, 4, 0, 1, 3, 4, "h5", 3)
    assert store[ELASTIC_UPDATES_KEY] == updates + 1
    assert store[ELASTIC_UPDATE_KEY.format(n=updates + 1)] == "added"
    _discover(driver, clock, "h1:1\nh3:1\nh5:1\n")  # h4 leaves before its worker 3 was admitted
    driver.poll()
    assert store[ELASTIC_UPDATE_KEY.format(n=updates + 2)] == "added"  # worker 4 still waits to join


def test_a_failure_on_the_only_host_keeps_the_survivor_that_min_np_needs(tmp_path):
    """Blacklisting the host does not stop the worker still running there when without it fewer
    than --min-np would run: the job goes on, and no new worker starts there meanwhile."""
    driver, sup, store, members, started, said, clock = _driver(tmp_path, hosts="echo h1:2", min_np=1,
                                                                cooldown_range=(5.0, 10.0))
    members[1].returncode = 3
    sup.ended.append(members[1])
    assert not driver.poll()  # h1, the only host, is blacklisted: worker 0 goes on there
    assert driver.outcome.lost == [("failure", 1)] and not driver.outcome.failures
    assert ELASTIC_LEAVING_KEY.format(member=0) not in store and store[ELASTIC_DEAD_KEY.format(member=1)] == "1"
    assert any("keeping workers [0] on h1 although it is blacklisted: without them 0 workers would run, "
               "fewer than --min-np 1" in s for s in said), said
    assert not any("every host of the job is blacklisted" in s for s in said)
    _discover(driver, clock, "h1:2\n")
    clock[0] = 9.0
    assert not driver.poll() and len(started) == 2  # still blacklisted: no worker added
    clock[0] = 10.5  # its cooldown (5 * 2 + jitter, capped at 10 s) is over: h1 gets a new worker
    _discover(driver, clock, "h1:2\n")
    assert not driver.poll() and started[2:] == [(2, "h1", True)]
    assert ELASTIC_LEAVING_KEY.format(member=0) not in store


def test_repeated_failures_on_the_only_host_end_the_job_with_its_last_worker(tmp_path):
    """Without a cooldown the host stays blacklisted: the kept worker goes on alone, and when
    it fails too no worker is left and nothing can start, so the job fails at once (horovodrun)."""
    driver, sup, store, members, started, said, clock = _driver(tmp_path, hosts="echo h1:2", min_np=1)
    members[1].returncode = 3
    sup.ended.append(members[1])
    assert not driver.poll() and driver.outcome.lost == [("failure", 1)]
    members[0].returncode = 3
    sup.ended.append(members[0])
    assert driver.poll()
    assert driver.outcome.failures == [("failure", 1), ("failure", 0)] and not driver.outcome.lost
    assert any("every host of the job is blacklisted after failures" in s for s in said)
    assert len(started) == 2


def test_a_failure_keeps_the_host_mates_only_where_min_np_needs_them(tmp_path):
    """h1:2 + h2:1, --min-np 2: after a failure on h1 only 1 worker runs elsewhere, so h1's
    other worker stays. --min-np 1: h2's worker is enough, so h1's leaves (as in horovodrun);
    --min-np 3: even with it the job is below, so it leaves too (the job waits for hosts)."""
    for min_np, leaves in ((2, False), (1, True), (3, True)):
        driver, sup, store, members, started, said, clock = _driver(tmp_path, hosts="echo h1:2; echo h2:1",
                                                                    min_np=min_np)
        members[0].returncode = 3
        sup.ended.append(members[0])
        assert not driver.poll()
        assert (ELASTIC_LEAVING_KEY.format(member=1) in store) == leaves, (min_np, said)
        assert ELASTIC_LEAVING_KEY.format(member=2) not in store


def test_driver_stops_at_once_when_failures_blacklisted_every_host(tmp_path):
    """A host left usable keeps the job going."""
    driver, sup, store, members, started, said, clock = _driver(tmp_path, hosts="echo h1:1; echo h2:1", min_np=1)
    members[1].returncode = 3
    sup.ended.append(members[1])
    assert not driver.poll() and driver.outcome.lost == [("failure", 1)]  # h1's worker goes on
    _discover(driver, clock, "h1:1\nh2:1\nh3:1\n")
    members[0].returncode = 3
    sup.ended.append(members[0])
    assert not driver.poll()  # h3 is usable: a worker starts there instead
    assert started[-1] == (2, "h3", True)
