"""A Horovod-style worker for the simulated cluster: reports where it runs and what it sees,
allreduces exactly representable values, trains a small model for a few steps and, in a job with
parameter servers, pushes and pulls through dist_sync and dist_async. Prints one ``REPORT {json}``.

With ``--report-dir DIR`` the report also goes to DIR/report.<rank>.json. With ``--pause DIR`` it writes
DIR/ready.<rank> once everything is set up and waits for DIR/go before shutting down (so that a test can look
at the hosts' sockets meanwhile).
"""
import hashlib
import json
import os
import socket
import sys
import time

import numpy as np
import torch

import accord.torch as hvd

N = 1_500_001  # 6 MB of float32: pipelined in pieces; not a multiple of the local size
STEPS, LR = 5, 0.1

hvd.init()
rank = hvd.rank()
out = {
    "rank": rank, "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
    "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "hostname": socket.gethostname(),
    "env_hostname": os.environ.get("ACCORD_HOSTNAME"), "cwd": os.getcwd(),
}


def _allreduce_path():
    # which communicator the engine allreduces with (hierarchical or flat)
    try:
        from accord.engine import session

        comm = session.communicator(0, "cpu")
    except Exception as exc:  # reported, so the test shows why the path is unknown
        return f"unknown ({exc})", None
    return type(comm).__name__, getattr(comm, "hierarchical_allreduces", None)


# sums of small integers are exact in float32, whatever the order of the additions
values = (torch.arange(N) % 1000).float() * (rank + 1)
ints = torch.arange(N // 10, dtype=torch.int64) * (rank + 1) - 7
summed = hvd.allreduce(values, op=hvd.Sum, name="exact.f32")
summed_ints = hvd.allreduce(ints, op=hvd.Sum, name="exact.i64")
out["sum_f32"] = hashlib.sha256(summed.numpy().tobytes()).hexdigest()
out["sum_i64"] = hashlib.sha256(summed_ints.numpy().tobytes()).hexdigest()
out["path"], before = _allreduce_path()

# Horovod-style training: different initial weights per rank, broadcast from rank 0, averaged
# gradients of each rank's own data
torch.manual_seed(1234 + rank)
model = torch.nn.Linear(8, 1)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
gen = torch.Generator().manual_seed(100 + rank)
x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                               named_parameters=model.named_parameters())
for _ in range(STEPS):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
out["weights"] = torch.cat([model.weight.detach().view(-1), model.bias.detach().view(-1)]).tolist()
_, after = _allreduce_path()
out["hierarchical_allreduces"] = None if after is None else after

if os.environ.get("DMLC_ROLE") == "worker":
    import accord.kvstore as kvs
    from accord.kvstore import optimizers

    kv = kvs.create("dist_sync")
    kv.init("big", np.zeros(2_000_000, np.float32))  # above the big-array bound: split over servers
    kv.push("big", np.full(2_000_000, kv.rank + 1, np.float32))
    pulled = kv.pull("big")
    out["kv_sync"] = [float(pulled.min()), float(pulled.max())]
    kv.close()
    kv = kvs.create("dist_async")
    kv.init("w", np.zeros(20, np.float32))
    kv.set_optimizer(optimizers.create("sgd", learning_rate=0.5))
    for _ in range(2):
        kv.push("w", np.full(20, kv.rank + 1.0, np.float32))
    kv.barrier()
    out["kv_async"] = kv.pull("w").tolist()
    pause = sys.argv[sys.argv.index("--pause") + 1] if "--pause" in sys.argv else None
    if pause:  # keep the kvstore connections open while the test looks at the sockets
        open(os.path.join(pause, f"ready.{rank}"), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(pause, "go")) and time.monotonic() < deadline:
            time.sleep(0.1)
    kv.close()

print("REPORT " + json.dumps(out), flush=True)
if "--report-dir" in sys.argv:  # mpirun interleaves the ranks' long lines: a file per rank too
    with open(os.path.join(sys.argv[sys.argv.index("--report-dir") + 1], f"report.{rank}.json"), "w") as fh:
        json.dump(out, fh)
hvd.shutdown()
