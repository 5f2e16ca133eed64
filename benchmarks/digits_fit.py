"""examples/digits_fit.py on 1 rank and on 2 ranks, side by side, interleaved; medians to JSON.

    python benchmarks/digits_fit.py --repeats 3

Two workloads:
- ``readme``: the README's job as it ships (8x8 digits, global batch 64): final accuracy on 1
  and 2 ranks (the same optimization steps, so it should match) and the time per epoch
  (communication-bound: LeNet on 8x8 images is ~15 us of arithmetic per sample).
- ``compute``: the same task with digits upsampled to 28x28 (MNIST-sized LeNet) and a global
  batch of 1024, where arithmetic (~150 ms per step on one core) dominates the gradient
  allreduce (~6-13 ms per step through accord's engine here).

Each configuration runs the example once per repeat, in rotation, so a busy neighbour slows
every configuration alike. The example reports the median epoch time after the first epoch.
A 2-rank job needs both cores of a 2-core machine: other load on the machine slows it more
than the 1-rank run (see ``machine.load_average_*`` in the results).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = "examples/digits_fit.py"

WORKLOADS = {
    "readme": ["--epochs", "15", "--global-batch", "64"],
    "compute": ["--epochs", "8", "--global-batch", "1024", "--image-size", "28"],
}


def configurations(workload: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (command prefix, extra environment)."""
    py = sys.executable
    configs = {
        "1 rank x 1 thread": ([py, EXAMPLE], {"OMP_NUM_THREADS": "1"}),
        "2 ranks x 1 thread (accordrun)": ([py, "-m", "accord.run", "-np", "2", py, EXAMPLE], {}),
    }
    return configs


def run_once(cmd: list[str], env_extra: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="accord-digits-") as tmp:
        out = os.path.join(tmp, "summary.json")
        # A benchmark script, not library code: it builds its children's environment directly.
        # Threads are set per configuration (accordrun gives each rank cores // ranks).
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        env.update(env_extra)
        proc = subprocess.run([*cmd, "--verbose", "0", "--json", out], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 and not os.path.exists(out):
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
        with open(out) as fh:
            summary = json.load(fh)
        # Training finished and was measured, but the job failed afterwards (seen: a rank
        # aborting in teardown): keep the numbers, and count it in the report.
        summary["exit_code"] = proc.returncode
        if proc.returncode != 0:
            summary["failure_tail"] = (proc.stdout + proc.stderr)[-2000:]
        return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workloads", default="readme,compute")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "digits_fit.json"))
    args = p.parse_args()

    report: dict = {
        "benchmark": "examples/digits_fit.py, 1 rank vs 2 ranks, same global batch",
        "command": f"python benchmarks/digits_fit.py --repeats {args.repeats}",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "load_average_start": os.getloadavg()},
        "workloads": {},
    }
    import torch

    report["machine"]["torch"] = torch.__version__
    for workload in args.workloads.split(","):
        flags = WORKLOADS[workload]
        configs = configurations(workload)
        runs: dict[str, list[dict]] = {name: [] for name in configs}
        for _ in range(args.repeats):
            for name, (cmd, env) in configs.items():
                runs[name].append(run_once([*cmd, *flags], env))
        results = {}
        for name, (cmd, env) in configs.items():
            rs = runs[name]
            results[name] = {
                "command": " ".join([*(f"{k}={v}" for k, v in env.items()),
                                     *[c if c != sys.executable else "python" for c in cmd], *flags]),
                "epoch_time_ms_median": statistics.median(r["epoch_time_s"] for r in rs) * 1e3,
                "epoch_time_ms_runs": [round(r["epoch_time_s"] * 1e3, 2) for r in rs],
                # CPU seconds rank 0 spent per epoch (training, evaluation, communication):
                # about the epoch time it would reach with a whole core to itself.
                "cpu_s_per_epoch_rank0_median": statistics.median(r["cpu_s_per_epoch_rank0"] for r in rs),
                "samples_per_sec_median": statistics.median(r["samples_per_sec"] for r in rs),
                "test_accuracy_runs": [round(r["test_accuracy"], 4) for r in rs],
                "test_loss_runs": [round(r["test_loss"], 4) for r in rs],
                "world_size": rs[0]["world_size"], "threads_per_rank": rs[0]["threads_per_rank"],
                "batch_per_rank": rs[0]["batch_per_rank"],
                "runs_failing_after_training": [r["failure_tail"] for r in rs if r["exit_code"] != 0],
            }
        one = results["1 rank x 1 thread"]["epoch_time_ms_median"]
        two = results["2 ranks x 1 thread (accordrun)"]["epoch_time_ms_median"]
        report["workloads"][workload] = {"flags": " ".join(flags), "results": results,
                                         "speedup_2_ranks_vs_1_rank_1_thread": one / two}
        print(f"{workload}: " + "; ".join(f"{n}: {r['epoch_time_ms_median']:.1f} ms/epoch, "
                                           f"acc {r['test_accuracy_runs'][0]:.4f}" for n, r in results.items()))
    report["machine"]["load_average_end"] = os.getloadavg()
    report["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
