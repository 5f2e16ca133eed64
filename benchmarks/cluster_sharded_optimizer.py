"""Sharded optimizer state across simulated hosts: ZeRO-1/2 against the unsharded
DistributedOptimizer, 2 hosts x 2 ranks, side by side in one run.

    python benchmarks/cluster_sharded_optimizer.py [--rate 1gbit] [--repeats 2] [--steps 8]

Each mode (unsharded, zero1, zero2) is a fresh accordrun job (``-H h1:2,h2:2`` on two simulated
hosts, tools/simcluster, links at ``--rate``) of benchmarks/sharded_optimizer.py ``--worker``:
Adam on the 26 M-parameter MLP, one thread per rank, measured steps between barriers; the modes
alternate over ``--repeats``. The sharded modes move the same bytes as the unsharded one (a
reduce-scatter and an all-gather of the gradients' size, against one allreduce), so across hosts
their step should stay close to it. Writes benchmarks/results/cluster_sharded_optimizer.json.
Target: step time <= 1.1x the unsharded.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from recording import record

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("unsharded", "zero1", "zero2")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--width", type=int, default=2560)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, from: " + ", ".join(MODES))
    p.add_argument("--hierarchical", choices=("auto", "on", "off"), default="auto",
                   help="the collectives' path across hosts: chosen by timing (default), or forced")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        p.error(f"--modes: unknown {', '.join(sorted(set(modes) - set(MODES)))} (known: {', '.join(MODES)})")
    path_flag = {"auto": [], "on": ["--hierarchical-allreduce"], "off": ["--no-hierarchical-allreduce"]}
    from cluster_common import load_average, run_job, start_cluster

    runs: dict[str, list[dict]] = {m: [] for m in modes}
    before = load_average()
    with start_cluster(hosts=2, rate=None if args.rate == "unlimited" else args.rate) as cluster:
        for _ in range(args.repeats):
            for mode in modes:
                worker = [sys.executable, os.path.join(HERE, "sharded_optimizer.py"), "--worker", mode,
                          "--width", str(args.width), "--layers", str(args.layers), "--steps", str(args.steps),
                          "--warmup", str(args.warmup)]
                got = run_job(cluster, ["-H", "h1:2,h2:2", *path_flag[args.hierarchical], *worker], timeout=1800)
                runs[mode].append(got)
                print(mode, got["step_ms_mean"], "ms/step", max(got["peak_rss_mb_per_rank"]), "MB peak RSS",
                      flush=True)
    median = {m: statistics.median(r["step_ms_mean"] for r in runs[m]) for m in modes}
    result = {"runs": runs, "median_step_ms": median, "hierarchical": args.hierarchical,
              "step_vs_unsharded": {m: round(median[m] / median["unsharded"], 3) for m in modes}
              if "unsharded" in modes else {},
              "layout": "2 simulated hosts x 2 ranks, accordrun -H h1:2,h2:2", "rate": args.rate,
              "load_before": before, "load_after": load_average()}
    suffix = "" if args.hierarchical == "auto" else f"_hierarchical_{args.hierarchical}"
    record(result, os.path.join(HERE, "results", f"cluster_sharded_optimizer{suffix}.json"),
           "cluster_sharded_optimizer.py", argv)
    print("median step ms:", median, "\nvs unsharded:", result["step_vs_unsharded"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
