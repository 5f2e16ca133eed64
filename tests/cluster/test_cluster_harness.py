"""The simulated cluster itself: own hostnames, names that resolve, private /tmp and /dev/shm,
ssh between hosts, rate limits, and leftovers of a SIGKILLed owner reaped by the next run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.cluster_jobs import REPO
from simcluster import leftovers, reap_stale

pytestmark = pytest.mark.timeout(60)


def test_hosts_are_separate_machines(cluster):
    res = cluster.run("h1", ["sh", "-c", "hostname; echo 1 > /tmp/only-h1; echo 1 > /dev/shm/only-h1; "
                                         "ssh h2 'hostname; ls /tmp/only-h1 /dev/shm/only-h1 2>&1; "
                                         "getent hosts h1'"])
    lines = res.stdout.splitlines()
    assert res.returncode != 0 or lines  # ls fails on h2: the files exist on h1 only
    assert lines[0] == "h1" and lines[1] == "h2", res
    assert "No such file" in lines[2] and "No such file" in lines[3], res
    assert lines[4].split() == ["10.77.0.1", "h1"], res
    assert not os.path.exists("/tmp/only-h1") and not os.path.exists("/dev/shm/only-h1")
    cluster.run("h1", ["rm", "-f", "/tmp/only-h1", "/dev/shm/only-h1"])


def test_a_host_added_later_is_reachable_by_name(make_cluster):
    cluster = make_cluster(hosts=2)
    cluster.add_host()
    res = cluster.run("h1", ["ssh", "h3", "hostname; getent hosts h2"])
    assert res.returncode == 0 and res.stdout.split() == ["h3", "10.77.0.2", "h2"], res
    cluster.stop_host("h3", unplug=True)  # unplugged: ssh times out instead of being refused
    res = cluster.run("h1", ["ssh", "-o", "ConnectTimeout=1", "h3", "true"])
    assert res.returncode == 255 and "timed out" in res.stderr, res
    cluster.start_host("h3")
    assert cluster.run("h1", ["ssh", "h3", "true"]).returncode == 0


def test_rate_limit_is_set_on_both_ends_of_each_link(cluster):
    try:
        cluster.set_rate("1gbit")
        for host in cluster.hosts.values():
            for ns, dev in ((host.netns, "eth0"), (cluster.switch, f"v{host.index}")):
                shown = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev],
                                       capture_output=True, text=True).stdout
                assert "tbf" in shown and "rate 1Gbit" in shown, shown
    finally:
        cluster.set_rate("10gbit")


def test_a_killed_owner_is_reaped_by_the_next_run():
    """sim_cluster.py SIGKILLed: its namespaces, sshd processes and folders stay until the next
    run's reaping removes them (live clusters, such as this session's, are left alone)."""
    from simcluster import missing_prerequisites

    reason = missing_prerequisites()
    if reason:
        pytest.skip(reason)
    owner = subprocess.Popen([sys.executable, str(REPO / "scripts" / "sim_cluster.py"), "-n", "2", "--",
                              "sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prefix = f"accsim-{owner.pid}-"
    deadline = time.monotonic() + 30
    while True:
        mine = {tag: names for tag, names in leftovers().items() if tag.startswith(prefix)}
        if any(len(names) == 3 for names in mine.values()):  # switch + 2 hosts
            break
        assert time.monotonic() < deadline and owner.poll() is None, "the cluster did not come up"
        time.sleep(0.1)
    (tag, names), = mine.items()
    while len(sshd := _pids(names)) < 3:  # two sshd and the sleep
        assert time.monotonic() < deadline, sshd
        time.sleep(0.1)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert tag in leftovers()  # nothing cleaned it up yet
    others = [t for t in leftovers() if t != tag]
    assert tag in reap_stale()
    assert tag not in leftovers() and all(t in leftovers() for t in others)
    assert not os.path.exists(f"/var/tmp/{tag}")
    assert not any(os.path.exists(f"/etc/netns/{n}") for n in names)
    assert not [pid for pid in sshd if _running(pid)], "processes of the dead run survived"


def _pids(namespaces: list[str]) -> list[int]:
    return [int(p) for n in namespaces
            for p in subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True).stdout.split()]


def _running(pid: int) -> bool:
    try:  # a zombie (killed, not yet collected by whoever inherited it) is not running
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
