"""Sharded optimizer state (ZeRO-1/2) against the unsharded DistributedOptimizer and torch's
ZeroRedundancyOptimizer + DDP on Gloo, side by side in one run.

    python benchmarks/sharded_optimizer.py [--width 2560] [--layers 4] [--steps 10] [--warmup 3]
                                           [--budget-mb 600] [--skip-limit]

2 ranks on this host, one thread each, Adam. For each mode (unsharded, zero1, zero2,
torch_zero_ddp) a fresh pair of ranks trains an MLP (``--layers`` square layers of ``--width``:
26 M parameters by default): warm-up steps, then measured steps between barriers. Reported per
mode: step time (mean +- 1.96 sigma over steps, slowest rank), optimizer state bytes per rank
(the tensors the optimizer holds), peak RSS per rank (``ru_maxrss``) and samples/s.

Then the largest MLP that trains under a per-process memory limit: each rank sets
``RLIMIT_AS`` (``ulimit -v``) to its address space after start-up plus ``--budget-mb``, and
widths grow until a rank fails to allocate; unsharded and zero2 are compared.

The machine is shared (2 vCPUs, other jobs): timings are noisy; compare modes within one run.
Writes benchmarks/results/sharded_optimizer.json.

``--worker MODE`` runs one rank of one mode under a launcher (benchmarks/cluster_sharded_optimizer.py
starts it with accordrun on simulated hosts); rank 0 prints ``RESULT {...}``, the summary of
every rank.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time

from recording import record

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "sharded_optimizer.json")
MODES = ("unsharded", "zero1", "zero2", "torch_zero_ddp")
BATCH = 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _address_space_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _mlp(width: int, layers: int):
    import torch

    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1])


def _state_bytes(opt, mode: str) -> int:
    import torch

    if mode == "torch_zero_ddp":
        state = opt.optim.state
    elif mode == "unsharded":
        state = opt.state
    else:
        state = opt._local.state  # (the shards' optimizer: what this rank keeps)
    return sum(v.numel() * v.element_size() for entry in state.values() for v in entry.values()
               if torch.is_tensor(v))


def _worker(mode: str, width: int, layers: int, steps: int, warmup: int, port: int,
            budget_mb: int, report: bool = False) -> dict:
    import resource

    import torch

    import accord.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if budget_mb:
        limit = _address_space_bytes() + budget_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        model = _mlp(width, layers)
        forward = model
        if mode == "torch_zero_ddp":
            import torch.distributed as dist
            from torch.distributed.optim import ZeroRedundancyOptimizer
            from torch.nn.parallel import DistributedDataParallel

            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
            forward = DistributedDataParallel(model)
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-5)
        else:
            opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-5),
                                           named_parameters=model.named_parameters(),
                                           shard_optimizer_state=mode != "unsharded",
                                           shard_gradients=mode == "zero2")
        gen = torch.Generator().manual_seed(rank)
        x, y = torch.randn(BATCH, width, generator=gen), torch.randn(BATCH, width, generator=gen)
        times = []
        for step in range(warmup + steps):
            hvd.barrier()
            start = time.perf_counter()
            torch.nn.functional.mse_loss(forward(x), y).backward()
            opt.step()
            opt.zero_grad()
            hvd.barrier()
            if step >= warmup:
                times.append(time.perf_counter() - start)
    except (MemoryError, RuntimeError) as exc:  # out of the address-space budget
        if not budget_mb:
            raise
        print(f"rank {rank}: {mode} width {width} does not fit: {str(exc).splitlines()[0]}", flush=True)
        os._exit(3)  # the launcher stops the other rank
    result = {"rank": rank, "times": times, "state_bytes": _state_bytes(opt, mode),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "params": sum(p.numel() for p in model.parameters())}
    if mode == "torch_zero_ddp":
        from accord.group_teardown import destroy_process_group

        destroy_process_group()
    if report:  # (under a launcher: rank 0 prints every rank's summary)
        every = hvd.allgather_object(result)
        if rank == 0:
            print("RESULT " + json.dumps({**_summary(every), "size": size}), flush=True)
    hvd.shutdown()
    return result


def _run(mode: str, width: int, layers: int, steps: int, warmup: int, budget_mb: int = 0) -> list[dict] | None:
    from accord.errors import WorkerFailedError
    from accord.run.functions.spawn import spawn

    try:
        return spawn(_worker, args=(mode, width, layers, steps, warmup, _free_port(), budget_mb), nprocs=2)
    except WorkerFailedError:
        if not budget_mb:
            raise
        return None


def _summary(per_rank: list[dict]) -> dict:
    # a step ends at a barrier: the slowest rank's time is the step's
    steps = [max(t) for t in zip(*(r["times"] for r in per_rank))]
    mean = statistics.mean(steps)
    ci = 1.96 * statistics.stdev(steps) if len(steps) > 1 else 0.0
    return {"step_ms_mean": round(mean * 1e3, 1), "step_ms_ci95": round(ci * 1e3, 1),
            "samples_per_s": round(BATCH * len(per_rank) / mean, 1),
            "state_mb_per_rank": [round(r["state_bytes"] / 2**20, 1) for r in per_rank],
            "peak_rss_mb_per_rank": [round(r["peak_rss_mb"], 1) for r in per_rank],
            "params": per_rank[0]["params"]}


def _largest(mode: str, widths: list[int], layers: int, budget_mb: int) -> int | None:
    best = None
    for width in widths:
        if _run(mode, width, layers, steps=2, warmup=1, budget_mb=budget_mb) is None:
            break
        best = width
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=2560)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget-mb", type=int, default=600,
                        help="address space each rank may add after start-up (the memory-limit part)")
    parser.add_argument("--skip-limit", action="store_true", help="skip the memory-limit part")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--worker", choices=MODES[:3], help="run one rank of this mode (under a launcher)")
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker, args.width, args.layers, args.steps, args.warmup, 0, 0, report=True)
        return 0
    import torch

    load_before = os.getloadavg()
    modes = {mode: _summary(_run(mode, args.width, args.layers, args.steps, args.warmup)) for mode in MODES}
    base = modes["unsharded"]
    for m in modes.values():
        m["step_vs_unsharded"] = round(m["step_ms_mean"] / base["step_ms_mean"], 3)
        m["state_vs_unsharded"] = round(max(m["state_mb_per_rank"]) / max(base["state_mb_per_rank"]), 3)
        m["peak_rss_saved_mb"] = round(max(base["peak_rss_mb_per_rank"]) - max(m["peak_rss_mb_per_rank"]), 1)
    result = {"modes": modes}
    if not args.skip_limit:
        widths = [1024, 1536, 2048, 2560, 3072, 3584, 4096, 4608]
        result["memory_limit"] = {"budget_mb_per_rank": args.budget_mb, "layers": args.layers, "widths": widths,
                                  "largest_width": {m: _largest(m, widths, args.layers, args.budget_mb)
                                                    for m in ("unsharded", "zero2")}}
    result["environment"] = {"torch": torch.__version__, "python": platform.python_version(), "world_size": 2,
                             "cpus": os.cpu_count(), "threads_per_rank": 1, "batch_per_rank": BATCH,
                             "optimizer": "Adam", "width": args.width, "layers": args.layers,
                             "steps": args.steps, "warmup": args.warmup,
                             "load_before": [round(v, 2) for v in load_before],
                             "load_after": [round(v, 2) for v in os.getloadavg()]}
    record(result, args.out, "sharded_optimizer.py", argv)
    print(f"MLP {args.layers} x {args.width} ({base['params'] / 1e6:.1f} M parameters), Adam, 2 ranks")
    print(f"{'mode':<16} {'step ms':>16} {'vs unsharded':>12} {'state MB/rank':>14} {'peak RSS MB/rank':>18} "
          f"{'samples/s':>10}")
    for mode, m in modes.items():
        print(f"{mode:<16} {m['step_ms_mean']:8.1f} +- {m['step_ms_ci95']:5.1f} {m['step_vs_unsharded']:12.3f} "
              f"{max(m['state_mb_per_rank']):14.1f} {max(m['peak_rss_mb_per_rank']):18.1f} "
              f"{m['samples_per_s']:10.1f}")
    if "memory_limit" in result:
        lim = result["memory_limit"]
        print(f"largest width under +{args.budget_mb} MB address space per rank ({args.layers} layers): "
              + ", ".join(f"{m} {w}" for m, w in lim["largest_width"].items()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
