"""One rank on one GPU over NCCL: every collective x dtype through the engine and Horovod's API,
the stream rules, DistributedOptimizer, fp16/bf16 compression, SyncBatchNorm's synchronized
function, KVStore ``device`` / ``dist_device_sync``, and torch.compile, all on CUDA tensors.

Marked ``gpu``: skipped (with the reason) where torch sees no GPU; ``bash scripts/gpu_check.sh``
runs them on a GPU machine. Each test starts a real rank (accord's own init, NCCL for CUDA
tensors); expected values come from tests/helpers/gpu_checks.py, computed on the CPU.
"""
import pytest
from helpers import gpu_checks as g
from helpers.gpu_checks import DEVICE, ON_CPU, skip_reason
from helpers.gpu_plan_checks import planned_rank
from helpers.ranks import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120),
              pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]


def _start(rank):
    return g.start(rank, "nccl")


def _collectives(rank, size):

    c = _start(rank)
    g.engine_collectives(c, size)
    g.horovod_api(c, size)
    g.compression(c, size)
    return g.finish(c)


@pytest.mark.timeout(120)
def test_every_collective_and_dtype_on_nccl():
    g.assert_clean(run_ranks(_collectives, 1, init="accord", timeout=110), 240)


def _streams(rank, size):
    c = _start(rank)
    g.stream_rules(c, size)
    return g.finish(c)


@pytest.mark.timeout(60)
@pytest.mark.skipif(ON_CPU, reason="stream rules need CUDA streams")
def test_stream_rules():
    g.assert_clean(run_ranks(_streams, 1, init="accord", timeout=50), 7)


@pytest.mark.timeout(60)
def test_planned_cycles_keep_values_and_stream_rules():
    g.assert_clean(run_ranks(planned_rank, 1, "nccl", init="accord", timeout=50), 52)


def _training(rank, size):
    import torch

    import accord.torch as hvd

    c = _start(rank)
    g.optimizer(c, size)
    g.optimizer(c, size, compression=hvd.Compression.fp16)
    g.optimizer(c, size, compression=hvd.Compression.bf16)
    _sync_batch_norm_function(c)
    _kvstore(c, size)
    c.same("still in step", hvd.allreduce(torch.ones(3, device=DEVICE), op=hvd.Sum),
           torch.full((3,), float(size)))
    return g.finish(c)


def _sync_batch_norm_function(c):
    """With one rank SyncBatchNorm takes BatchNorm's path; its synchronized function (the
    allgather of statistics, the allreduce in backward) is called directly here, on CUDA, and
    compared with BatchNorm forward and backward."""
    import torch
    import torch.nn.functional as F

    from accord.torch.process_sets import global_process_set
    from accord.torch.sync_batch_norm import _SyncBatchNormFn

    def run():
        torch.manual_seed(1)
        x = torch.randn(8, 3, 5, 4, device=DEVICE)
        w, b = torch.rand(3, device=DEVICE) + 0.5, torch.randn(3, device=DEVICE)
        grad = torch.randn(8, 3, 5, 4, device=DEVICE)
        mean_s, var_s = torch.zeros(3, device=DEVICE), torch.ones(3, device=DEVICE)
        mean_r, var_r = mean_s.clone(), var_s.clone()
        xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, b))
        out = _SyncBatchNormFn.apply(xs, ws, bs, mean_s, var_s, 1e-5, 0.1, global_process_set)
        out.backward(grad)
        xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
        ref = F.batch_norm(xr, mean_r, var_r, wr, br, True, 0.1, 1e-5)
        ref.backward(grad)
        for name, got, want in [("out", out, ref), ("grad x", xs.grad, xr.grad), ("grad w", ws.grad, wr.grad),
                                ("grad b", bs.grad, br.grad), ("running mean", mean_s, mean_r),
                                ("running var", var_s, var_r)]:
            c.same(f"SyncBatchNorm function {name}", got, want.detach(), DEVICE, 1e-4)

    c.guarded("SyncBatchNorm function", run)


