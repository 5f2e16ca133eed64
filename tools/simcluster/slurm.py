"""SLURM on a simulated cluster: one ``munged``, a ``slurmctld`` on the first host, a ``slurmd`` per host.

Debian's ``slurm-wlm`` and ``munge``; everything they write lives under the cluster's run folder
(``<run_dir>/slurm``), so :meth:`Cluster.close` removes it. The daemons run inside the hosts'
namespaces (started through :meth:`Cluster.popen`), so closing the cluster also kills them.

* **munge**: one ``munged`` (in the first host) with a key made for this run; its socket is a
  path in the run folder, which every host sees (a Unix socket bound to a path is reached
  through the file system, whatever the network namespace). ``AuthInfo=socket=...`` points
  SLURM's ``auth/munge`` at it.
* **slurm.conf**: ``NodeName`` = the simulated host names, ``NodeAddr`` = their addresses;
  ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``, no cgroups, no accounting;
  ``SlurmUser``/``SlurmdUser`` root. Each host has a private ``/run``, so the spool and pid files
  of every ``slurmd`` are named after its node (``%n``) in the shared run folder.
* ``SlurmdParameters=config_overrides``: every simulated host sees the whole machine's CPUs,
  and the configured count (``cpus``) is what the controller schedules with.
* ``cgroup.conf`` names ``CgroupPlugin=cgroup/v1`` (see :data:`CGROUP_CONF`): SLURM's cgroup
  features are not available on simulated hosts.

Example::

    with Cluster(hosts=2) as cluster, Slurm(cluster) as slurm:
        out = cluster.run("h1", ["srun", "-N2", "hostname"], env=slurm.env())
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from typing import Any, Mapping

from .cluster import Cluster, terminate

PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "squeue")
# slurmd 22.05 loads its cgroup plugin whatever the proctrack and task plugins; "autodetect"
# fails in a host, whose /sys is the fresh sysfs of `ip netns exec` (an empty /sys/fs/cgroup).
# Named explicitly, cgroup/v1 loads, and with proctrack/linuxproc and task/none nothing asks
# it for a cgroup.
CGROUP_CONF = "CgroupPlugin=cgroup/v1\n"
_SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _which(name: str) -> str | None:
    return shutil.which(name) or next((os.path.join(d, name) for d in _SBIN
                                       if os.access(os.path.join(d, name), os.X_OK)), None)


def missing_slurm() -> str | None:
    """Why SLURM cannot run on a simulated cluster here (for a test's skip reason), or None."""
    for name in PROGRAMS:
        if _which(name) is None:
            return f"{name} is not installed (scripts/setup_env.sh installs slurm-wlm and munge)"
    return None


def _conf(cluster: Cluster, folder: str, socket: str, cpus: int) -> str:
    hosts = list(cluster.hosts.values())
    controller = hosts[0]
    lines = [
        "ClusterName=accsim",
        f"SlurmctldHost={controller.name}({controller.address})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={socket}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool-%n",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log",
        f"SlurmdLogFile={folder}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "KillWait=2",
        "InactiveLimit=0",
        "MinJobAge=2",
        "MailProg=/bin/true",
    ]
    lines += [f"NodeName={h.name} NodeHostname={h.name} NodeAddr={h.address} CPUs={cpus} State=UNKNOWN"
              for h in hosts]
    lines.append(f"PartitionName=sim Nodes={','.join(h.name for h in hosts)} Default=YES "
                 "MaxTime=INFINITE State=UP OverSubscribe=YES")
    return "\n".join(lines) + "\n"


class Slurm:
    """The SLURM daemons of one :class:`Cluster` (see the module docstring).

    Args:
        cluster: a started cluster; its hosts at :meth:`start` are SLURM's nodes.
        cpus: the CPUs each node is configured with (how many tasks fit on it).
    """

    def __init__(self, cluster: Cluster, cpus: int = 4) -> None:
        self.cluster = cluster
        self.cpus = cpus
        self.folder = os.path.join(cluster.run_dir, "slurm")
        self.conf = os.path.join(self.folder, "slurm.conf")
        self.socket = os.path.join(self.folder, "munge", "munge.socket")
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The cluster's clean environment plus ``SLURM_CONF`` (where srun finds the controller)."""
        return self.cluster.env({"SLURM_CONF": self.conf, **(extra or {})})

    def start(self, timeout: float = 30.0) -> "Slurm":
        """Write the configuration, start munged, slurmctld and every slurmd; wait until every
        node is idle.

        Raises:
            RuntimeError: a daemon ended or the nodes did not come up in ``timeout``; the
                message carries the daemons' log tails.
        """
        try:
            self._start(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, timeout: float) -> None:
        munge_dir = os.path.dirname(self.socket)
        os.makedirs(munge_dir, mode=0o755)
        os.makedirs(os.path.join(self.folder, "state"), mode=0o700)
        key = os.path.join(self.folder, "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(1024))
        with open(self.conf, "w", encoding="ascii") as fh:
            fh.write(_conf(self.cluster, self.folder, self.socket, self.cpus))
        with open(os.path.join(self.folder, "cgroup.conf"), "w", encoding="ascii") as fh:
            fh.write(CGROUP_CONF)
        for name in self.cluster.hosts:
            os.makedirs(os.path.join(self.folder, f"spool-{name}"), mode=0o755)
        first = next(iter(self.cluster.hosts))
        self._daemon(first, "munged", [_which("munged"), "-F", "--force", f"--socket={self.socket}",
                                       f"--key-file={key}", f"--pid-file={self.folder}/munged.pid",
                                       f"--log-file={self.folder}/munged.log",
                                       f"--seed-file={self.folder}/munged.seed"])
        self._wait(lambda: os.path.exists(self.socket), timeout, "munged's socket")
        self._daemon(first, "slurmctld", [_which("slurmctld"), "-D", "-f", self.conf])
        for name in self.cluster.hosts:
            self._daemon(name, "slurmd", [_which("slurmd"), "-D", "-N", name, "-f", self.conf])
        self._wait(self._all_idle, timeout, "every node idle in sinfo")

    def _daemon(self, host: str, what: str, argv: list[Any]) -> None:
        log = open(os.path.join(self.folder, f"{what}-{host}.out"), "ab")
        with log:
            proc = self.cluster.popen(host, [str(a) for a in argv], env=self.env(), cwd=self.folder,
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      start_new_session=True)
        self._procs.append((f"{what} on {host}", proc))

    def _all_idle(self) -> bool:
        out = self.cluster.run(next(iter(self.cluster.hosts)),
                               [_which("sinfo"), "-h", "-N", "-o", "%N %t"], env=self.env(), timeout=10)
        states = dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)
        return out.returncode == 0 and set(states) == set(self.cluster.hosts) \
            and all(s == "idle" for s in states.values())

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            ended = [name for name, proc in self._procs if proc.poll() is not None]
            if ended or time.monotonic() > deadline:
                raise RuntimeError(f"SLURM on the simulated cluster: no {what} within {timeout:g}s"
                                   f"{' (ended: ' + ', '.join(ended) + ')' if ended else ''}\n{self.logs()}")
            time.sleep(0.1)

    def logs(self, tail: int = 1500) -> str:
        """The last ``tail`` characters of every daemon's log."""
        parts = []
        for name in sorted(os.listdir(self.folder)) if os.path.isdir(self.folder) else ():
            if name.endswith((".log", ".out")):
                with open(os.path.join(self.folder, name), encoding="utf-8", errors="replace") as fh:
                    parts.append(f"--- {name}\n{fh.read()[-tail:]}")
        return "\n".join(parts)

    def close(self) -> None:
        """Stop every daemon (slurmd first) and delete the SLURM folder."""
        for _, proc in reversed(self._procs):
            terminate(proc)
        self._procs.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "Slurm":
        return self.start() if not self._procs else self

    def __exit__(self, *exc: Any) -> None:
        self.close()
