#!/usr/bin/env python3
"""Spark's TorchDistributor running a Horovod-style accord function (docs/spark.md).

    python scripts/spark_torch_distributor.py     # in an environment with pyspark, torch and accord

TorchDistributor(num_processes=2, local_mode=True, use_gpu=False) starts the function under
torchrun on this machine; inside it ``import accord.torch as hvd`` and ``hvd.init()`` read
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), as accord's
workers do under torchrun anywhere. The function trains a small model with
hvd.DistributedOptimizer on each rank's half of a seeded data set; this script checks that rank
0's parameters are the ones one process reaches on the whole data set (averaging the halves'
mean-loss gradients is the whole batch's), prints them and exits 0, or exits 1.
"""
from __future__ import annotations

import sys

STEPS, LR = 6, 0.05


def data():
    import torch

    g = torch.Generator().manual_seed(1234)
    x = torch.randn(16, 4, generator=g, dtype=torch.float64)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64) + 0.1


def fresh_model():
    import torch

    torch.manual_seed(7)
    return torch.nn.Linear(4, 1).double()


def steps(model, optimizer, x, y):
    for _ in range(STEPS):
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def train():
    """The function Spark runs on every rank (under torchrun)."""
    import torch

    import accord.torch as hvd

    hvd.init()
    try:
        model = fresh_model()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                             named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        x, y = data()
        half = x.shape[0] // hvd.size()
        mine = slice(hvd.rank() * half, (hvd.rank() + 1) * half)
        return {"rank": hvd.rank(), "size": hvd.size(), "params": steps(model, optimizer, x[mine], y[mine])}
    finally:
        hvd.shutdown()


def main() -> int:
    import torch
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[2]").appName("accord-torch-distributor").getOrCreate()
    try:
        result = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train)
    finally:
        spark.stop()
    model = fresh_model()
    x, y = data()
    expected = steps(model, torch.optim.SGD(model.parameters(), lr=LR), x, y)
    close = all(abs(g - w) <= 1e-12 * max(1.0, abs(w))
                for got, want in zip(result["params"], expected) for g, w in zip(got, want))
    print(f"spark_torch_distributor: rank {result['rank']} of {result['size']} (returned by TorchDistributor): "
          f"parameters {result['params']}")
    if result["size"] != 2 or not close:
        print(f"spark_torch_distributor: FAILED: expected 2 ranks and the one-process parameters {expected}",
              file=sys.stderr)
        return 1
    print("spark_torch_distributor: OK: 2 accord ranks under Spark's TorchDistributor trained the model "
          "one process trains on the whole data set")
    return 0


if __name__ == "__main__":
    sys.exit(main())
