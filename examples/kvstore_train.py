"""Train a small regression model the MXNet way: gradients pushed to a KVStore, weights pulled.

    python examples/kvstore_train.py                                         # 'local', one process
    accordrun -np 2 python examples/kvstore_train.py --kvstore dist_sync     # no servers: the engine
    accordrun -np 2 --num-servers 2 python examples/kvstore_train.py --kvstore dist_async
    python examples/kvstore_train.py --kvstore dist_async --cluster 2 2      # starts 2 servers and
                                                                             # 2 workers by itself

The script is the same for every store type; only the optimizer's ``rescale_grad`` follows the
type: dist_sync sums the gradients of all workers in a round (MXNet's convention: the batch size
is per worker), dist_async applies each worker's push on its own.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

import accord.kvstore as kvs
from accord import config
from accord.kvstore import optimizers


def train(kind: str, steps: int, batch: int) -> None:
    torch.manual_seed(0)
    kv = kvs.create(kind)
    rank, workers = kv.rank, kv.num_workers

    # Every worker makes the same synthetic problem and takes its own slice of each batch.
    true_w = torch.arange(1.0, 11.0).unsqueeze(1)
    x_all = torch.randn(steps * batch * workers, 10)
    y_all = x_all @ true_w + 0.01 * torch.randn(len(x_all), 1)

    model = torch.nn.Linear(10, 1)
    names = [name for name, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    kv.init(names, [p.detach() for p in params])          # rank 0's initial weights win
    kv.pull(names, out=[p.data for p in params])

    # dist_sync merges the sum over workers: scale by the global batch. dist_async applies each
    # push alone (scale by one worker's batch); there, momentum would mix stale directions.
    is_async = kind == "dist_async"
    global_batch = batch * (1 if is_async else workers)
    kv.set_optimizer(optimizers.create("sgd", learning_rate=0.1, momentum=0.0 if is_async else 0.9,
                                       rescale_grad=1.0 / global_batch))

    start = time.perf_counter()
    for step in range(steps):
        lo = (step * workers + rank) * batch
        x, y = x_all[lo:lo + batch], y_all[lo:lo + batch]
        model.zero_grad()
        loss = ((model(x) - y) ** 2).sum() / 2              # a sum: rescale_grad does the mean
        loss.backward()
        kv.push(names, [p.grad for p in params])
        kv.pull(names, out=[p.data for p in params])
        if rank == 0 and (step % 20 == 0 or step == steps - 1):
            print(f"[{kind}] step {step:3d}  loss/sample {loss.item() / batch:.5f}", flush=True)
    kv.barrier()
    if rank == 0:
        err = (model.weight.detach().view(-1) - true_w.view(-1)).abs().max().item()
        print(f"[{kind}] {workers} worker(s), {time.perf_counter() - start:.2f}s, "
              f"max |w - w*| = {err:.4f}", flush=True)
    kv.close()


def run_cluster(kind: str, servers: int, workers: int, argv: list[str]) -> int:
    """Start the servers (LocalCluster) and the workers as subprocesses of this script."""
    from accord.kvstore.cluster import LocalCluster

    with LocalCluster(servers, workers) as cluster:
        procs = [subprocess.Popen([sys.executable, __file__, *argv],
                                  env={**config.snapshot(), **cluster.worker_env(rank), "OMP_NUM_THREADS": "1"})
                 for rank in range(workers)]
        return max(p.wait() for p in procs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kvstore", default="local")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cluster", type=int, nargs=2, metavar=("SERVERS", "WORKERS"),
                        help="start this many servers and workers on this host first")
    args = parser.parse_args()
    if args.cluster:
        argv = ["--kvstore", args.kvstore, "--steps", str(args.steps), "--batch", str(args.batch)]
        return run_cluster(args.kvstore, *args.cluster, argv)
    train(args.kvstore, args.steps, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
