"""Worker for failure tests.

Every rank writes its pid (and, with --grandchild, the pid of a child it starts) to
PID_DIR/<rank>.pids, then sleeps. Rank --fail-rank, after --delay seconds, fails in --mode:
exit (with --code), raise (uncaught, with accord's error file hook installed), record (raise
inside an @record function), kill (SIGKILL itself). --ignore-term makes the others ignore
SIGTERM, noting in PID_DIR/<rank>.term that one came (only SIGKILL then ends them).
"""
import argparse
import os
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--pid-dir", required=True)
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--mode", default="exit", choices=["exit", "raise", "record", "kill"])
p.add_argument("--code", type=int, default=3)
p.add_argument("--delay", type=float, default=0.3)
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--grandchild", action="store_true")
args = p.parse_args()

rank = int(os.environ["ACCORD_RANK"])
pids = [os.getpid()]
if args.grandchild:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pids.append(child.pid)
if args.ignore_term and rank != args.fail_rank:
    def note_term(signum, frame):
        open(os.path.join(args.pid_dir, f"{rank}.term"), "w").close()

    signal.signal(signal.SIGTERM, note_term)
tmp = os.path.join(args.pid_dir, f"{rank}.tmp")
with open(tmp, "w") as fh:
    fh.write(" ".join(str(p) for p in pids))
os.replace(tmp, os.path.join(args.pid_dir, f"{rank}.pids"))
print(f"rank {rank} ready", flush=True)

if rank == args.fail_rank:
    time.sleep(args.delay)
    print(f"rank {rank} failing with {args.mode}", file=sys.stderr, flush=True)
    if args.mode == "exit":
        sys.exit(args.code)
    if args.mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    from accord import worker_contract

    if args.mode == "raise":
        worker_contract.install()
        raise ValueError(f"bad value on rank {rank}")

    @worker_contract.record
    def main():
        raise KeyError(f"missing key on rank {rank}")

    main()
time.sleep(60)
