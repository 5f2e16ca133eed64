"""The ``accord`` torch.distributed backend against ``gloo``, side by side in one run (one host).

    python benchmarks/torch_distributed_backend.py [--repeats 2] [--steps 10] [--models mlp,resnet50]

Each case is a fresh pair of ranks (1 torch thread each, env:// on a free port), the cases
interleaved (A B C A B C ...), medians pooled over the repeats:

- training steps of DDP on ``accord`` vs DDP on ``gloo``, and the same model through
  ``hvd.DistributedOptimizer`` (accord's Horovod path) for reference: the MLP (26 M parameters,
  batch 32 per rank) and ResNet-50 (64x64, batch 16 per rank); peak RSS per rank;
- ``independent``: the same two ranks training the same model with no communication at all (no
  process group): the no-communication limit on this machine, the fastest any backend's DDP
  could step (its ``speedup_vs_ddp_gloo`` is the largest speed-up over DDP on gloo possible);
- FSDP2 (``fully_shard``) on the MLP, accord vs gloo;
- collectives in one pair of ranks whose default group is accord's, with a gloo group beside
  it: ``dist.all_reduce`` of 64 MB on accord, ``hvd.allreduce`` of the same tensor on the same
  engine, and on gloo; a synchronous 1 KB ``dist.all_reduce`` on accord and on gloo.

Targets: DDP MLP >= 1.25x gloo, ResNet-50 >= 1.05x, FSDP2 MLP >= 1.2x; 64 MB within 10 % of
hvd.allreduce and >= 1.5x gloo's bandwidth; 1 KB <= 0.4x gloo's time; peak RSS no higher than
DDP on gloo. Writes benchmarks/results/torch_distributed_backend.json.
"""
from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import sys
import time
from datetime import timedelta

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "torch_distributed_backend.json")
BATCH = {"mlp": 32, "resnet50": 16}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup(rank: int, port: int, size: int = 2) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)


def _model_and_data(model: str, rank: int):
    import torch

    from accord.models import get_model

    torch.manual_seed(0)
    net = get_model(model, num_classes=1000)
    gen = torch.Generator().manual_seed(rank)
    shape = (BATCH[model], 1024) if model == "mlp" else (BATCH[model], 3, 64, 64)
    return net, torch.randn(shape, generator=gen), torch.randint(0, 1000, (BATCH[model],), generator=gen)


def _train(rank: int, port: int, case: str, model: str, steps: int, queue) -> None:
    """One training case on this rank: ``ddp-accord``, ``ddp-gloo``, ``hvd``, ``independent``,
    ``fsdp-accord`` or ``fsdp-gloo``."""
    _setup(rank, port)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    net, x, y = _model_and_data(model, rank)
    if case == "hvd":
        import accord.torch as hvd

        hvd.init()
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01),
                                       named_parameters=net.named_parameters())
        run = net
    elif case == "independent":  # no communication: each rank steps its own copy
        run = net
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
    else:
        backend = case.split("-")[1]
        if backend == "accord":
            import accord.distributed  # noqa: F401
        dist.init_process_group(backend, timeout=timedelta(seconds=300))
        if case.startswith("ddp"):
            run = torch.nn.parallel.DistributedDataParallel(net)
        else:
            from torch.distributed.fsdp import fully_shard

            for layer in [m for m in net.modules() if isinstance(m, torch.nn.Linear)]:
                fully_shard(layer)
            run = fully_shard(net)
        opt = torch.optim.SGD(run.parameters(), lr=0.01)
    times = []
    memory: dict[str, float] = {}
    for _ in range(steps + 3):
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(run(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
        for key, mb in _smaps_mb().items():  # after the timed step (reading it walks every mapping)
            memory[key] = max(memory.get(key, 0.0), mb)
    if case == "hvd":
        import accord.torch as hvd

        hvd.shutdown()
    elif case != "independent":
        dist.destroy_process_group()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put((rank, times[3:], rss_mb, memory))


def _smaps_mb() -> dict[str, float]:
    """This process's memory now, from /proc/self/smaps_rollup (MB): ``rss`` (every resident
    page mapped, shared ones too: accord's shm segments count in every rank that touched them),
    ``pss`` (shared pages split among the processes mapping them), ``uss`` (private pages only),
    ``shmem_pss`` (the part of ``pss`` that is shared memory). Empty where the file is missing."""
    try:
        with open("/proc/self/smaps_rollup") as fh:
            kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in fh.readlines()[1:])}
    except (OSError, ValueError):
        return {}
    return {"rss": kb["Rss"] / 1024, "pss": kb["Pss"] / 1024,
            "uss": (kb["Private_Clean"] + kb["Private_Dirty"]) / 1024, "shmem_pss": kb.get("Pss_Shmem", 0) / 1024}


def _collectives(rank: int, port: int, reps: int, queue) -> None:
    """64 MB and 1 KB all_reduce on accord's default group, hvd.allreduce, and a gloo group."""
    _setup(rank, port)
    import torch
    import torch.distributed as dist

    import accord.distributed  # noqa: F401
    import accord.torch as hvd

    dist.init_process_group("accord", timeout=timedelta(seconds=300))
    hvd.init()
    gloo = dist.new_group([0, 1], backend="gloo")
    big, small = torch.ones(16 << 20), torch.ones(256)

    def timed(fn, tensor, n):
        out = []
        for _ in range(n):
            dist.barrier()
            start = time.perf_counter()
            fn(tensor)
            out.append(time.perf_counter() - start)
        return out

    cases = {
        "allreduce_64MB_accord": (lambda t: dist.all_reduce(t), big, reps),
        "allreduce_64MB_hvd": (lambda t: hvd.allreduce_(t, op=hvd.Sum, name="big"), big, reps),
        "allreduce_64MB_gloo": (lambda t: dist.all_reduce(t, group=gloo), big, reps),
        "allreduce_1KB_accord": (lambda t: dist.all_reduce(t), small, 50 * reps),
        "allreduce_1KB_gloo": (lambda t: dist.all_reduce(t, group=gloo), small, 50 * reps),
    }
    results: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(4):  # interleaved; the first round warms up
        for name, (fn, tensor, n) in (cases.items() if round_ % 2 == 0 else reversed(cases.items())):
            got = timed(fn, tensor, n)
            if round_:
                results[name] += got
    dist.destroy_process_group()
    hvd.shutdown()
    queue.put((rank, results))


