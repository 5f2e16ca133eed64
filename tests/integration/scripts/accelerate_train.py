"""A Hugging Face Accelerate training script on 2 CPU processes, on the accord torch.distributed
backend or on Gloo (the baseline), started by ``accelerate launch`` or by accordrun:

    accelerate launch --multi_gpu --num_processes 2 accelerate_train.py OUT accord
    python -m accord.run -np 2 python accelerate_train.py OUT accord   # or ... OUT gloo

For accord, the one line added is ``dist.init_process_group("accord")`` before the Accelerator:
on CPU, accelerate replaces any backend it is given by "gloo" (or "mpi"), so the process group
must exist before it looks (docs/accelerate.md). Writes ``OUT/accelerate-BACKEND-LAUNCHER.RANK.json``.
"""
import os
import sys

import framework_common as common
import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

OUT, BACKEND, LAUNCHER = sys.argv[1], sys.argv[2], sys.argv[3]

if BACKEND == "accord":
    dist.init_process_group("accord")  # the line added for accord
accelerator = Accelerator(cpu=True)

rank = accelerator.process_index
model = common.network(common.init_seed(rank))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loader = DataLoader(TensorDataset(*common.data()), batch_size=common.BATCH)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for _ in range(2):  # epochs
    for x, y in loader:
        accelerator.backward(F.mse_loss(model(x), y))
        accelerator.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad()
gathered = accelerator.gather(torch.tensor([rank]))
common.write(OUT, f"accelerate-{BACKEND}-{LAUNCHER}", rank, {
    "weights": common.weights(accelerator.unwrap_model(model)), "backend": dist.get_backend(),
    "distributed_type": str(accelerator.distributed_type), "processes": accelerator.num_processes,
    "gathered": gathered.tolist(), "rank_env": os.environ.get("RANK")})
accelerator.end_training()  # destroys the process group
