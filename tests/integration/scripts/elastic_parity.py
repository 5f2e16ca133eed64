"""A worker for the horovodrun-parity tests of elastic jobs (test_launcher_elastic_parity.py).

    python elastic_parity.py --steps N [--die-id I --die-step S] [--grow-marker PATH]

One weight w (float64, 0 at start) trained by SGD (lr 1) through a DistributedOptimizer built
before ``hvd.elastic.run``, as Horovod's examples do. At every step rank r's loss is (r + 1) * w,
so its gradient is r + 1 and an averaged step moves w by -(size + 1) / 2.

With --grow-marker the job starts with one worker: it creates PATH (the test's discovery script
then prints a second slot) and keeps committing, without training, until the new worker joins.
The worker whose HOROVOD_RANK at start is I raises at step S (before its step; Horovod's test
fails workers the same way). Every rank that finishes prints ``DONE {...}``: its start rank, its
rank and size, w, the world size of each of its steps and the size at each reset callback.
"""
import argparse
import json
import os
import time
from pathlib import Path

import torch

import accord.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--die-id", type=int, default=-1)
parser.add_argument("--die-step", type=int, default=-1)
parser.add_argument("--grow-marker", default=None)
args = parser.parse_args()

torch.set_num_threads(1)
hvd.init()
start_rank = int(os.environ["HOROVOD_RANK"])
model = torch.nn.Linear(1, 1, bias=False).double()
with torch.no_grad():
    model.weight.zero_()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, opt, step=0, sizes=[])
resets = []
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
ONE = torch.ones(1, 1, dtype=torch.float64)


@hvd.elastic.run
def train(state):
    while state.step < args.steps:
        if args.grow_marker and hvd.size() == 1:
            Path(args.grow_marker).touch()
            time.sleep(0.05)
            state.commit()  # raises HostsUpdatedInterrupt once the new worker has asked to join
            continue
        if start_rank == args.die_id and state.step == args.die_step:
            raise RuntimeError(f"planned failure of worker {start_rank} at step {state.step}")
        opt.zero_grad()
        (model(ONE).sum() * (hvd.rank() + 1)).backward()
        opt.step()
        state.sizes.append(hvd.size())
        state.step += 1
        state.commit()


train(state)
print("DONE " + json.dumps({"start_rank": start_rank, "rank": hvd.rank(), "size": hvd.size(),
                            "w": model.weight.item(), "sizes": state.sizes, "resets": resets}), flush=True)
hvd.shutdown()
