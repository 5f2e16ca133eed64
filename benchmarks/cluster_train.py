"""Training throughput across simulated hosts: accord against DDP, 2 hosts x 2 ranks.

    python benchmarks/cluster_train.py [--rate 1gbit] [--only mlp] [--steps 20] [--hierarchical on]

Runs ``accord-bench train`` (``python -m accord.bench train``) under accordrun over ssh on two
simulated hosts (tools/simcluster) with links at ``--rate``: the 26 M-parameter MLP and
ResNet-50 on 64x64 images. Each invocation measures, in the same processes, rank 0 alone (the
reference for scaling efficiency), accord (hvd.DistributedOptimizer, defaults: the hierarchical
allreduce chosen automatically) and DDP, alternating over ``--repeats``. A second MLP run gives
accord's best settings (bf16 gradient compression on the wire), and a third measures DDP on
accord's torch.distributed backend (``--accord-api ddp``: the same DDP, its buckets on accord)
against DDP on gloo. Writes benchmarks/results/cluster_train_<name>.json (accord-bench's own
JSON, plus the cluster's setup). Targets at 1 Gbit/s: accord >= 1.2x DDP on the MLP; DDP on
accord >= 1.3x DDP on gloo.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from recording import record

HERE = os.path.dirname(os.path.abspath(__file__))

RUNS: list[tuple[str, list[str]]] = [
    ("mlp", ["--model", "mlp", "--batch-size", "32"]),
    ("mlp_bf16", ["--model", "mlp", "--batch-size", "32", "--compression", "bf16"]),
    ("mlp_ddp_accord", ["--model", "mlp", "--batch-size", "32", "--accord-api", "ddp"]),
    ("resnet50", ["--model", "resnet50", "--image-size", "64", "--batch-size", "16"]),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--only", default="", help="runs whose name contains this")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--hierarchical", choices=("auto", "on", "off"), default="auto",
                   help="accord's allreduce path: chosen by timing (default), or forced")
    args = p.parse_args(argv)
    path_flag = {"auto": [], "on": ["--hierarchical-allreduce"], "off": ["--no-hierarchical-allreduce"]}
    suffix = "" if args.hierarchical == "auto" else f"_hierarchical_{args.hierarchical}"
    from cluster_common import Cluster, load_average, start_cluster

    with start_cluster(hosts=2, rate=None if args.rate == "unlimited" else args.rate) as cluster:
        for name, extra in RUNS:
            if args.only not in name:
                continue
            path = os.path.join(HERE, "results", f"cluster_train_{name}{suffix}.json")
            before = load_average()
            cmd = [os.path.join(os.path.dirname(sys.executable), "accordrun"), "-H", "h1:2,h2:2",
                   *path_flag[args.hierarchical],
                   sys.executable, "-m", "accord.bench", "train", *extra, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--repeats", str(args.repeats), "--baseline", "ddp",
                   "--threads", "1", "--no-progress", "--json", path]
            res = cluster.run("h1", cmd, timeout=3600, cwd=os.path.dirname(HERE),
                              env=Cluster.env({"OMP_NUM_THREADS": "1"}))
            print(res.stdout[-2500:], flush=True)
            if res.returncode != 0:
                print(res.stderr[-3000:], file=sys.stderr)
                return res.returncode
            with open(path) as fh:
                result = json.load(fh)
            result["cluster"] = {"layout": "2 simulated hosts x 2 ranks (accordrun over ssh)",
                                 "rate": args.rate, "hierarchical": args.hierarchical,
                                 "load_before": before, "load_after": load_average()}
            record(result, path, "cluster_train.py", argv)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
