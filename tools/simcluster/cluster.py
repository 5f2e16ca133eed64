"""A simulated cluster on one Linux machine: hosts = network + UTS + mount namespaces with sshd.

Each host ``hN`` is a network namespace (its own address on a shared bridge, its own ports),
entered by an ``sshd`` that also has its own hostname (UTS namespace) and a private mount
namespace with its own ``/tmp``, ``/dev/shm`` and ``/run``. Everything sshd starts (ssh sessions,
workers, their children) lives in those namespaces, so a host's processes, files in ``/tmp`` and
shared memory are invisible to the others, as on real machines; the code, the venv and
:attr:`Cluster.shared` (a folder under ``/var/tmp``) are seen by every host, like a cluster's
shared home. Hosts resolve each other by name through ``/etc/netns/<ns>/hosts``.

Example::

    with Cluster(hosts=2, rate="1gbit") as cluster:
        out = cluster.run("h1", ["ssh", "h2", "hostname"])   # "h2"

Commands given to :meth:`Cluster.popen` / :meth:`Cluster.run` run inside a host through
``nsenter`` (the launcher of a test runs inside ``h1``, as on a cluster's login node).
Teardown kills every process in the cluster's namespaces and deletes everything it created;
a run killed before its teardown is reaped by the next one (:func:`naming.reap_stale`).
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from . import naming, network, ssh_setup

# Variables of an enclosing job or launcher that must not leak into the cluster's commands.
_DROPPED_PREFIXES = ("ACCORD_", "HOROVOD_", "DMLC_", "OMPI_", "PMIX_", "PMI_", "MASTER_", "SLURM_")
_DROPPED_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


@dataclass
class Host:
    """One simulated host."""

    name: str
    index: int
    netns: str
    address: str
    proc: subprocess.Popen[bytes] | None = None  # its sshd (the anchor of its namespaces)

    @property
    def pid(self) -> int:
        """The sshd's pid: ``nsenter --target`` enters the host through it."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"simulated host {self.name} is not running")
        return self.proc.pid


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket inside a host."""

    address: str
    port: int
    pid: int | None
    command: str

    def __str__(self) -> str:
        return f"{self.address}:{self.port} (pid {self.pid}: {self.command})"


def missing_prerequisites() -> str | None:
    """Why a cluster cannot be built here (for a test's skip reason), or None."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces, mounts)"
    for tool in ("ip", "tc", "nsenter", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup_env.sh installs iproute2 and openssh)"
    if not os.access(ssh_setup.SSHD, os.X_OK):
        return f"{ssh_setup.SSHD} is not installed (scripts/setup_env.sh installs openssh-server)"
    # every host gets its own /tmp and /dev/shm: code and venv there would be invisible to them
    code = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    if any(code == d or code.startswith(d + "/") for d in ("/tmp", "/dev/shm")):
        return (f"the repository is under {code!r}, and every simulated host has a private /tmp and "
                "/dev/shm; clone it elsewhere (e.g. /var/tmp or your home) to run the cluster tests")
    probe = f"{naming.PREFIX}-{os.getpid()}-probe"
    out = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return f"cannot create network namespaces here: {out.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


class Cluster:
    """N simulated hosts ``h1..hN`` on one bridge (see the module docstring).

    Args:
        hosts: how many hosts to start (more can be added with :meth:`add_host`).
        rate: every link's limit each way, e.g. ``"1gbit"``; None for unlimited.
        ssh_port: the port every host's sshd listens on (clients then need ``ssh -p``).
    """

    def __init__(self, hosts: int = 2, rate: str | None = None, ssh_port: int = 22) -> None:
        self.tag = naming.new_tag()
        self.run_dir = os.path.join(naming.RUN_ROOT, self.tag)
        self.keys = os.path.join(self.run_dir, "ssh")
        self.shared = os.path.join(self.run_dir, "shared")
        self.switch = f"{self.tag}-sw"
        self.hosts: dict[str, Host] = {}
        self._initial = hosts
        self._rate = network.parse_rate(rate)
        self.ssh_port = ssh_port
        self._started = False

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "Cluster":
        """Reap dead runs' leftovers, then build the switch and the hosts."""
        naming.reap_stale()
        os.makedirs(self.run_dir, mode=0o755)
        naming.write_owner(self.run_dir)
        self._started = True
        try:
            os.makedirs(self.shared, mode=0o777)
            ssh_setup.generate_keys(self.keys)
            ssh_setup.write_configs(self.keys)
            network.create_switch(self.switch)
            for _ in range(self._initial):
                self.add_host()
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> "Cluster":
        return self if self._started else self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process on every host and delete everything the cluster created."""
        if not self._started:
            return
        for host in self.hosts.values():
            naming.delete_netns(host.netns)
            if host.proc is not None:
                host.proc.wait()
        naming.delete_netns(self.switch)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        try:  # /etc/netns itself, once no cluster (nor anything else) uses it
            os.rmdir(naming.ETC_NETNS)
        except OSError:
            pass
        self._started = False

    # --- hosts -----------------------------------------------------------------------------------
    def add_host(self, name: str | None = None) -> Host:
        """Create and start one more host (default name ``h<index>``); every host can reach it."""
        index = len(self.hosts) + 1
        name = name or f"h{index}"
        if name in self.hosts:
            raise ValueError(f"host {name} exists already")
        host = Host(name, index, f"{self.tag}-{name}", network.address(index))
        self.hosts[name] = host
        network.create_host_netns(host.netns, self.switch, index)
        network.set_rate(host.netns, self.switch, index, self._rate)
        self._write_names()
        self.start_host(name)
        return host

    def _write_names(self) -> None:
        table = [(h.name, h.address) for h in self.hosts.values()]
        text = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
        text += "".join(f"{addr} {name}\n" for name, addr in table)
        for host in self.hosts.values():
            folder = os.path.join(naming.ETC_NETNS, host.netns)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "hosts"), "w", encoding="ascii") as fh:  # in place
                fh.write(text)
        ssh_setup.write_known_hosts(self.keys, table)

    def start_host(self, name: str, timeout: float = 10.0) -> Host:
        """(Re)start ``name``'s sshd in fresh UTS and mount namespaces, its cable plugged in."""
        host = self.hosts[name]
        network.set_plugged(self.switch, host.index, True)
        if host.proc is not None and host.proc.poll() is None:
            return host
        script = "\n".join([
            "set -e",
            f"hostname {host.name}",
            "mount -t tmpfs -o mode=1777 accsim-tmp /tmp",
            "mount -t tmpfs -o mode=1777 accsim-shm /dev/shm",
            "mount -t tmpfs -o mode=755 accsim-run /run",  # a host's own /run (sshd's privsep dir)
            "mkdir -p /run/sshd",
            f"mount --bind {shlex.quote(self.keys)}/ssh_config /etc/ssh/ssh_config",
            f"exec {ssh_setup.SSHD} -D -e -f {shlex.quote(self.keys)}/sshd_config "
            f"-o ListenAddress={host.address}:{self.ssh_port}",
        ])
        log = open(os.path.join(self.run_dir, f"sshd-{host.name}.log"), "ab")
        with log:
            host.proc = subprocess.Popen(
                ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount", "--propagation",
                 "private", "sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not any(lis.port == self.ssh_port for lis in self.listening(name, owners=False)):
            if host.proc.poll() is not None or time.monotonic() > deadline:
                with open(log.name, encoding="utf-8", errors="replace") as fh:
                    tail = fh.read()[-2000:]
                self.stop_host(name)
                raise RuntimeError(f"simulated host {name}: sshd did not start: {tail}")
            time.sleep(0.02)
        return host

    def stop_host(self, name: str, unplug: bool = False) -> None:
        """Host ``name`` goes down: every process on it is killed (sshd too). With ``unplug``,
        its cable is pulled as well, so packets to it vanish (connections time out instead of
        being refused)."""
        host = self.hosts[name]
        naming.kill_netns_processes(host.netns)
        if host.proc is not None:
            host.proc.wait()
        if unplug:
            network.set_plugged(self.switch, host.index, False)

    def set_rate(self, rate: str | None, names: Sequence[str] | None = None) -> None:
        """Change the link limit of ``names`` (default every host); None for unlimited."""
        bits = network.parse_rate(rate)
        for name in names or list(self.hosts):
            host = self.hosts[name]
            network.set_rate(host.netns, self.switch, host.index, bits)
        if names is None:
            self._rate = bits

    # --- commands --------------------------------------------------------------------------------
    @staticmethod
    def env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment without any job's variables, plus ``extra``."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(_DROPPED_PREFIXES) and k not in _DROPPED_NAMES}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env

    def command(self, name: str, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """``argv`` wrapped to run inside host ``name`` (its network, hostname and mounts)."""
        return ["nsenter", f"--target={self.hosts[name].pid}", "--net", "--uts", "--mount",
                f"--wd={cwd or os.getcwd()}", "--", *argv]

    def popen(self, name: str, argv: Sequence[str], *, cwd: str | None = None,
              env: Mapping[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` on host ``name`` (environment: :meth:`env` unless given)."""
        return subprocess.Popen(self.command(name, argv, cwd), env=dict(env or self.env()), **kwargs)

    def run(self, name: str, argv: Sequence[str], *, timeout: float = 60.0, cwd: str | None = None,
            env: Mapping[str, str] | None = None, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on host ``name`` to completion; output captured as text. On timeout the
        process is killed and :class:`subprocess.TimeoutExpired` raised."""
        return subprocess.run(self.command(name, argv, cwd), env=dict(env or self.env()), input=input,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def write_rsh_agent(self, path: str, names: Sequence[str] | None = None) -> str:
        """Write a stand-in for the MPI Operator's ``kubexec.sh`` at ``path``: ``agent HOST ARGS...``
        runs ARGS, joined into one command (``sh -c "$*"``, as kubexec.sh), inside HOST's namespaces
        through nsenter (no ssh), stdin passed through; a host not in ``names`` (default all) is
        refused. Returns ``path``. The pids it names are the hosts' of now: write it again after
        :meth:`start_host`."""
        cases = "".join(f"  {shlex.quote(name)}) pid={self.hosts[name].pid} ;;\n" for name in names or self.hosts)
        with open(path, "w", encoding="ascii") as fh:
            fh.write("#!/bin/sh\nhost=$1; shift\ncase $host in\n" + cases +
                     "  *) echo \"kubexec: no pod $host\" >&2; exit 1 ;;\nesac\n"
                     "exec nsenter --target=$pid --net --uts --mount -- sh -c \"$*\"\n")
        os.chmod(path, 0o755)
        return path

    # --- inspection ------------------------------------------------------------------------------
    def processes(self, name: str) -> list[tuple[int, str]]:
        """``(pid, command line)`` of every process on host ``name`` except its sshd."""
        host = self.hosts[name]
        anchor = host.proc.pid if host.proc is not None else None
        return [(pid, _cmdline(pid)) for pid in naming.netns_pids(host.netns) if pid != anchor]

    def wait_idle(self, names: Sequence[str] | None = None, timeout: float = 10.0) -> dict[str, list[tuple[int, str]]]:
        """Wait until nothing but sshd runs on ``names`` (default all); return what is left."""
        deadline = time.monotonic() + timeout
        while True:
            left = {n: p for n in (names or list(self.hosts)) if (p := self.processes(n))}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def listening(self, name: str, owners: bool = True) -> list[Listener]:
        """Every listening TCP socket on host ``name`` (IPv4 and IPv6), with its owner when
        ``owners``."""
        host = self.hosts[name]
        anchor = host.proc.pid if host.proc is not None else None
        found: list[tuple[str, int, str]] = []
        for table, width in (("tcp", 8), ("tcp6", 32)):
            try:
                with open(f"/proc/{anchor}/net/{table}", encoding="ascii") as fh:
                    rows = fh.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                if cols[3] == "0A":  # LISTEN
                    addr, port = cols[1].split(":")
                    found.append((_address(addr, width), int(port, 16), cols[9]))
        inodes = _socket_owners(naming.netns_pids(host.netns)) if owners else {}
        return [Listener(a, p, *inodes.get(i, (None, ""))) for a, p, i in found]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _address(hexaddr: str, width: int) -> str:
    raw = bytes.fromhex(hexaddr)
    if width == 8:
        return ".".join(str(b) for b in reversed(raw))
    import ipaddress

    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]  # four little-endian 32-bit words
    return str(ipaddress.IPv6Address(b"".join(words)))


def _socket_owners(pids: Sequence[int]) -> dict[str, tuple[int, str]]:
    owners: dict[str, tuple[int, str]] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                owners.setdefault(link[8:-1], (pid, _cmdline(pid)))
    return owners


def terminate(proc: subprocess.Popen[Any], timeout: float = 5.0) -> None:
    """Stop a command started with :meth:`Cluster.popen` (SIGTERM, then SIGKILL)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
