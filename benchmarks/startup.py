"""Start-up to the first collective: accordrun vs torchrun, same 2-rank script, same run.

The script initialises Gloo through env:// and allreduces one tensor; rank 0 prints the wall
clock when that first collective has completed. For each launcher we measure, from the moment
the launcher process is started:

- ``first_collective_s``: until the first allreduce completed (what users wait for), and
- ``total_s``: until the launcher exited (includes tear-down).

Runs alternate between the launchers (the machine is shared and noisy) and we report medians.
Usage: ``python benchmarks/startup.py [--runs 5] [--out benchmarks/results/startup.json]``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SCRIPT = """\
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 0:
    print(f"FIRST_COLLECTIVE {time.time():.6f} {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def _launchers(python: str, script: str) -> dict[str, list[str]]:
    bindir = os.path.dirname(python)
    torchrun = shutil.which("torchrun", path=bindir) or shutil.which("torchrun") or "torchrun"
    return {
        "accordrun": [python, "-m", "accord.run", "-np", "2", python, script],
        "torchrun": [torchrun, "--standalone", "--nproc-per-node", "2", script],
    }


def _one(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    start = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    total = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    # accordrun prefixes the line with "[0]<stdout>:", torchrun does not
    line = next(line for line in proc.stdout.splitlines() if "FIRST_COLLECTIVE" in line)
    stamp = float(line.split("FIRST_COLLECTIVE", 1)[1].split()[0])
    return {"first_collective_s": stamp - start, "total_s": total}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "startup.json"))
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # each launcher's own default
    with tempfile.TemporaryDirectory(prefix="accord-startup-") as tmp:
        script = os.path.join(tmp, "first_collective.py")
        with open(script, "w") as fh:
            fh.write(SCRIPT)
        launchers = _launchers(sys.executable, script)
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in launchers}
        for argv in launchers.values():  # warm-up: page cache, .pyc files
            _one(argv, env)
        for i in range(args.runs):
            for name, argv in launchers.items():
                samples[name].append(_one(argv, env))
                print(f"run {i + 1}/{args.runs} {name}: first collective "
                      f"{samples[name][-1]['first_collective_s']:.2f}s, total {samples[name][-1]['total_s']:.2f}s",
                      flush=True)
    summary = {}
    for name, runs in samples.items():
        summary[name] = {
            key: {"median": statistics.median(r[key] for r in runs), "min": min(r[key] for r in runs),
                  "max": max(r[key] for r in runs), "runs": [round(r[key], 4) for r in runs]}
            for key in ("first_collective_s", "total_s")
        }
    ratio = {key: summary["accordrun"][key]["median"] / summary["torchrun"][key]["median"]
             for key in ("first_collective_s", "total_s")}
    import torch

    result = {
        "benchmark": "start-up to the first collective, 2 ranks, gloo via env://",
        "command": "python benchmarks/startup.py " + " ".join(sys.argv[1:]),
        "launchers": {name: " ".join([os.path.basename(argv[0]), *argv[1:]]).replace(sys.executable, "python")
                      for name, argv in _launchers(sys.executable, "first_collective.py").items()},
        "results": summary,
        "ratio_accordrun_over_torchrun": ratio,
        "target": "first_collective ratio <= 0.7",
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "cpus": os.cpu_count(), "platform": platform.platform(),
                        "load_average_after": [round(x, 2) for x in os.getloadavg()],
                        "date": time.strftime("%Y-%m-%d %H:%M:%S")},
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")
    for name in summary:
        print(f"{name:10s} median first collective {summary[name]['first_collective_s']['median']:.2f}s, "
              f"total {summary[name]['total_s']['median']:.2f}s")
    print(f"ratio accordrun/torchrun: first collective {ratio['first_collective_s']:.2f}, "
          f"total {ratio['total_s']:.2f} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
