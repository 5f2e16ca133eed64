"""Checks that run on every rank of a job whose tensors live on one CUDA device.

Used by tests/gpu/ (one rank on NCCL; two ranks sharing one GPU through host staging). Every
rank regenerates every rank's input from (case, rank), so each expected value is computed here
on the CPU in float64, independently of accord. Failures are collected, not raised, so one
wrong value does not desynchronise the ranks; tests assert the returned list is empty.

``device`` is "cuda" on a GPU machine. ``ACCORD_GPU_TESTS_ON_CPU=1`` runs the same checks with
"cpu" (stream checks skipped): that only checks the checks themselves on a machine without a
GPU; it proves nothing about CUDA.
"""
from __future__ import annotations

import os
import zlib
from typing import Any, Callable

import numpy as np
import torch

ON_CPU = os.environ.get("ACCORD_GPU_TESTS_ON_CPU", "") == "1"
DEVICE = "cpu" if ON_CPU else "cuda"
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8")
HALF = ("float16", "bfloat16")


def skip_reason() -> str | None:
    """Why tests/gpu cannot run here (None when they can)."""
    if ON_CPU:
        return None
    if not torch.cuda.is_available():
        return (f"needs a CUDA device: torch {torch.__version__} (CUDA build: "
                f"{torch.version.cuda is not None}) sees none; run `bash scripts/gpu_check.sh` "
                "on a GPU machine")
    return None


