"""An hvd.elastic.run training loop for the launcher's --min-np tests.

    python elastic_train.py --steps N --die-rank R --die-step S

Rank R exits with status 3 (os._exit: no cleanup, like a crash) when it reaches step S after
committing; with ``--kill-rank R --kill-step S`` rank R is SIGKILLed in the middle of step S,
between its backward pass and its optimizer step. The others carry on under hvd.elastic.run.
Every rank that finishes prints
``DONE {"rank": ..., "size": ..., "sizes": [...], "weight": [...]}``.
"""
import argparse
import json
import os
import signal

import torch

import accord.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--die-rank", type=int, default=-1)
parser.add_argument("--die-step", type=int, default=2)
parser.add_argument("--kill-rank", type=int, default=-1)
parser.add_argument("--kill-step", type=int, default=2)
args = parser.parse_args()

torch.set_num_threads(1)
hvd.init()
first_rank = hvd.rank()
torch.manual_seed(0)
model = torch.nn.Linear(3, 1).double()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, opt, step=0, sizes=[])


@hvd.elastic.run
def train(state):
    while state.step < args.steps:
        if first_rank == args.die_rank and state.step == args.die_step:
            os._exit(3)
        gen = torch.Generator().manual_seed(100 * state.step + hvd.rank())
        x = torch.randn(4, 3, generator=gen, dtype=torch.float64)
        y = torch.randn(4, 1, generator=gen, dtype=torch.float64)
        torch.nn.functional.mse_loss(state.model(x), y).backward()
        if first_rank == args.kill_rank and state.step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.sizes.append(hvd.size())
        state.step += 1
        state.commit()


train(state)
print("DONE " + json.dumps({"rank": hvd.rank(), "first_rank": first_rank, "size": hvd.size(),
                            "sizes": state.sizes, "weight": model.weight.detach().flatten().tolist()}),
      flush=True)
hvd.shutdown()
