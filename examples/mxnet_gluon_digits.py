"""Gluon LeNet on scikit-learn's 8x8 digits with Horovod's MXNet API on accord.

    python examples/mxnet_gluon_digits.py                    # one process
    accordrun -np 2 python examples/mxnet_gluon_digits.py    # two ranks, same accuracy

A Horovod MXNet script with one changed line (``import accord.mxnet as hvd``). The global batch
is fixed (``--global-batch``, split evenly over the ranks, each rank taking its own rows of every
global batch), and ``DistributedTrainer`` averages the gradients over the ranks, so 1 and 2
ranks take the same optimization steps and reach the same accuracy.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def lenet(mx):
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(6, 3, padding=1, activation="relu"), mx.gluon.nn.MaxPool2D(2),
            mx.gluon.nn.Conv2D(16, 3, padding=1, activation="relu"), mx.gluon.nn.MaxPool2D(2),
            mx.gluon.nn.Flatten(), mx.gluon.nn.Dense(64, activation="relu"), mx.gluon.nn.Dense(10))
    return net


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--global-batch", type=int, default=64)
    # A gentle rate: with 0.05 and more, float sums in another order (one rank sums 64 rows, two
    # ranks 32 + 32) grow into visibly different runs of this small net.
    parser.add_argument("--lr", type=float, default=0.02)
    args = parser.parse_args()

    import mxnet as mx
    from sklearn.datasets import load_digits

    import accord.mxnet as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.global_batch % size:
        raise SystemExit(f"--global-batch {args.global_batch} must be a multiple of the {size} ranks")
    batch = args.global_batch // size
    digits = load_digits()
    x = (digits.images.astype("float32") / 16.0)[:, None]  # N x 1 x 8 x 8
    y = digits.target.astype("float32")
    x_train, y_train, x_test, y_test = x[:1440], y[:1440], x[1440:], y[1440:]
    steps = len(x_train) // args.global_batch

    mx.random.seed(0)
    net = lenet(mx)
    net.initialize(mx.init.Xavier())
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)  # also covers the deferred (shape-less) ones
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": args.lr, "momentum": 0.9})
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    epoch_times = []
    for _ in range(args.epochs):
        start = time.perf_counter()
        for k in range(steps):
            rows = slice(k * args.global_batch + rank * batch, k * args.global_batch + (rank + 1) * batch)
            data, label = mx.nd.array(x_train[rows]), mx.nd.array(y_train[rows])
            with mx.autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(batch)
        mx.nd.waitall()
        epoch_times.append(time.perf_counter() - start)
    predicted = net(mx.nd.array(x_test)).argmax(axis=1).asnumpy()
    accuracy = float(np.mean(predicted == y_test))
    if rank == 0:
        per_epoch = np.median(epoch_times[1:] or epoch_times)
        print(f"mxnet_gluon_digits: {size} rank(s), global batch {args.global_batch}, {args.epochs} epochs: "
              f"test accuracy {accuracy:.4f}, {per_epoch * 1e3:.1f} ms per epoch", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
