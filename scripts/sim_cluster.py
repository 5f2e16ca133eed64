#!/usr/bin/env python3
"""Start a simulated cluster by hand, run something on it, tear it down (root only).

    python scripts/sim_cluster.py -n 2 --rate 1gbit                 # a shell on h1; exit ends it
    python scripts/sim_cluster.py -n 2 -- accordrun -H h1:2,h2:2 python train.py
    python scripts/sim_cluster.py --reap                            # clean up after killed runs

The command runs inside ``--host`` (default h1) from the current folder, which every host sees
(keep your files outside /tmp: each host has its own). Inside, ``ssh h2`` works without a
password. Everything is removed at the end, also after Ctrl-C or SIGTERM; after a SIGKILL the
next run (or ``--reap``) removes what was left. See docs/simulated-cluster.md.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from simcluster import Cluster, leftovers, missing_prerequisites, reap_stale  # noqa: E402


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--hosts", type=int, default=2, help="number of hosts, h1..hN (default 2)")
    p.add_argument("--rate", default=None, help="link limit each way, e.g. 1gbit, 10gbit (default unlimited)")
    p.add_argument("--host", default="h1", help="host that runs the command (default h1)")
    p.add_argument("--reap", action="store_true", help="remove leftovers of dead runs, list live ones, exit")
    p.add_argument("command", nargs=argparse.REMAINDER, help="command to run (default: an interactive shell)")
    ns = p.parse_args(argv)
    reason = missing_prerequisites()
    if reason is not None:
        print(f"sim_cluster: cannot build a cluster here: {reason}", file=sys.stderr)
        return 2
    if ns.reap:
        for tag in reap_stale():
            print(f"reaped {tag}")
        for tag, names in leftovers().items():
            print(f"live: {tag} {' '.join(names)}")
        return 0
    if not 1 <= ns.hosts <= 250:
        p.error("--hosts must be between 1 and 250")
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    with Cluster(hosts=ns.hosts, rate=ns.rate) as cluster:
        if ns.host not in cluster.hosts:
            p.error(f"--host {ns.host}: the cluster has {', '.join(cluster.hosts)}")
        names = ", ".join(f"{h.name}={h.address}" for h in cluster.hosts.values())
        print(f"sim_cluster: {names} (links: {ns.rate or 'unlimited'}); shared folder {cluster.shared}",
              file=sys.stderr)
        if not command:
            command = [os.environ.get("SHELL", "/bin/bash")]
            print(f"sim_cluster: shell on {ns.host}; exit it to tear the cluster down", file=sys.stderr)
        proc = cluster.popen(ns.host, command, env=cluster.env())
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
