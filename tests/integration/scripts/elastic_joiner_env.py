"""A worker for the horovodrun-parity test of a worker added to a running elastic job
(test_launcher_elastic_parity.py): horovodrun starts it with the rank it will have.

    python elastic_joiner_env.py MARKER

Prints ``ENV {...}``: its member id, its coordinates as its environment gives them before
``hvd.init()``, and as ``hvd.*`` reports them after. Then, in ``hvd.elastic.run``, the worker of
rank 0 creates MARKER (the test's discovery script then prints another set of hosts) and every
worker commits until a worker added later (id >= FIRST_IDS, the number of workers the job
started with) is part of the job; with it, the job trains 2 steps (an allreduce each) and every
rank prints ``DONE {...}`` with its id, rank and size.
"""
import os

KEYS = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
        "HOROVOD_CROSS_SIZE", "ACCORD_RANK", "ACCORD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
        "LOCAL_WORLD_SIZE", "GROUP_RANK")
BEFORE = {k: os.environ.get(k) for k in KEYS}  # as the launcher gave them, before any import

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import accord.torch as hvd  # noqa: E402

FIRST_IDS = 2
member = int(os.environ["ACCORD_ELASTIC_ID"])
marker = Path(sys.argv[1])
torch.set_num_threads(1)
hvd.init()
after = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
         "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size()}
print("ENV " + json.dumps({"id": member, "before": BEFORE, "after": after}), flush=True)
state = hvd.elastic.TorchState(steps=0)


@hvd.elastic.run
def train(state):
    while state.steps < 2:
        if max(hvd.allgather_object(member)) >= FIRST_IDS:
            total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="step")
            assert total.item() == hvd.size(), total
            state.steps += 1
        else:
            if hvd.rank() == 0:
                marker.touch()
            time.sleep(0.05)
        state.commit()  # raises HostsUpdatedInterrupt once the job's hosts changed


train(state)
print("DONE " + json.dumps({"id": member, "rank": hvd.rank(), "size": hvd.size()}), flush=True)
hvd.shutdown()
