"""A DDP script on ``init_process_group("accord")`` (env://) as a user runs it under accordrun,
torchrun or mpirun. Writes OUT/<rank>.json with the final weights (a file per rank: mpirun may
interleave the ranks' output in the middle of a line).

--backend: the torch.distributed backend (accord, or gloo for comparison).
--hvd first|after: also ``import accord.torch as hvd``: hvd.init() before or after
    init_process_group, and an hvd.allreduce beside DDP's traffic.
--die-rank R: rank R kills itself (SIGKILL) while the others wait in an allreduce with it.
"""
import argparse
import json
import os
import signal
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import accord.distributed  # noqa: F401 (registers "accord" on torch < 2.5, which has no backend autoload)

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--backend", default="accord")
p.add_argument("--hvd", choices=["first", "after"])
p.add_argument("--die-rank", type=int, default=-1)
args = p.parse_args()

torch.set_num_threads(1)
# mpirun sets none of env://'s variables: a script run under it takes them from Open MPI's
for name, ompi in (("RANK", "OMPI_COMM_WORLD_RANK"), ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
                   ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")):
    if name not in os.environ and ompi in os.environ:
        os.environ[name] = os.environ[ompi]

hvd = None
if args.hvd:
    import accord.torch as hvd
if args.hvd == "first":
    hvd.init()
dist.init_process_group(args.backend, timeout=timedelta(seconds=300))
if args.hvd == "after":
    hvd.init()
rank, world = dist.get_rank(), dist.get_world_size()

if args.die_rank >= 0:
    big = torch.ones(4 << 20)
    dist.all_reduce(big)  # every rank is in the job
    if rank == args.die_rank:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    for _ in range(10000):
        dist.all_reduce(big)
    raise SystemExit(f"rank {rank}: the allreduces went on although rank {args.die_rank} was killed")

torch.manual_seed(rank)  # each rank starts elsewhere: DDP broadcasts rank 0's weights
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
result = {"rank": rank, "world": world, "weights": [t.detach().reshape(-1).tolist() for t in model.parameters()]}
if hvd is not None:
    result["hvd_sum"] = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum).item()
with open(os.path.join(args.out, f"{rank}.json"), "w") as fh:
    json.dump(result, fh)
del model  # it holds the group
dist.destroy_process_group()
if hvd is not None:
    hvd.shutdown()
