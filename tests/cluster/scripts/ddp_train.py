"""A plain torch DDP script (env://, as for torchrun): different initial weights per rank (DDP
broadcasts rank 0's), each rank's own data, a few SGD steps. Prints one ``REPORT {json}``."""
import json
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, LR = 5, 0.1

dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher
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
print("REPORT " + json.dumps({
    "rank": rank, "size": dist.get_world_size(), "local_rank": int(os.environ["LOCAL_RANK"]),
    "group_rank": int(os.environ["GROUP_RANK"]), "hostname": socket.gethostname(),
    "master": os.environ["MASTER_ADDR"], "via_ssh": "SSH_CONNECTION" in os.environ,
    "weights": torch.cat([inner.weight.detach().view(-1), inner.bias.detach().view(-1)]).tolist(),
}), flush=True)
dist.destroy_process_group()
