"""A plain torch.distributed DDP script (env://), as a user writes it for torchrun.

Prints one line "RESULT <json>" with what it computed, for the launcher test to check.
"""
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")  # env:// : RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)

torch.manual_seed(0)
model = DDP(torch.nn.Linear(2, 1, bias=False))
x = torch.full((1, 2), float(rank + 1))
model(x).sum().backward()  # grad of w = x, averaged over ranks by DDP
grad = model.module.weight.grad.tolist()[0]
print("RESULT " + json.dumps({"rank": rank, "world": world, "local_rank": int(os.environ["LOCAL_RANK"]),
                              "sum": t.item(), "grad": grad}), flush=True)
# As torch's examples end: the DDP model, a global, still holds the group, so it is freed during
# the interpreter's teardown, where torch 2.13 sometimes aborts; accordrun's exit release
# (accord/run/processes/exit_release.py) frees the model before that.
dist.destroy_process_group()
