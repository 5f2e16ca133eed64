"""Shared by the cluster_*.py benchmarks: a simulated cluster (tools/simcluster) and accordrun
jobs on it, launched from h1 as on a login node, with the result read from rank 0's output.

Needs root and openssh-server (scripts/setup_env.sh); see docs/simulated-cluster.md.
"""
from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

from simcluster import Cluster, missing_prerequisites  # noqa: E402,F401 (Cluster: for the scripts)

ACCORDRUN = os.path.join(os.path.dirname(sys.executable), "accordrun")


def start_cluster(hosts: int = 2, rate: str | None = None) -> Cluster:
    """A started cluster, or exit with the reason it cannot be built here."""
    reason = missing_prerequisites()
    if reason is not None:
        sys.exit(f"cannot build a simulated cluster here: {reason}")
    return Cluster(hosts=hosts, rate=rate).start()


def run_job(cluster: Cluster, args: Sequence[str], timeout: float = 1800, **env: str) -> dict[str, Any]:
    """``accordrun args`` on h1; the JSON of the last ``RESULT {...}`` line (rank 0's)."""
    res = cluster.run("h1", [ACCORDRUN, *args], timeout=timeout, cwd=REPO,
                      env=cluster.env({"OMP_NUM_THREADS": "1", **env}))
    found = re.findall(r"RESULT (\{.*\})\s*$", res.stdout, flags=re.MULTILINE)
    if res.returncode != 0 or not found:
        sys.exit(f"job failed ({res.returncode}): accordrun {' '.join(args)}\n{res.stdout[-3000:]}\n"
                 f"{res.stderr[-3000:]}")
    return json.loads(found[-1])


def load_average() -> list[float]:
    """The machine's 1/5/15-minute load (recorded: the machine may be shared)."""
    return [round(x, 2) for x in os.getloadavg()]
