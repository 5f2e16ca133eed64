"""A plain torch DDP script (env://, as for torchrun): different initial weights per rank (DDP
broadcasts rank 0's), each rank's own data, a few SGD steps. Prints one ``REPORT {json}``.

    python ddp_train.py [BACKEND]     # gloo (default) or accord (then also a large all_reduce,
                                      # and which allreduce path accord's engine took)
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, LR = 5, 0.1
BACKEND = sys.argv[1] if len(sys.argv) > 1 else "gloo"
if BACKEND == "accord":
    import accord.distributed  # noqa: F401 (registers the name where torch does not autoload it)

dist.init_process_group(BACKEND)  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
rank = dist.get_rank()
torch.manual_seed(1234 + rank)
model = DDP(torch.nn.Linear(8, 1))
gen = torch.Generator().manual_seed(100 + rank)
x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
opt = torch.optim.SGD(model.parameters(), lr=LR)
for _ in range(STEPS):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
inner = model.module
extra = {}
if BACKEND == "accord":
    from accord import engine

    # Large allreduces (exact in float32: small integers) let the engine pick its path across hosts.
    base = (torch.arange(4 << 20) % 1000).float()
    ranks_sum = dist.get_world_size() * (dist.get_world_size() + 1) // 2  # of rank + 1
    big_ok = True
    for _ in range(4):
        big = base * (rank + 1)
        dist.all_reduce(big)
        big_ok = big_ok and torch.equal(big, base * ranks_sum)
    comm = engine.communicator(0, "cpu")
    extra = {"path": type(comm).__name__, "hierarchical_allreduces": getattr(comm, "hierarchical_allreduces", None),
             "big_ok": bool(big_ok)}
print("REPORT " + json.dumps({**extra,
    "rank": rank, "size": dist.get_world_size(), "local_rank": int(os.environ["LOCAL_RANK"]),
    "group_rank": int(os.environ["GROUP_RANK"]), "hostname": socket.gethostname(),
    "master": os.environ["MASTER_ADDR"], "via_ssh": "SSH_CONNECTION" in os.environ,
    "weights": torch.cat([inner.weight.detach().view(-1), inner.bias.detach().view(-1)]).tolist(),
}), flush=True)
dist.destroy_process_group()