def values(case: str, rank: int, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    """Rank ``rank``'s CPU input for ``case``: small integers, exact in every dtype (products of
    a few ranks stay exact in float16 and int8)."""
    rng = np.random.default_rng(zlib.crc32(f"{case}|{rank}".encode()))
    low, high = (0, 4) if dtype == "uint8" else (-3, 4)
    return torch.from_numpy(rng.integers(low, high, size=shape).astype(np.float64)).to(getattr(torch, dtype))


class Collector:
    """Failures of one rank, with the rank in every message."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []
        self.count = 0

    def same(self, what: str, got: Any, want: torch.Tensor, device: str = DEVICE,
             tol: float = 0.0) -> None:
        """``got`` must be a tensor on ``device`` of ``want``'s dtype and shape, equal to it."""
        self.count += 1
        if not isinstance(got, torch.Tensor):
            self.failures.append(f"rank {self.rank} {what}: got {type(got).__name__}")
            return
        if got.device.type != device or got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            self.failures.append(f"rank {self.rank} {what}: got {got.dtype} {tuple(got.shape)} on "
                                 f"{got.device}, want {want.dtype} {tuple(want.shape)} on {device}")
            return
        g, w = got.detach().cpu().double(), want.detach().cpu().double()  # want may live on the GPU
        if not torch.allclose(g, w, rtol=tol, atol=tol):
            self.failures.append(f"rank {self.rank} {what}: got {g.flatten()[:6].tolist()}, "
                                 f"want {w.flatten()[:6].tolist()}")

    def true(self, what: str, ok: bool, detail: str = "") -> None:
        self.count += 1
        if not ok:
            self.failures.append(f"rank {self.rank} {what} {detail}")

    def guarded(self, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - report and go on, ranks stay in step
            self.failures.append(f"rank {self.rank} {what}: raised {type(exc).__name__}: {str(exc)[:300]}")


def _reduce(stack: torch.Tensor, op: str, dtype: str) -> torch.Tensor:
    wide = stack.double()
    got = {"sum": wide.sum(0), "min": wide.min(0).values, "max": wide.max(0).values,
           "product": wide.prod(0), "average": wide.mean(0)}[op]
    return got.to(getattr(torch, dtype))


def engine_collectives(c: Collector, size: int, device: str = DEVICE) -> None:
    """Every engine collective x dtype on ``device`` tensors, through ``session.submit``."""
    from accord.comm.ops import ReduceOp
    from accord.engine.session import submit, synchronize

    rank = c.rank
    ops = {"sum": ReduceOp.SUM, "min": ReduceOp.MIN, "max": ReduceOp.MAX,
           "product": ReduceOp.PRODUCT, "average": ReduceOp.AVERAGE}
    for dtype in DTYPES:
        def one_dtype(dtype: str = dtype) -> None:
            inputs = [values("ar", r, (5, 3), dtype) for r in range(size)]
            stack = torch.stack(inputs)
            for name, op in ops.items():
                if name == "average" and dtype not in ("float32", "float64") + HALF:
                    continue
                x = inputs[rank].to(device, copy=True)
                out = synchronize(submit("allreduce", x, f"ar.{dtype}.{name}", reduce_op=op))
                tol = 1e-2 if name == "average" and dtype in HALF else 0.0
                c.same(f"allreduce {name} {dtype}", out, _reduce(stack, name, dtype), device, tol)
                c.same(f"allreduce {name} {dtype} input untouched", x, inputs[rank], device)
            x = inputs[rank].to(device, copy=True)
            synchronize(submit("allreduce", x, f"ar_.{dtype}", in_place=True))
            c.same(f"allreduce in place {dtype}", x, _reduce(stack, "sum", dtype), device)
            x = inputs[rank].to(device, copy=True)
            synchronize(submit("broadcast", x, f"bc.{dtype}", in_place=True, root_rank=size - 1))
            c.same(f"broadcast {dtype}", x, inputs[size - 1], device)
            ragged = [values("ag", r, (r + 1, 2), dtype) for r in range(size)]
            out = synchronize(submit("allgather", ragged[rank].to(device, copy=True), f"ag.{dtype}"))
            c.same(f"allgather ragged {dtype}", out, torch.cat(ragged), device)
            out = synchronize(submit("gather", ragged[rank].to(device, copy=True), f"ga.{dtype}", root_rank=0))
            if rank == 0:
                c.same(f"gather {dtype}", out, torch.cat(ragged), device)
            else:
                c.true(f"gather {dtype} off root", out is None, f"got {type(out).__name__}")
            x = inputs[rank].to(device, copy=True)
            out = synchronize(submit("reduce", x, f"rd.{dtype}", root_rank=0, reduce_op=ReduceOp.MAX))
            if rank == 0:
                c.same(f"reduce max {dtype}", out, _reduce(stack, "max", dtype), device)
            rows = [values("rs", r, (2 * size + 1, 2), dtype) for r in range(size)]
            out = synchronize(submit("reducescatter", rows[rank].to(device, copy=True), f"rs.{dtype}"))
            full = _reduce(torch.stack(rows), "sum", dtype)
            mine = [3 if r == 0 else 2 for r in range(size)]  # lower ranks get the extra row
            c.same(f"reducescatter {dtype}", out, full.split(mine)[rank], device)
            splits = [[(s + r) % 3 for r in range(size)] for s in range(size)]  # splits[s][d]
            sent = [values("a2a", s, (sum(splits[s]), 2), dtype) for s in range(size)]
            out, received = synchronize(submit("alltoall", sent[rank].to(device, copy=True), f"a2a.{dtype}",
                                               splits=splits[rank]))
            want = torch.cat([sent[s].split(splits[s])[rank] for s in range(size)])
            c.same(f"alltoall {dtype}", out, want, device)
            c.same(f"alltoall {dtype} received splits", received,
                   torch.tensor([splits[s][rank] for s in range(size)]), "cpu")
            table = values("sc", 0, (3 * size, 2), dtype)
            mine = table if rank == 0 else torch.empty((0, 2), dtype=getattr(torch, dtype))
            out = synchronize(submit("scatter", mine.to(device, copy=True), f"sc.{dtype}", root_rank=0))
            c.same(f"scatter {dtype}", out, table[3 * rank:3 * rank + 3], device)

        c.guarded(f"engine collectives {dtype}", one_dtype)
    c.guarded("barrier", lambda: synchronize(submit("barrier", None, "barrier")))


def horovod_api(c: Collector, size: int, device: str = DEVICE) -> None:
    """The Horovod surface on ``device`` tensors: sync, in-place, async, grouped, autograd."""
    import accord.torch as hvd

    rank = c.rank
    for dtype in DTYPES:
        def one_dtype(dtype: str = dtype) -> None:
            inputs = [values("h", r, (4, 3), dtype) for r in range(size)]
            total = _reduce(torch.stack(inputs), "sum", dtype)
            mine = inputs[rank].to(device, copy=True)
            c.same(f"hvd.allreduce {dtype}", hvd.allreduce(mine, op=hvd.Sum), total, device)
            t = inputs[rank].to(device, copy=True)
            c.true(f"hvd.allreduce_ {dtype} returns its input", hvd.allreduce_(t, op=hvd.Sum) is t)
            c.same(f"hvd.allreduce_ {dtype}", t, total, device)
            handle = hvd.allreduce_async(inputs[rank].to(device, copy=True), op=hvd.Sum, name=f"async.{dtype}")
            c.same(f"hvd.allreduce_async {dtype}", hvd.synchronize(handle), total, device)
            outs = hvd.grouped_allreduce([inputs[rank].to(device, copy=True), inputs[rank][:1].to(device, copy=True)],
                                         op=hvd.Sum)
            c.same(f"hvd.grouped_allreduce {dtype} [0]", outs[0], total, device)
            c.same(f"hvd.grouped_allreduce {dtype} [1]", outs[1], total[:1], device)
            gathered = hvd.allgather(inputs[rank].to(device, copy=True))
            c.same(f"hvd.allgather {dtype}", gathered, torch.cat(inputs), device)
            c.same(f"hvd.broadcast {dtype}", hvd.broadcast(inputs[rank].to(device, copy=True), root_rank=0),
                   inputs[0], device)
            t = inputs[rank].to(device, copy=True)
            hvd.broadcast_(t, root_rank=size - 1)
            c.same(f"hvd.broadcast_ {dtype}", t, inputs[size - 1], device)
            out = hvd.alltoall(inputs[rank][:size].to(device, copy=True))  # one row to every rank
            c.same(f"hvd.alltoall {dtype}", out, torch.stack([inputs[s][rank] for s in range(size)]), device)
            rs = [values("hrs", r, (2 * size, 3), dtype) for r in range(size)]
            out = hvd.reducescatter(rs[rank].to(device, copy=True), op=hvd.Sum)
            want = _reduce(torch.stack(rs), "sum", dtype)[2 * rank:2 * rank + 2]
            c.same(f"hvd.reducescatter {dtype}", out, want, device)

        c.guarded(f"horovod api {dtype}", one_dtype)

    def autograd() -> None:  # Horovod's gradients: allreduce's is the allreduce of the gradient
        x = values("grad", rank, (3, 2), "float32").to(device, copy=True).requires_grad_(True)
        y = hvd.allreduce(x, op=hvd.Sum)
        (y * (rank + 1)).sum().backward()
        c.same("allreduce backward", x.grad, torch.full((3, 2), float(sum(range(1, size + 1)))), device)

    c.guarded("autograd", autograd)

    def join() -> None:  # rank 0 joins at once; the others reduce CUDA tensors without it
        if rank == 0:
            last = hvd.join()
        else:
            t = values("join", rank, (6,), "float32").to(device, copy=True)
            out = hvd.allreduce(t, op=hvd.Sum, name="joined")  # rank 0 contributes zeros
            c.same("allreduce with rank 0 joined", out,
                   sum(values("join", r, (6,), "float32") for r in range(1, size)), device)
            last = hvd.join()
        c.true("join returns the last rank to join", last == (size - 1 if size > 1 else 0), f"got {last}")

    c.guarded("join", join)


def compression(c: Collector, size: int, device: str = DEVICE) -> None:
    """fp16/bf16 compression of float32 CUDA tensors: the data really travels in half precision
    (2**-12 and 2**-9 are dropped by float16 and bfloat16 respectively), results come back float32."""
    import accord.torch as hvd
    from accord.torch import async_ops as A
    from accord.torch.process_sets import global_process_set

    rank = c.rank
    base = [values("cmp", r, (64,), "float32") + 1.0 for r in range(size)]
    for comp, tiny, half in ((hvd.Compression.fp16, 2.0 ** -12, torch.float16),
                             (hvd.Compression.bf16, 2.0 ** -9, torch.bfloat16)):
        def check(comp: Any = comp, tiny: float = tiny, half: torch.dtype = half) -> None:
            x = (base[rank] + tiny).to(device, copy=True)
            want = torch.stack([(b + tiny).to(half) for b in base]).double().sum(0).to(half).float()
            got = hvd.allreduce(x, op=hvd.Sum, compression=comp, name=f"cmp.{half}")
            c.same(f"allreduce compressed {half}", got, want, device)
            # in place, cast by the engine on the way (the call DistributedOptimizer makes),
            # alone and as a fused group
            t = (base[rank] + tiny).to(device, copy=True)
            hvd.synchronize(A.allreduce_tensors([t], True, f"cast.{half}", hvd.Sum, 1.0, 1.0,
                                                global_process_set, grouped=False, compression=comp))
            c.same(f"in-place compressed allreduce {half} (deferred cast)", t, want, device)
            ts = [(base[rank] + tiny).to(device, copy=True), (base[rank][:9] + tiny).to(device, copy=True)]
            hvd.synchronize(A.allreduce_tensors(ts, True, f"gcast.{half}", hvd.Sum, 1.0, 1.0,
                                                global_process_set, grouped=True, compression=comp))
            c.same(f"in-place compressed grouped allreduce {half} [0]", ts[0], want, device)
            c.same(f"in-place compressed grouped allreduce {half} [1]", ts[1], want[:9], device)

        c.guarded(f"compression {half}", check)


def optimizer(c: Collector, size: int, device: str = DEVICE, compression: Any = None) -> None:
    """DistributedOptimizer on a model on ``device``: after one step every rank holds what plain
    SGD on the average of every rank's gradient gives."""
    import accord.torch as hvd

    rank = c.rank

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))

    def batch(r: int) -> tuple[torch.Tensor, torch.Tensor]:
        return values("x", r, (4, 6), "float32"), values("y", r, (4, 2), "float32")

    def run() -> None:
        net = model().to(device)
        kwargs = {} if compression is None else {"compression": compression}
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                       named_parameters=net.named_parameters(), **kwargs)
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
        x, y = batch(rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x.to(device, copy=True)), y.to(device, copy=True)).backward()
        opt.step()
        # the reference: the mean of every rank's gradient, computed here on the CPU in float64
        ref = model().double()
        grads = []
        for r in range(size):
            ref.zero_grad()
            xr, yr = batch(r)
            torch.nn.functional.mse_loss(ref(xr.double()), yr.double()).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        tol = 1e-5 if compression is None else 5e-3
        with torch.no_grad():
            for i, (p, q) in enumerate(zip(net.parameters(), ref.parameters())):
                mean = sum(g[i] for g in grads) / size
                c.same(f"optimizer param {i}", p.detach().double(), q - 0.1 * mean, device, tol)

    c.guarded(f"DistributedOptimizer ({compression})", run)


