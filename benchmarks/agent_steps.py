"""Worker of benchmarks/cluster_agents.py, the same under torchrun and accordrun agents: plain
torch.distributed (gloo, env://) so that only the launchers differ. Prints ``FIRST <time>`` on
rank 0 after the first allreduce, ``STEP {...}`` on rank 0 after every step (``done``: the
steps done), and, in the first attempt, ``KILL <time>`` on --kill-rank just before it SIGKILLs
itself at --kill-step. The step to resume at is in --ckpt (written by rank 0 after each step)."""
import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--kill-step", type=int, default=-1)
p.add_argument("--kill-rank", type=int, default=3)
p.add_argument("--ckpt", required=True)
args = p.parse_args()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.ones(1024)
dist.all_reduce(value)
if rank == 0:
    print(f"FIRST {time.time():.6f}", flush=True)
start = int(open(args.ckpt).read()) if os.path.exists(args.ckpt) else 0
for step in range(start, args.steps):
    if attempt == 0 and step == args.kill_step and rank == args.kill_rank:
        print(f"KILL {time.time():.6f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(value)
    time.sleep(0.05)
    if rank == 0:
        with open(args.ckpt + ".tmp", "w") as fh:
            fh.write(str(step + 1))
        os.replace(args.ckpt + ".tmp", args.ckpt)
        print("STEP " + json.dumps({"attempt": attempt, "step": step, "done": step + 1, "t": time.time()}), flush=True)
dist.destroy_process_group()
