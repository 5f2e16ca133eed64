"""Run the plain DDP script (ddp_allreduce.py) under accordrun N times in a row and count the
runs that abort at exit ("terminate called without an active exception") or fail otherwise:

    .venv/bin/python tests/integration/scripts/repeat_ddp.py --runs 100

Prints one line per failed run and a summary ``runs=N aborts=A other_failures=F``; exits 1 when
any run failed. ``--script`` runs another worker script the same way (to compare variants);
arguments after ``--`` go to accordrun before the command (``-- --no-exit-release`` shows the
aborts that the launcher's exit release prevents).
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--script", default=str(HERE / "ddp_allreduce.py"))
    parser.add_argument("launcher_args", nargs="*", help="more accordrun flags (after --)")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    aborts = others = 0
    for i in range(1, args.runs + 1):
        proc = subprocess.run([sys.executable, "-m", "accord.run", "-np", "2", *args.launcher_args,
                               sys.executable, args.script],
                              capture_output=True, text=True, timeout=300, env=env)
        if "terminate called" in proc.stderr:
            aborts += 1
            print(f"run {i}: abort (exit {proc.returncode})\n{proc.stderr[-2000:]}", flush=True)
        elif proc.returncode != 0 or proc.stdout.count("RESULT ") != 2:
            others += 1
            print(f"run {i}: exit {proc.returncode}\n{proc.stderr[-2000:]}", flush=True)
    print(f"runs={args.runs} aborts={aborts} other_failures={others}", flush=True)
    return 1 if aborts or others else 0


if __name__ == "__main__":
    sys.exit(main())