def stream_rules(c: Collector, size: int) -> None:
    """The caller's current stream is respected, and no result is read early (CUDA only).

    A side stream sleeps on the GPU, then writes the input; the collective is submitted under
    that stream, so the engine must wait for the write (a ready event on the caller's stream).
    The result is then read on another stream right after synchronize(): it must be complete.
    """
    import accord.torch as hvd

    dev = torch.device("cuda", torch.cuda.current_device())
    side, reader = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    cycles = 200_000_000  # ~0.1 s of GPU time: far longer than the engine takes to start a cycle
    cases = [("allreduce", torch.float32, size), ("allreduce_", torch.bfloat16, size),
             ("allgather", torch.float16, 1), ("broadcast_", torch.int64, 1), ("grouped", torch.float32, size)]
    for i, (kind, dtype, factor) in enumerate(cases):
        x = torch.zeros(1 << 16, dtype=dtype, device=dev)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
            x.fill_(i + 1)  # written on the side stream, after the sleep
            if kind == "allreduce":
                h = hvd.allreduce_async(x, op=hvd.Sum, name=f"s{i}")
            elif kind == "allreduce_":
                h = hvd.allreduce_async_(x, op=hvd.Sum, name=f"s{i}")
            elif kind == "allgather":
                h = hvd.allgather_async(x, name=f"s{i}")
            elif kind == "broadcast_":
                h = hvd.broadcast_async_(x, root_rank=0, name=f"s{i}")
            else:
                h = hvd.grouped_allreduce_async([x, x[:7]], op=hvd.Sum, name=f"s{i}")
        out = hvd.synchronize(h)
        outs = out if isinstance(out, list) else [out]
        with torch.cuda.stream(reader):  # read on another stream, with no wait on the side stream
            seen = [o.to(torch.float64).sum() for o in outs]
        reader.synchronize()
        for o, s in zip(outs, seen):
            want = (i + 1) * factor * o.numel()
            c.true(f"{kind} {dtype}: result complete when synchronize returns", float(s) == want,
                   f"sum {float(s)}, want {want}")
    # a result synchronized and read on a side stream, then dropped while that read may still
    # be queued: the engine's next allocation must not take its memory (record_stream)
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        got = hvd.allreduce(torch.full((1 << 16,), 2.0, device=dev), op=hvd.Sum, name="side.sync")
        torch.cuda._sleep(cycles)
        total = got.sum()
        del got
        hvd.allreduce(torch.zeros(1 << 16, device=dev), op=hvd.Sum, name="side.next")
    side.synchronize()
    c.true("a result read on a side stream after it was dropped", float(total) == 2.0 * size * (1 << 16),
           f"sum {float(total)}")
    # a large result read on the caller's default stream right after synchronize, no other wait
    y = torch.arange(1 << 20, dtype=torch.float32, device=dev)
    c.same("large allreduce", hvd.allreduce(y, op=hvd.Sum, name="large"), torch.arange(1 << 20) * float(size),
           "cuda")


def start(rank: int, cuda_backend: str, cpu_backend: str | None = None) -> Collector:
    """In a rank: init, pick this rank's GPU (as scripts do after init), and check which
    backends carry CUDA (and CPU) tensors."""
    import accord.torch as hvd
    from accord.engine import session

    hvd.init()
    c = Collector(rank)
    if DEVICE == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        c.true("cuda backend", session.backend_name("cuda") == cuda_backend, session.backend_name("cuda"))
        if cpu_backend is not None:
            c.true("cpu backend", session.backend_name("cpu") == cpu_backend, session.backend_name("cpu"))
    return c


def finish(c: Collector) -> tuple[int, list[str]]:
    """In a rank: shut down; what the parent's :func:`assert_clean` reads."""
    import accord.torch as hvd

    hvd.shutdown()
    return c.count, c.failures


def assert_clean(results: list[tuple[int, list[str]]], least: int) -> None:
    """In the test: no rank failed a check, and every rank ran at least ``least`` of them."""
    failures = [f for _, fails in results for f in fails]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:60])
    assert min(n for n, _ in results) >= least, [n for n, _ in results]
