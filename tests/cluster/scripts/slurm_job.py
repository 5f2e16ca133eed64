"""A Horovod-style worker started by SLURM's srun (no accordrun): ``hvd.init()`` reads SLURM's
variables. Allreduces and allgathers exactly representable values and prints one ``REPORT {json}``
(also written to DIR/report.<rank>.json with ``--report-dir DIR``: srun interleaves long lines)."""
import json
import os
import socket
import sys

import torch

import accord.torch as hvd

hvd.init()
rank = hvd.rank()
summed = hvd.allreduce(torch.arange(8, dtype=torch.float32) * (rank + 1), op=hvd.Sum, name="sum")
gathered = hvd.allgather(torch.tensor([[rank, hvd.local_rank()]]), name="ranks")
root = hvd.broadcast(torch.tensor([rank * 10.0 + 7]), root_rank=hvd.size() - 1, name="bcast")
out = {
    "rank": rank, "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "hostname": socket.gethostname(),
    "slurm": {k: os.environ.get(k) for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID")},
    "accord_rank": os.environ.get("ACCORD_RANK"),
    "sum": summed.tolist(), "gathered": gathered.tolist(), "bcast": root.tolist(),
}
print("REPORT " + json.dumps(out), flush=True)
if "--report-dir" in sys.argv:
    with open(os.path.join(sys.argv[sys.argv.index("--report-dir") + 1], f"report.{rank}.json"), "w") as fh:
        json.dump(out, fh)
hvd.shutdown()
