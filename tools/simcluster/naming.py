"""Names of one simulated cluster's global objects, and reaping the leftovers of dead runs.

Everything a cluster creates outside its own processes carries one tag,
``accsim-<owner pid>-<random>``: the network namespaces (``<tag>-h1``, ``<tag>-sw``), their
``/etc/netns/<ns>`` folders, and the run folder ``/var/tmp/<tag>`` (keys, sshd configs, the
shared folder). The run folder records the owner's pid and start time, so that a later run can
tell a live cluster (leave it alone) from the remains of one whose owner was SIGKILLed (reap it).
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import time

PREFIX = "accsim"
RUN_ROOT = "/var/tmp"
NETNS_DIR = "/run/netns"
ETC_NETNS = "/etc/netns"
_TAG = re.compile(rf"^({PREFIX}-(\d+)-[0-9a-f]+)(?:-[A-Za-z0-9]+)?$")


def new_tag() -> str:
    """A tag unique to this run: the owner's pid (for reaping) and a random part."""
    return f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[19]
    except (OSError, IndexError):
        return None


def write_owner(run_dir: str) -> None:
    """Record this process as the owner of ``run_dir``'s cluster."""
    with open(os.path.join(run_dir, "owner"), "w", encoding="ascii") as fh:
        fh.write(f"{os.getpid()} {start_time(os.getpid())}\n")


def _owner_alive(tag: str, pid: int) -> bool:
    started = start_time(pid)
    if started is None:
        return False
    try:
        with open(os.path.join(RUN_ROOT, tag, "owner"), encoding="ascii") as fh:
            _, recorded = fh.read().split()
    except (OSError, ValueError):
        # no owner file: the run is still being set up, or was killed before writing it;
        # a live pid decides (a reused pid only delays the reaping to a later run)
        return True
    return recorded == started


def netns_pids(netns: str) -> list[int]:
    """Processes whose network namespace is ``netns`` (``ip netns pids``)."""
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def kill_netns_processes(netns: str, timeout: float = 5.0) -> None:
    """SIGKILL every process in ``netns`` and wait until they are gone."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [p for p in netns_pids(netns) if p != os.getpid()]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def delete_netns(netns: str) -> None:
    """Kill what runs in ``netns``, delete it and its /etc/netns folder (each step idempotent)."""
    if os.path.exists(os.path.join(NETNS_DIR, netns)):
        kill_netns_processes(netns)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
    shutil.rmtree(os.path.join(ETC_NETNS, netns), ignore_errors=True)


def _listing(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def leftovers() -> dict[str, list[str]]:
    """Every tag found on this machine -> its namespaces (live runs included)."""
    found: dict[str, list[str]] = {}
    for folder in (NETNS_DIR, ETC_NETNS, RUN_ROOT):
        for name in _listing(folder):
            match = _TAG.match(name)
            if match:
                names = found.setdefault(match.group(1), [])
                if folder != RUN_ROOT and name not in names:
                    names.append(name)
    return found


def reap_stale() -> list[str]:
    """Remove everything left by clusters whose owner process is dead; return their tags.

    Live clusters (another test run, a hand-started one) are left alone.
    """
    reaped = []
    for tag, namespaces in leftovers().items():
        pid = int(tag.split("-")[1])
        if _owner_alive(tag, pid):
            continue
        for netns in namespaces:
            delete_netns(netns)
        shutil.rmtree(os.path.join(RUN_ROOT, tag), ignore_errors=True)
        reaped.append(tag)
    return reaped
