"""A RayExecutor driver on a simulated host (tests/cluster/test_cluster_ray.py): connects to the
Ray cluster at argv[1], runs 2 accord workers (1 CPU each, so one per node), prints their results
as one JSON line."""
import json
import os
import socket
import sys

import ray

from accord.ray import RayExecutor


def job():
    import torch

    import accord.torch as hvd

    hvd.init()
    try:
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
        return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
                "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(), "hostname": socket.gethostname(),
                "sum": total.item(), "store": os.environ["ACCORD_STORE_ADDR"]}
    finally:
        hvd.shutdown()


if __name__ == "__main__":
    ray.init(address=sys.argv[1], logging_level="warning")
    try:
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2, cpus_per_worker=1)
        executor.start()
        try:
            print("RESULTS " + json.dumps(executor.run(job)), flush=True)
        finally:
            executor.shutdown()
    finally:
        ray.shutdown()
