"""Synthetic training throughput of a ResNet, Horovod-style: same flags, same printed lines.

Run it on 2 ranks (CPU, small images so it finishes quickly):

    accordrun -np 2 python examples/pytorch_synthetic_benchmark.py \
        --model resnet50 --batch-size 16 --image-size 64 --no-cuda

A Horovod user's script would read ``import horovod.torch as hvd``; here that is the one line
that changes (the models come from accord.models, so torchvision is not needed). Every rank
trains on the same fixed random batch: the benchmark measures compute plus gradient exchange,
not input loading. Warm-up batches are run first and not counted, then ``--num-iters``
measurements of ``--num-batches-per-iter`` batches each; the spread is 1.96 standard deviations.
"""
from __future__ import annotations

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import accord.torch as hvd
from accord.models import get_model


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fp16-allreduce", action="store_true", default=False,
                   help="use fp16 compression during allreduce")
    p.add_argument("--bf16-allreduce", action="store_true", default=False,
                   help="use bfloat16 compression during allreduce (accord)")
    p.add_argument("--model", type=str, default="resnet50", choices=["resnet50", "resnet18"],
                   help="model to benchmark")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size (per rank)")
    p.add_argument("--image-size", type=int, default=224, help="side of the square input images")
    p.add_argument("--num-warmup-batches", type=int, default=10,
                   help="number of warm-up batches that don't count towards benchmark")
    p.add_argument("--num-batches-per-iter", type=int, default=10,
                   help="number of batches per benchmark iteration")
    p.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    p.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
    p.add_argument("--use-adasum", action="store_true", default=False,
                   help="use adasum algorithm to do reduction")
    args = p.parse_args()
    if args.fp16_allreduce and args.bf16_allreduce:
        p.error("choose one of --fp16-allreduce and --bf16-allreduce")
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    return args


def main() -> None:
    args = parse_args()
    hvd.init()
    if args.cuda:
        torch.cuda.set_device(hvd.local_rank())  # one GPU per local rank
        torch.backends.cudnn.benchmark = True

    model = get_model(args.model)
    # Average over more ranks means a larger effective batch: scale the learning rate with it
    # (Adasum combines gradients without that need).
    lr_scale = 1 if args.use_adasum else hvd.size()
    if args.cuda:
        model.cuda()
        if args.use_adasum and hvd.nccl_built():
            lr_scale = hvd.local_size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scale)

    compression = hvd.Compression.none
    if args.fp16_allreduce:
        compression = hvd.Compression.fp16
    elif args.bf16_allreduce:
        compression = hvd.Compression.bf16
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average)
    # Every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 1000, (args.batch_size,))
    if args.cuda:
        data, target = data.cuda(), target.cuda()

    def step() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()  # waits for the averaged gradients, then updates

    def log(line: str) -> None:
        if hvd.rank() == 0:
            print(line, flush=True)

    device = "GPU" if args.cuda else "CPU"
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device}s: {hvd.size()}")

    log("Running warmup...")
    timeit.timeit(step, number=args.num_warmup_batches)

    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{i}: {rate:.1f} img/sec per {device}")
        rates.append(rate)

    mean, spread = float(np.mean(rates)), 1.96 * float(np.std(rates))
    log(f"Img/sec per {device}: {mean:.1f} +-{spread:.1f}")
    log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * mean:.1f} +-{hvd.size() * spread:.1f}")


if __name__ == "__main__":
    main()
