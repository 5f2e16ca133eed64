"""An MXNet Module/``fit`` script on scikit-learn's digits: the same file runs on one process,
on accord's KVStore plug-in, and on MXNet's own parameter servers.

    python examples/mxnet_module_fit.py                                   # one process ('local')
    accordrun -np 2 python examples/mxnet_module_fit.py --kv-store accord # accord's KVStore
    accordrun -np 2 --ps mxnet --num-servers 1 \\
        python examples/mxnet_module_fit.py --kv-store dist_sync          # MXNet's ps-lite

Each worker trains on its share of every global batch (``--batch-size`` rows per worker, rows
``[k * n * b + r * b, k * n * b + (r + 1) * b)`` for worker r of n), so every store type sees the
same global batches and ends with the same weights as one process with batch ``n * b``.
``--save-params FILE`` writes the final weights (npz) from worker 0.
"""
from __future__ import annotations

import argparse

import numpy as np


def digits(rank: int, workers: int, batch: int) -> tuple[np.ndarray, ...]:
    """This worker's training rows (see the module docstring) and the held-out test set."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x, y = data.data.astype("float32") / 16.0, data.target.astype("float32")
    x_train, y_train, x_test, y_test = x[:1440], y[:1440], x[1440:], y[1440:]
    steps = len(x_train) // (workers * batch)
    used = steps * workers * batch

    def shard(a):
        return a[:used].reshape(steps, workers, batch, *a.shape[1:])[:, rank].reshape(-1, *a.shape[1:])

    return shard(x_train), shard(y_train), x_test, y_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv-store", default="local", help="local, accord, dist_sync_perseus or dist_sync")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="rows per worker and step")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--save-params", help="write the final weights here (npz, worker 0)")
    args = parser.parse_args()

    import mxnet as mx

    if args.kv_store in ("accord", "dist_sync_perseus"):
        import accord.mxnet  # noqa: F401  (registers the 'accord' KVStore types with MXNet)
    kv = mx.kv.create(args.kv_store)
    rank, workers = kv.rank, kv.num_workers
    x, y, x_test, y_test = digits(rank, workers, args.batch_size)
    train = mx.io.NDArrayIter(x, y, args.batch_size, shuffle=False, label_name="softmax_label")
    test = mx.io.NDArrayIter(x_test, y_test, 120, label_name="softmax_label")

    net = mx.sym.Variable("data")
    net = mx.sym.Activation(mx.sym.FullyConnected(net, num_hidden=64, name="fc1"), act_type="relu")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(net, num_hidden=10, name="fc2"), name="softmax")
    mod = mx.mod.Module(net, context=mx.cpu())
    mx.random.seed(42)  # same initial weights everywhere (the stores also start from worker 0's)
    mod.fit(train, num_epoch=args.epochs, kvstore=kv, optimizer="sgd",
            optimizer_params={"learning_rate": args.lr, "momentum": 0.9},
            initializer=mx.init.Xavier(rnd_type="uniform", magnitude=2.0))
    accuracy = mod.score(test, "acc")[0][1]
    if rank == 0:
        print(f"mxnet_module_fit: kvstore {args.kv_store} ({kv.type}), {workers} worker(s), "
              f"global batch {workers * args.batch_size}, {args.epochs} epochs: "
              f"test accuracy {accuracy:.4f}", flush=True)
        if args.save_params:
            params = mod.get_params()[0]
            np.savez(args.save_params, **{k: v.asnumpy() for k, v in params.items()})


if __name__ == "__main__":
    main()
