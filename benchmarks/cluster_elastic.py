"""How fast an elastic job reacts on the simulated cluster: from a host appearing in the
discovery script's output to the first step at the new world size, and from a worker's death
to the next step (targets: <= 10 s each).

Each run is the cluster test tests/cluster/test_cluster_elastic.py (h1 x 2, + h2 x 2, - h2,
+ h3 x 1, h3's worker SIGKILLed; discovery every 0.5 s), which writes its timings; with them we
record, measured in the same run, the floor of a new worker's start-up: importing torch and
accord.torch in a fresh python on h1. Needs root and openssh-server (see docs/simulated-cluster.md).

    python benchmarks/cluster_elastic.py --runs 3 [--out benchmarks/results/cluster_elastic.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from cluster_common import REPO, load_average
from recording import record

TEST = "tests/cluster/test_cluster_elastic.py"


def _one_run() -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        path = fh.name
    try:
        env = {**os.environ, "ACCORD_ELASTIC_TIMINGS": path}
        res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", TEST],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            sys.exit(f"the elastic cluster test failed:\n{res.stdout[-5000:]}")
        with open(path) as fh:
            return json.load(fh)
    finally:
        os.unlink(path)


def _import_seconds() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, accord.torch"], check=True, timeout=300)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "cluster_elastic.json"))
    args = parser.parse_args(argv)
    load_before = load_average()
    runs, imports = [], []
    for _ in range(args.runs):
        imports.append(_import_seconds())
        runs.append(_one_run())
        print(json.dumps(runs[-1]), flush=True)
    keys = sorted(runs[0])
    summary = {k: {"median": statistics.median(r[k] for r in runs), "min": min(r[k] for r in runs),
                   "max": max(r[k] for r in runs)} for k in keys}
    summary["import_torch_and_accord_s"] = {"median": statistics.median(imports), "min": min(imports),
                                            "max": max(imports)}
    result = {"benchmark": "cluster_elastic", "runs": runs, "summary": summary,
              "load_before": load_before, "load_after": load_average(),
              "setup": "3 simulated hosts (10 Gbit/s), gloo, discovery every 0.5 s, 2-core machine"}
    record(result, args.out, "cluster_elastic.py", argv)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
