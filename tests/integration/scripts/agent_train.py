"""Worker for the agent tests: a deterministic "training" whose gradients are summed over the
job's store (torch-free, so it starts fast), with a checkpoint on disk and injected failures.

Each step every rank adds ``(rank + 1) * (step + 1)`` to the store; the weight moves by
``--lr`` times their mean. Rank 0 writes ``{step, w}`` to ``--ckpt`` after every step (atomically);
every rank resumes from it. ``--fail A:S:R[:kill]`` (repeatable): in attempt A
(``ACCORD_RESTART_COUNT``), rank R exits 3 (or SIGKILLs itself) at step S. Prints
``RESULT <json>`` at the end and ``ATTEMPT <json>`` at the start.
"""
import argparse
import json
import os
import signal
import sys
import time

from accord.store.connection import StoreConnection

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--lr", type=float, default=0.5)
p.add_argument("--ckpt", default=None)
p.add_argument("--fail", action="append", default=[])
p.add_argument("--pid-dir", default=None)
p.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep before the first step (attempt 0)")
args = p.parse_args()

rank, size = int(os.environ["ACCORD_RANK"]), int(os.environ["ACCORD_SIZE"])
attempt = int(os.environ.get("ACCORD_RESTART_COUNT", "0"))
if args.pid_dir:
    with open(os.path.join(args.pid_dir, f"{attempt}.{rank}.pid"), "w") as fh:
        fh.write(str(os.getpid()))
store = StoreConnection(os.environ["ACCORD_STORE_ADDR"], int(os.environ["ACCORD_STORE_PORT"]),
                        bytes.fromhex(os.environ["ACCORD_JOB_SECRET"]), timeout=60.0)
start, w = 0, 0.0
if args.ckpt and os.path.exists(args.ckpt):
    with open(args.ckpt) as fh:
        saved = json.load(fh)
    start, w = saved["step"] + 1, saved["w"]
print("ATTEMPT " + json.dumps({"rank": rank, "attempt": attempt, "start": start,
                               "torch_count": os.environ.get("TORCHELASTIC_RESTART_COUNT")}), flush=True)
if attempt == 0:
    time.sleep(args.sleep)
fails = [f.split(":") for f in args.fail]
for step in range(start, args.steps):
    for f in fails:
        if int(f[0]) == attempt and int(f[1]) == step and int(f[2]) == rank:
            print(f"rank {rank} failing at step {step} of attempt {attempt}", file=sys.stderr, flush=True)
            if len(f) > 3 and f[3] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            sys.exit(3)
    store.set(f"g/{step}/{rank}", str((rank + 1) * (step + 1)))
    grads = [float(v) for v in store.multi_get([f"g/{step}/{r}" for r in range(size)])]
    w -= args.lr * sum(grads) / size
    if rank == 0 and args.ckpt:
        tmp = args.ckpt + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"step": step, "w": w}, fh)
        os.replace(tmp, args.ckpt)
    store.set(f"done/{step}/{rank}", "1")  # nobody starts step+1 before rank 0 saved step
    store.wait([f"done/{step}/{r}" for r in range(size)])
print("RESULT " + json.dumps({"rank": rank, "size": size, "w": w, "attempt": attempt}), flush=True)
store.close()
