"""Gluon training on 2 workers: accord's DistributedTrainer against MXNet's own
``kvstore='dist_sync'`` with ps-lite servers, side by side in one run, plus one process for the
scaling efficiency of both.

    .venv-mxnet/bin/python benchmarks/mxnet_trainer.py --repeats 3

(MXNet 1.9.1 lives in .venv-mxnet, which scripts/setup_env.sh builds.) Configurations, run in
rotation so that load from elsewhere slows each alike:

- ``1 process``: plain ``gluon.Trainer`` (no KVStore), one rank's batch;
- ``accord``: ``accordrun -np 2``, ``hvd.DistributedTrainer`` (gradients through accord's engine);
- ``mxnet dist_sync``: ``accordrun -np 2 --ps mxnet --num-servers S`` (MXNet's scheduler, S
  servers and 2 workers, all MXNet's), ``gluon.Trainer(kvstore='dist_sync')`` with MXNet's
  default of updating on the servers.

The model is a Gluon MLP (``--hidden`` units, two hidden layers, 784 inputs, 10 outputs) on
synthetic data, ``--batch`` rows per worker and step, 1 thread per process. Each worker runs
``--warmup`` steps, then ``--steps`` measured steps, each ending with ``mx.nd.waitall()``.
Samples/s count every worker's rows; efficiency = samples/s / (workers x one process's).
The result goes to ``benchmarks/results/mxnet_trainer.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def worker(args: argparse.Namespace) -> None:
    """One worker (or the single process): train and print rank 0's step times as JSON."""
    import mxnet as mx
    import numpy as np

    mode = args.worker
    if mode == "accord":
        import accord.mxnet as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    elif mode == "dist_sync":
        kv = mx.kv.create("dist_sync")
        rank, size = kv.rank, kv.num_workers
    else:
        rank, size = 0, 1
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(args.hidden, in_units=784, activation="relu"),
            mx.gluon.nn.Dense(args.hidden, in_units=args.hidden, activation="relu"),
            mx.gluon.nn.Dense(10, in_units=args.hidden))
    mx.random.seed(0)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    params = net.collect_params()
    opt = {"learning_rate": 0.01, "momentum": 0.9}
    if mode == "accord":
        hvd.broadcast_parameters(params, root_rank=0)
        trainer = hvd.DistributedTrainer(params, "sgd", opt)
    else:
        trainer = mx.gluon.Trainer(params, "sgd", opt, kvstore=kv if mode == "dist_sync" else None)
    rng = np.random.default_rng(rank)
    data = mx.nd.array(rng.normal(size=(args.batch, 784)))
    label = mx.nd.array(rng.integers(0, 10, args.batch))
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    times = []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        with mx.autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(args.batch)
        mx.nd.waitall()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    if rank == 0:
        n_params = sum(int(np.prod(p.shape)) for p in params.values())
        print("RESULT " + json.dumps({"workers": size, "step_s": times, "params": n_params}), flush=True)
    if mode == "accord":
        hvd.shutdown()


def configurations(args: argparse.Namespace) -> dict[str, list[str]]:
    py = sys.executable
    me = [py, os.path.abspath(__file__), "--hidden", str(args.hidden), "--batch", str(args.batch),
          "--steps", str(args.steps), "--warmup", str(args.warmup), "--worker"]
    return {
        "1 process": me + ["single"],
        "accord DistributedTrainer, 2 ranks": [py, "-m", "accord.run", "-np", "2"] + me + ["accord"],
        f"mxnet dist_sync, 2 workers + {args.servers} server(s)":
            [py, "-m", "accord.run", "-np", "2", "--ps", "mxnet", "--num-servers", str(args.servers)]
            + me + ["dist_sync"],
    }


def run_once(cmd: list[str]) -> dict:
    # A benchmark script, not library code: it builds its children's environment directly.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if "RESULT " in ln]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].split("RESULT ", 1)[1])


def summarize(runs: list[dict], batch: int) -> dict:
    steps = [t for r in runs for t in r["step_s"]]
    mean = statistics.mean(steps)
    sd = statistics.stdev(steps) if len(steps) > 1 else 0.0
    per_run = [r["workers"] * batch / statistics.mean(r["step_s"]) for r in runs]
    return {"workers": runs[0]["workers"], "step_ms": round(mean * 1e3, 2), "ci95_ms": round(1.96 * sd * 1e3, 2),
            "samples_per_s": round(runs[0]["workers"] * batch / mean, 1),
            "samples_per_s_per_run": [round(s, 1) for s in per_run], "params": runs[0]["params"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=2048, help="units per hidden layer (2048: 5.8 M params)")
    parser.add_argument("--batch", type=int, default=32, help="rows per worker and step")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--servers", type=int, default=1, help="MXNet servers (ps-lite)")
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "mxnet_trainer.json"))
    parser.add_argument("--worker", choices=("single", "accord", "dist_sync"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    configs = configurations(args)
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for rep in range(args.repeats):
        for name, cmd in configs.items():
            runs[name].append(run_once(cmd))
            print(f"repeat {rep + 1}/{args.repeats}: {name}: "
                  f"{summarize(runs[name][-1:], args.batch)['samples_per_s']} samples/s", flush=True)
    table = {name: summarize(r, args.batch) for name, r in runs.items()}
    single, ours, theirs = (table[n]["samples_per_s"] for n in configs)
    for name, row in table.items():
        row["efficiency"] = round(row["samples_per_s"] / (row["workers"] * single), 3)
        print(f"{name:45s} {row['step_ms']:8.1f} ms/step ±{row['ci95_ms']:.1f}  "
              f"{row['samples_per_s']:8.1f} samples/s  efficiency {row['efficiency']:.2f}")
    ratio = ours / theirs
    print(f"accord / MXNet dist_sync samples per second: {ratio:.2f}x (target >= 1.5x)")
    import mxnet
    import torch
    from recording import record

    result = {"benchmark": "mxnet_trainer", "results": table, "accord_over_mxnet": round(ratio, 3),
              "config": {k: getattr(args, k) for k in ("hidden", "batch", "steps", "warmup", "repeats", "servers")},
              "environment": {"mxnet": mxnet.__version__, "torch": torch.__version__,
                              "python": platform.python_version(), "cpus": os.cpu_count(),
                              "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()]}}
    record(result, args.json, "mxnet_trainer.py", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
