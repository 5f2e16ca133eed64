"""What accord's ``torch.backends`` entry point costs ``import torch``: the limit is 20 ms.

torch >= 2.5 loads every ``torch.backends`` entry point at ``import torch`` (unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); accord's registers the ``accord`` process group backend, so
``init_process_group("accord")`` needs no import of accord. Two measurements, in one run:

- the hook itself, in fresh interpreters with autoload off: ``import torch``, then time loading and
  calling accord's entry point (what torch's autoload does for it), median of ``--runs``;
- whole ``import torch`` wall time, autoload on vs off, interleaved (A B A B ...), median of each:
  noisy on a shared machine (tens of ms), which is why the first figure is the one to quote.

    .venv/bin/python benchmarks/torch_import_autoload.py --runs 15 --json benchmarks/results/torch_import_autoload.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LIMIT_MS = 20.0

# torch scans the entry points at every import whatever is installed; what accord adds is the
# load and call of its own.
_HOOK = r"""
import time, importlib.metadata as md
import torch
ours = [ep for ep in md.entry_points(group="torch.backends") if ep.value.startswith("accord.")]
assert ours, "accord's torch.backends entry point is not installed (pip install -e .)"
start = time.perf_counter()
for ep in ours:
    ep.load()()
print((time.perf_counter() - start) * 1e3)
import torch.distributed as dist
assert "ACCORD" in dist.Backend._plugins
"""


def _python(code: str, autoload: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)


def hook_ms(runs: int) -> list[float]:
    """Load + call of accord's entry point, in fresh interpreters (autoload off, so nothing ran it yet)."""
    return [float(_python(_HOOK, autoload=False).stdout.split()[0]) for _ in range(runs)]


def import_ms(runs: int) -> tuple[list[float], list[float]]:
    """``import torch`` wall times with autoload on and off, interleaved."""
    on, off = [], []
    for _ in range(runs):
        for autoload, out in ((True, on), (False, off)):
            start = time.perf_counter()
            _python("import torch", autoload)
            out.append((time.perf_counter() - start) * 1e3)
    return on, off


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    import torch

    hook = hook_ms(args.runs)
    on, off = import_ms(args.runs)
    result = {"torch": torch.__version__, "runs": args.runs, "limit_ms": LIMIT_MS,
              "hook_ms_median": statistics.median(hook), "hook_ms_max": max(hook),
              "import_ms_autoload_on_median": statistics.median(on),
              "import_ms_autoload_off_median": statistics.median(off),
              "import_ms_difference_median": statistics.median(on) - statistics.median(off)}
    print(f"accord's entry point (load + register): median {result['hook_ms_median']:.2f} ms, "
          f"max {result['hook_ms_max']:.2f} ms (limit {LIMIT_MS:.0f} ms)")
    print(f"import torch: autoload on {result['import_ms_autoload_on_median']:.0f} ms, off "
          f"{result['import_ms_autoload_off_median']:.0f} ms (median of {args.runs}, interleaved)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
