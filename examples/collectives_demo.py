"""A first accord job: every rank allreduces, allgathers and broadcasts real tensors.

Run it on 2 ranks:   accordrun -np 2 python examples/collectives_demo.py
Each rank checks the results against values it computes itself, prints them, and exits non-zero
on a wrong answer, so the launcher's fail-fast report shows up if anything is off.
"""
from __future__ import annotations

import sys
import time

import torch

from accord.comm.ops import ReduceOp
from accord.engine import session


def main() -> int:
    session.init()
    topo = session.topology()
    rank, size = topo.rank, topo.size
    ok = True

    # allreduce: rank r contributes (r + 1) * [1, 2, 3, 4]; the sum is size*(size+1)/2 * [1, 2, 3, 4].
    base = torch.arange(1, 5, dtype=torch.float32)
    summed = session.synchronize(session.submit("allreduce", base * (rank + 1), name="demo.sum"))
    expected = base * (size * (size + 1) / 2)
    ok &= torch.equal(summed, expected)
    averaged = session.synchronize(
        session.submit("allreduce", base * (rank + 1), name="demo.avg", reduce_op=ReduceOp.AVERAGE))
    ok &= torch.allclose(averaged, expected / size)

    # allgather with a ragged first dimension: rank r sends r + 1 rows filled with r.
    rows = torch.full((rank + 1, 2), float(rank))
    gathered = session.synchronize(session.submit("allgather", rows, name="demo.gather"))
    ok &= gathered.shape == (size * (size + 1) // 2, 2)
    ok &= torch.equal(gathered[:, 0], torch.cat([torch.full((r + 1,), float(r)) for r in range(size)]))

    # broadcast from the last rank: everyone ends with its tensor.
    payload = torch.tensor([10.0 * rank, 7.0])
    got = session.synchronize(session.submit("broadcast", payload, name="demo.bcast", root_rank=size - 1))
    ok &= torch.equal(got, torch.tensor([10.0 * (size - 1), 7.0]))

    # A burst of 64 async allreduces, fused by the engine, to show the timing.
    grads = [torch.full((25_000,), float(rank)) for _ in range(64)]
    start = time.perf_counter()
    handles = [session.submit("allreduce", g, name=f"demo.grad.{i}") for i, g in enumerate(grads)]
    results = [session.synchronize(h) for h in handles]
    elapsed = time.perf_counter() - start
    ok &= all(torch.all(r == size * (size - 1) / 2).item() for r in results)

    print(f"rank {rank}/{size} host {topo.hostnames[rank]}: allreduce sum {summed.tolist()}, "
          f"average {averaged.tolist()}")
    print(f"rank {rank}/{size}: allgather (ragged) column 0 {gathered[:, 0].tolist()}")
    print(f"rank {rank}/{size}: broadcast from rank {size - 1} {got.tolist()}")
    print(f"rank {rank}/{size}: 64 async allreduces of 100 KB in {elapsed * 1e3:.1f} ms "
          f"({64 * 100e3 / elapsed / 1e6:.0f} MB/s)")
    print(f"rank {rank}/{size}: {'all results correct' if ok else 'WRONG RESULTS'}")
    session.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
