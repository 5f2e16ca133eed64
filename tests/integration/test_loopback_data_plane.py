"""One host, loopback only: when every rank runs on one host, nothing of the
data plane listens beyond 127.0.0.1, even when the host name resolves to a LAN address.

The job runs in private namespaces (``unshare --mount --net --uts``): its own host name, its own
network with a second address on it, and its own /etc/hosts (a bind mount, private to the mount
namespace) that maps the host name to that address, which is what Gloo binds when left to
itself. Everything is gone when the job ends: the namespaces die with their last process."""
from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "launcher_testlib", Path(__file__).parent / "scripts" / "launcher_testlib.py")
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

pytestmark = pytest.mark.timeout(90)

LAN = "10.77.0.1"
HOST = "accord-lan-host"


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "--net", "--uts", "--fork", "true"],
                           capture_output=True, timeout=10)
    return probe.returncode == 0


@pytest.mark.skipif(not _namespaces_work(), reason="needs unshare --mount --net --uts (root)")
def test_a_single_host_job_listens_on_loopback_only(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{LAN} {HOST}\n")
    etc_hosts_before = Path("/etc/hosts").read_bytes()
    hostname_before = socket.gethostname()
    script = f"""
set -e
mount --make-rprivate /
ip link set lo up
ip addr add {LAN}/24 dev lo
hostname {HOST}
mount --bind {hosts} /etc/hosts
getent hosts {HOST}
exec "$@"
"""
    env = lib.cli_env(ACCORD_CPU_BACKEND="gloo", GLOO_SOCKET_IFNAME=None, NCCL_SOCKET_IFNAME=None)
    proc = subprocess.run(
        ["unshare", "--mount", "--net", "--uts", "--fork", "bash", "-c", script, "job",
         lib.PYTHON, "-m", "accord.run", "-np", "2", lib.PYTHON, lib.script("listening_sockets.py")],
        capture_output=True, text=True, timeout=80, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"{LAN}"), proc.stdout  # the name did resolve to the LAN address
    listens = {}
    for line in proc.stdout.splitlines():
        if "LISTEN " in line:
            rank = int(line.split("]", 1)[0].lstrip("["))
            listens[rank] = json.loads(line.split("LISTEN ", 1)[1])
    assert sorted(listens) == [0, 1], proc.stdout
    assert all(listens.values()), listens  # Gloo does listen; the question is where
    for rank, sockets in listens.items():
        for address, port in sockets:
            assert address in ("127.0.0.1", "::1"), f"rank {rank} listens on {address}:{port}"
    assert proc.stdout.count("SUM 3.0") == 2
    # nothing left behind in this namespace
    assert Path("/etc/hosts").read_bytes() == etc_hosts_before
    assert socket.gethostname() == hostname_before
