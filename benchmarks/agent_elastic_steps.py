"""Worker of benchmarks/cluster_agents.py's in-memory runs (accordrun agents, ``--nnodes 2:3``):
the loop of benchmarks/agent_steps.py (an allreduce of 1024 floats and 50 ms a step) under
``hvd.elastic.run``, its step committed after each one instead of written to disk. Prints
``FIRST <time>`` on rank 0 after the first allreduce, ``STEP {"size", "step", "t"}`` on rank 0
after every step, and ``KILL <time>`` on the worker of --kill-rank just before it SIGKILLs
itself at --kill-step; the survivors re-form without it and go on from the last commit."""
import argparse
import json
import os
import signal
import time

import torch

import accord.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--kill-step", type=int, default=-1)
p.add_argument("--kill-rank", type=int, default=3)
args = p.parse_args()
torch.set_num_threads(1)
hvd.init()
first_rank = hvd.rank()
value = torch.ones(1024)
hvd.allreduce(value, name="first")
if hvd.rank() == 0:
    print(f"FIRST {time.time():.6f}", flush=True)
state = hvd.elastic.TorchState(step=0)


@hvd.elastic.run
def train(state):
    while state.step < args.steps:
        if state.step == args.kill_step and first_rank == args.kill_rank:
            print(f"KILL {time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(value, name="step")
        time.sleep(0.05)
        state.step += 1
        state.commit()
        if hvd.rank() == 0:
            print("STEP " + json.dumps({"size": hvd.size(), "step": state.step, "done": state.step,
                                          "t": time.time()}), flush=True)


train(state)
hvd.shutdown()
