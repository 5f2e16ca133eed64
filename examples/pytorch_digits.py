"""Train LeNet on scikit-learn's handwritten digits, Horovod-style (an MNIST example that needs
no download: the 1,797 8x8 images ship with scikit-learn).

Run it on 2 ranks:

    accordrun -np 2 python examples/pytorch_digits.py

Expected: test accuracy >= 0.95 after the default 12 epochs (0.986 on 2 ranks here), in well
under 30 seconds on 2 CPU cores (training ~5 s; starting the ranks takes longer). The script
exits with status 1 if ``--target-accuracy`` is missed.

The Horovod recipe, step by step: ``hvd.init()``; each rank reads its own shard of the data
(``DistributedSampler``); the learning rate grows with the number of ranks (the averaged
gradient stands for a batch ``size`` times larger); ``DistributedOptimizer`` averages gradients;
every rank starts from rank 0's weights and optimizer state; test metrics are summed over the
ranks with ``hvd.allreduce``. ``import accord.torch as hvd`` replaces ``import horovod.torch``.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import accord.torch as hvd
from accord.models import LeNet


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="PyTorch digits (MNIST-style) example",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch-size", type=int, default=32, help="training batch size per rank")
    p.add_argument("--test-batch-size", type=int, default=256, help="test batch size per rank")
    p.add_argument("--epochs", type=int, default=12, help="number of epochs to train")
    p.add_argument("--lr", type=float, default=0.02, help="learning rate for one rank")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--seed", type=int, default=42, help="random seed")
    p.add_argument("--test-fraction", type=float, default=0.2, help="share of images held out")
    p.add_argument("--fp16-allreduce", action="store_true", default=False,
                   help="use fp16 compression during allreduce")
    p.add_argument("--target-accuracy", type=float, default=0.95,
                   help="exit with status 1 if the final test accuracy is lower")
    return p.parse_args()


def datasets(test_fraction: float) -> tuple[TensorDataset, TensorDataset]:
    """Standardized digits, split the same way on every rank (a fixed permutation)."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    mean, std = x[train].mean(), x[train].std()  # statistics of the training images only
    x = (x - mean) / std
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def evaluate(model: torch.nn.Module, loader: DataLoader) -> tuple[float, float]:
    """(mean loss, accuracy) over the whole test set: each rank scores its shard, then the
    sums travel through hvd.allreduce (Sum), so uneven shards still weigh each image once."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, images
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            totals[0] += F.cross_entropy(out, y, reduction="sum").item()
            totals[1] += (out.argmax(dim=1) == y).sum().item()
            totals[2] += len(y)
    totals = hvd.allreduce(totals, name="test_metrics", op=hvd.Sum)
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def main() -> int:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    train_set, test_set = datasets(args.test_fraction)
    # Each rank reads 1/size of the images; the samplers shuffle identically on every rank.
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                       shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    # The test set is scored once: rank r takes images r, r + size, ... (a sampler would pad
    # the last shard with repeated images, which would count them twice).
    test_indices = list(range(hvd.rank(), len(test_set), hvd.size()))
    test_loader = DataLoader(torch.utils.data.Subset(test_set, test_indices),
                             batch_size=args.test_batch_size)

    model = LeNet(num_classes=10, image_size=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    # Large steps early, small ones late: the last epochs settle instead of bouncing around.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        schedule.step()
        test_loss, accuracy = evaluate(model, test_loader)
        if hvd.rank() == 0:
            print(f"Epoch {epoch}: train loss {loss.item():.4f}, test loss {test_loss:.4f}, "
                  f"test accuracy {100 * accuracy:.2f}%", flush=True)

    if hvd.rank() == 0:
        print(f"Training time: {time.perf_counter() - start:.1f} s")
        print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: {100 * accuracy:.2f}%")
        verdict = "reached" if accuracy >= args.target_accuracy else "MISSED"
        print(f"Final test accuracy {accuracy:.4f} on {hvd.size()} ranks: {verdict} the target "
              f"{args.target_accuracy:.2f}", flush=True)
    return 0 if accuracy >= args.target_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