def _kvstore(c, size):
    """``device`` merges CUDA values on the GPU; ``dist_device_sync`` (on the engine) merges a
    worker's CUDA values there, then across workers."""
    import torch

    import accord.kvstore as kvs

    rank = c.rank

    def run():
        kv = kvs.create("device")
        kv.init("w", torch.zeros(4, device=DEVICE))
        kv.push("w", [torch.full((4,), 1.5, device=DEVICE), torch.full((4,), 2.0, device=DEVICE)])
        got = kv.pull("w")
        c.same("kvstore device push list", got, torch.full((4,), 3.5))
        dist = kvs.create("dist_device_sync")
        dist.init("g", torch.zeros(2, 3, device=DEVICE))
        for step in range(2):
            dist.push("g", [torch.full((2, 3), rank + step + 1.0, device=DEVICE),
                            torch.ones(2, 3, device=DEVICE)])
            out = torch.zeros(2, 3, device=DEVICE)
            dist.pull("g", out=out)
            want = sum(r + step + 2.0 for r in range(size))
            c.same(f"kvstore dist_device_sync step {step}", out, torch.full((2, 3), want))

    c.guarded("kvstore", run)


@pytest.mark.timeout(120)
def test_optimizer_sync_batch_norm_kvstore_on_nccl():
    g.assert_clean(run_ranks(_training, 1, init="accord", timeout=110), 20)


def _compiled(rank, size):
    """Collectives inside torch.compile(fullgraph=True) on CUDA tensors equal eager; a compiled
    CUDA model with allreduce_gradients trains to the eager weights."""
    import torch
    from helpers.compile_settings import dynamic_output_shapes

    import accord.torch as hvd

    c = _start(rank)
    # On CUDA inductor generates the kernels, which is what this test is for. The CPU twin only
    # keeps the check in step with accord's API: Dynamo's capture with aot_eager is enough there,
    # and CPU inductor (a C++ build, half a minute on 2 cores) has its own test in
    # tests/multiprocess/test_torch_compile.py.
    backend = "aot_eager" if ON_CPU else "inductor"

    def fn(x, r):
        a = hvd.allreduce(x, op=hvd.Sum, name="c.ar")
        g = hvd.allgather(r, name="c.ag")
        b = hvd.broadcast(x * 2, root_rank=0, name="c.bc")
        s = hvd.reducescatter(torch.cat([x, x]), op=hvd.Sum, name="c.rs")
        return a.sin() + b, g * 3, s

    def run():
        x = torch.arange(12, dtype=torch.float32, device=DEVICE).reshape(4, 3) / 7
        r = torch.arange(3 * (rank + 1), dtype=torch.float32, device=DEVICE).reshape(rank + 1, 3)
        eager = fn(x, r)
        with dynamic_output_shapes():  # allgather's output size depends on data (torch < 2.9)
            compiled = torch.compile(fn, fullgraph=True, backend=backend)(x, r)
        for i, (e, k) in enumerate(zip(eager, compiled)):
            c.same(f"compiled output {i}", k, e.detach().cpu(), DEVICE, 1e-5)

        def model():
            torch.manual_seed(3)
            return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(DEVICE)

        nets = [model(), model()]
        opts = [torch.optim.SGD(n.parameters(), lr=0.05) for n in nets]

        def step(net, opt, xb, yb):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(xb), yb).backward()
            hvd.allreduce_gradients(net.parameters(), name="c.grads")
            opt.step()

        steps = [step, torch.compile(step, backend=backend)]  # eager, then the same step compiled
        torch.manual_seed(4)
        for _ in range(3):
            xb, yb = torch.randn(16, 8, device=DEVICE), torch.randn(16, 4, device=DEVICE)
            for s, n, o in zip(steps, nets, opts):
                s(n, o, xb, yb)
        for i, (p, q) in enumerate(zip(nets[0].parameters(), nets[1].parameters())):
            c.same(f"compiled training param {i}", q.detach(), p.detach().cpu(), DEVICE, 1e-5)

    c.guarded("torch.compile", run)
    return g.finish(c)


@pytest.mark.timeout(150)  # inductor compiles two graphs for the GPU
def test_torch_compile_with_collectives_on_cuda():
    g.assert_clean(run_ranks(_compiled, 1, init="accord", timeout=140), 3 + 4)