def _spawn(target, *args, nprocs: int = 2):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(rank, port, *args, queue)) for rank in range(nprocs)]
    for p in procs:
        p.start()
    got = dict((r, rest) for r, *rest in (queue.get() for _ in procs))
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"a rank of {target.__name__}{args} exited with {p.exitcode}")
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--models", default="mlp,resnet50")
    parser.add_argument("--reps", type=int, default=10, help="timed 64 MB all_reduces per case and round")
    parser.add_argument("--cases", default="",
                        help="training cases to run, comma-separated (default: all): ddp-accord, ddp-gloo, hvd, "
                             "independent, fsdp-accord, fsdp-gloo")
    parser.add_argument("--no-collectives", action="store_true", help="skip the all_reduce cases")
    parser.add_argument("--json", default=RESULTS)
    args = parser.parse_args(argv)
    import torch

    result = {"torch": torch.__version__, "load_before": os.getloadavg()[0], "training": {}, "collectives": {}}
    cases = [(model, case) for model in args.models.split(",")
             for case in ("ddp-accord", "ddp-gloo", "hvd", "independent")]
    if "mlp" in args.models.split(","):
        cases += [("mlp", "fsdp-accord"), ("mlp", "fsdp-gloo")]
    if args.cases:
        cases = [key for key in cases if key[1] in args.cases.split(",")]
    pooled: dict[tuple[str, str], dict] = {key: {"times": [], "rss": [], "smaps": []} for key in cases}
    for repeat in range(args.repeats):
        for key in cases if repeat % 2 == 0 else cases[::-1]:
            got = _spawn(_train, key[1], key[0], args.steps)
            pooled[key]["times"] += [max(a, b) for a, b in zip(got[0][0], got[1][0])]  # a step ends on both
            pooled[key]["rss"] += [got[r][1] for r in got]
            pooled[key]["smaps"] += [got[r][2] for r in got]
            print(f"{key[0]} {key[1]}: {statistics.median(pooled[key]['times']) * 1e3:.1f} ms/step", flush=True)
    for (model, case), data in pooled.items():
        result["training"].setdefault(model, {})[case] = {
            "step_ms_median": statistics.median(data["times"]) * 1e3, "steps": len(data["times"]),
            "peak_rss_mb_max": max(data["rss"]),
            "step_ms_min_max": [min(data["times"]) * 1e3, max(data["times"]) * 1e3],
            # the largest over the steps (sampled after each) and over ranks and repeats
            "smaps_peak_mb": {k: max(m.get(k, 0.0) for m in data["smaps"]) for k in ("rss", "pss", "uss", "shmem_pss")}}
    for by_case in result["training"].values():
        for case, row in by_case.items():
            base = by_case.get("fsdp-gloo" if case.startswith("fsdp") else "ddp-gloo")
            if base is not None:
                row["speedup_vs_fsdp_gloo" if case.startswith("fsdp") else "speedup_vs_ddp_gloo"] = (
                    base["step_ms_median"] / row["step_ms_median"])
    if not args.no_collectives:
        _collective_cases(result, args.reps)
    result["load_after"] = os.getloadavg()[0]
    for model, by_case in result["training"].items():
        for case, row in by_case.items():
            ratio = row.get("speedup_vs_ddp_gloo", row.get("speedup_vs_fsdp_gloo", float("nan")))
            mem = row["smaps_peak_mb"]
            print(f"{model:9s} {case:12s} {row['step_ms_median']:8.1f} ms/step  x{ratio:.2f}  "
                  f"peak RSS {row['peak_rss_mb_max']:.0f} MB (smaps: RSS {mem['rss']:.0f}, PSS {mem['pss']:.0f}, "
                  f"USS {mem['uss']:.0f}, shm PSS {mem['shmem_pss']:.0f})")
    for name, value in result["collectives"].get("ratios", {}).items():
        print(f"{name}: {value:.2f}")
    record(result, args.json, "torch_distributed_backend.py", argv)
    return 0


def _collective_cases(result: dict, reps: int) -> None:
    got = _spawn(_collectives, reps)
    for name in got[0][0]:
        times = [max(a, b) for a, b in zip(got[0][0][name], got[1][0][name])]
        result["collectives"][name] = {"ms_median": statistics.median(times) * 1e3, "calls": len(times)}
    c = result["collectives"]
    ms = {name: row["ms_median"] for name, row in c.items()}
    c["ratios"] = {
        "64MB_accord_over_hvd_time": ms["allreduce_64MB_accord"] / ms["allreduce_64MB_hvd"],
        "64MB_bandwidth_accord_over_gloo": ms["allreduce_64MB_gloo"] / ms["allreduce_64MB_accord"],
        "1KB_accord_over_gloo_time": ms["allreduce_1KB_accord"] / ms["allreduce_1KB_gloo"],
    }


if __name__ == "__main__":
    sys.exit(main())
