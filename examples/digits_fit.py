"""LeNet on scikit-learn's handwritten digits with accord.Model.fit: one script, any world size.

    python examples/digits_fit.py                      # one process
    accordrun -np 2 python examples/digits_fit.py      # two ranks started by the launcher
    python examples/digits_fit.py --spawn 2            # two ranks started by accord.spawn

Nothing in the training code knows how many ranks there are: ``accord.Model`` notices the
launcher, shards the data, averages gradients and sums the metrics over ranks. The digits
(1,797 8x8 images) ship with scikit-learn, so nothing is downloaded.

``--global-batch`` (default 64) is split evenly over the ranks, so every world size takes the
same optimization steps on the same samples and reaches the same accuracy (with the defaults:
95.5% on the 359 test images, on 1 and on 2 ranks); with more ranks each computes a smaller
share of every batch. ``benchmarks/digits_fit.py`` compares the time per epoch.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

import accord
from accord.hapi import Accuracy
from accord.models import get_model

TEST_FRACTION = 0.2  # 1,437 training and 360 test images


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--global-batch", type=int, default=64, help="samples per step over all ranks")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seeds the split, the weights and the shuffle")
    p.add_argument("--log-freq", type=int, default=10, help="steps between log lines")
    p.add_argument("--verbose", type=int, default=2, help="0 silent, 1 progress bar, 2 log lines")
    p.add_argument("--image-size", type=int, default=8,
                   help="8: the digits as they come; larger (e.g. 28) upsamples them, for more compute per sample")
    p.add_argument("--amp", default="O0", choices=["O0", "O1"], help="O1: bfloat16 autocast on CPU")
    p.add_argument("--compile", action="store_true", help="torch.compile the network")
    p.add_argument("--save-dir", default=None, help="write checkpoints here (rank 0)")
    p.add_argument("--spawn", type=int, default=0, metavar="N", help="start N ranks with accord.spawn")
    p.add_argument("--json", default=None, metavar="PATH", help="write the summary as JSON (rank 0)")
    return p.parse_args(argv)


def load_data(seed: int, image_size: int = 8) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A fixed, seeded train/test split of the digits, pixels scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("digits_fit needs scikit-learn for its bundled digits: "
                         "pip install 'accord[examples]' (or scikit-learn)") from None

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # (1797, 64): LeNet reshapes rows to 1x8x8
    if image_size != 8:  # MNIST-sized inputs: same task, ~10x the arithmetic per sample
        images = torch.from_numpy(x).view(-1, 1, 8, 8)
        x = torch.nn.functional.interpolate(images, size=(image_size, image_size), mode="bilinear",
                                            align_corners=False).reshape(len(x), -1).numpy()
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * TEST_FRACTION))
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def train(args: argparse.Namespace) -> dict:
    """Train and evaluate; every rank runs this, rank 0 prints the summary."""
    train_set, test_set = load_data(args.seed, args.image_size)
    torch.manual_seed(args.seed)  # rank 0's initial weights are broadcast anyway
    model = accord.Model(get_model("lenet", num_classes=10, image_size=args.image_size))
    size = model.world_size
    if args.global_batch % size:
        raise SystemExit(f"--global-batch {args.global_batch} is not divisible by the {size} ranks; "
                         f"pick a multiple of {size}")
    per_rank = args.global_batch // size
    model.prepare(torch.optim.Adam(model.parameters(), lr=args.lr), torch.nn.CrossEntropyLoss(),
                  Accuracy(topk=(1, 2)), amp_level=args.amp, compile=args.compile)

    start, cpu_start = time.perf_counter(), time.process_time()
    history = model.fit(train_set, test_set, epochs=args.epochs, batch_size=per_rank,
                        eval_freq=args.epochs, log_freq=args.log_freq, verbose=args.verbose,
                        save_dir=args.save_dir, seed=args.seed)
    total = time.perf_counter() - start
    cpu_per_epoch = (time.process_time() - cpu_start) / args.epochs  # this rank, all its threads

    # The first epoch pays for warm-up (allocations, first collectives): report the rest.
    steady = history["epoch_time"][1:] or history["epoch_time"]
    epoch_s = statistics.median(steady)
    summary = {
        "world_size": size,
        "threads_per_rank": torch.get_num_threads(),
        "image_size": args.image_size,
        "global_batch": args.global_batch,
        "batch_per_rank": per_rank,
        "epochs": args.epochs,
        "train_samples": len(train_set[1]),
        "test_samples": history["eval_samples"][-1],
        "test_accuracy": history["eval_acc_top1"][-1],
        "test_top2_accuracy": history["eval_acc_top2"][-1],
        "test_loss": history["eval_loss"][-1],
        "train_accuracy_last_epoch": history["acc_top1"][-1],
        "epoch_time_s": epoch_s,
        "samples_per_sec": len(train_set[1]) / epoch_s,
        "total_time_s": total,
        "cpu_s_per_epoch_rank0": cpu_per_epoch,
        "amp": args.amp,
        "compile": args.compile,
    }
    if model.rank == 0:
        threads = torch.get_num_threads()
        print(f"digits_fit: world size {size} ({threads} thread{'s' if threads > 1 else ''} per rank), "
              f"global batch {args.global_batch} = {size} x {per_rank} per rank, {args.epochs} epochs")
        print(f"digits_fit: final test accuracy {summary['test_accuracy']:.4f} "
              f"(top-2 {summary['test_top2_accuracy']:.4f}, loss {summary['test_loss']:.4f}) "
              f"on {summary['test_samples']} test images")
        print(f"digits_fit: throughput {summary['samples_per_sec']:.0f} samples/s, "
              f"{epoch_s * 1e3:.1f} ms per epoch (median of epochs 2-{args.epochs}), "
              f"{total:.2f} s for fit")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(summary, fh, indent=2)
    import accord.torch as hvd

    if hvd.is_initialized():  # leave the job cleanly (spawn's workers skip atexit handlers)
        hvd.shutdown()
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.spawn:
        results = accord.spawn(train, args=(args,), nprocs=args.spawn)
        assert len({round(r["test_accuracy"], 6) for r in results}) == 1  # every rank agrees
    else:
        train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
