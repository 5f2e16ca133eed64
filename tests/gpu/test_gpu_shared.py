"""Two ranks sharing one GPU (the lent machines have one): NCCL refuses that, so accord's
default (ACCORD_GPU_BACKEND=auto) moves their CUDA tensors through host memory over the CPU
backend (shm on one host). Every collective x dtype, Horovod's API, compression,
DistributedOptimizer, SyncBatchNorm and dist_device_sync run there with values checked; asking
for NCCL explicitly is a clear error at init; a torch without NCCL falls back the same way.

Marked ``gpu``: skipped (with the reason) where torch sees no GPU.
"""
import pytest
from helpers import gpu_checks as g
from helpers.gpu_checks import DEVICE, ON_CPU, skip_reason
from helpers.gpu_plan_checks import planned_rank
from helpers.ranks import run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120),
              pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]


def _start(rank, expect="host"):
    return g.start(rank, expect, "shm")


def _shared(rank, size):
    import accord.torch as hvd

    c = _start(rank)
    g.engine_collectives(c, size)
    g.horovod_api(c, size)
    g.compression(c, size)
    g.optimizer(c, size)
    g.optimizer(c, size, compression=hvd.Compression.fp16)
    _sync_batch_norm(c, size)
    _dist_device_sync(c, size)
    return g.finish(c)


def _sync_batch_norm(c, size):
    """SyncBatchNorm on each rank's part of the batch equals BatchNorm on the whole batch
    (output, input gradient, summed weight/bias gradients, running statistics)."""
    import torch
    from helpers.gpu_checks import values

    import accord.torch as hvd

    rank = c.rank

    def run():
        xs = [values("bn.x", r, (4, 3, 5), "float32") for r in range(size)]
        gs = [values("bn.g", r, (4, 3, 5), "float32") for r in range(size)]
        sbn = hvd.SyncBatchNorm(3).to(DEVICE)
        with torch.no_grad():
            sbn.weight.copy_(torch.tensor([0.5, 1.0, 2.0]))
            sbn.bias.copy_(torch.tensor([0.0, -1.0, 1.0]))
        x = xs[rank].to(DEVICE, copy=True).requires_grad_(True)
        out = sbn(x)
        out.backward(gs[rank].to(DEVICE, copy=True))
        gw = hvd.allreduce(sbn.weight.grad, op=hvd.Sum, name="bn.gw")
        gb = hvd.allreduce(sbn.bias.grad, op=hvd.Sum, name="bn.gb")
        bn = torch.nn.BatchNorm1d(3).double()
        with torch.no_grad():
            bn.weight.copy_(torch.tensor([0.5, 1.0, 2.0]))
            bn.bias.copy_(torch.tensor([0.0, -1.0, 1.0]))
        xr = torch.cat(xs).double().requires_grad_(True)
        ref = bn(xr)
        ref.backward(torch.cat(gs).double())
        rows = slice(4 * rank, 4 * rank + 4)
        for name, got, want in [("out", out, ref[rows]), ("grad x", x.grad, xr.grad[rows]),
                                ("grad weight", gw, bn.weight.grad), ("grad bias", gb, bn.bias.grad),
                                ("running mean", sbn.running_mean, bn.running_mean),
                                ("running var", sbn.running_var, bn.running_var)]:
            c.same(f"SyncBatchNorm {name}", got.detach().double(), want.detach(), DEVICE, 1e-4)

    c.guarded("SyncBatchNorm", run)


def _dist_device_sync(c, size):
    import torch

    import accord.kvstore as kvs

    rank = c.rank

    def run():
        kv = kvs.create("dist_device_sync")
        kv.init("g", torch.zeros(2, 3, device=DEVICE))
        kv.push("g", [torch.full((2, 3), rank + 1.0, device=DEVICE), torch.ones(2, 3, device=DEVICE)])
        out = torch.zeros(2, 3, device=DEVICE)
        kv.pull("g", out=out)
        c.same("dist_device_sync", out, torch.full((2, 3), float(sum(r + 2 for r in range(size)))))

    c.guarded("dist_device_sync", run)


@pytest.mark.parametrize("size", [2])
def test_ranks_sharing_one_gpu_run_through_host_memory(size):
    g.assert_clean(run_ranks(_shared, size, init="accord", timeout=110), 245)


def _streams(rank, size):
    c = _start(rank)
    g.stream_rules(c, size)
    return g.finish(c)


@pytest.mark.timeout(60)
@pytest.mark.skipif(ON_CPU, reason="stream rules need CUDA streams")
def test_stream_rules_through_host_memory():
    g.assert_clean(run_ranks(_streams, 2, init="accord", timeout=50), 8)


@pytest.mark.timeout(60)
def test_planned_cycles_through_host_memory():
    g.assert_clean(run_ranks(planned_rank, 2, "host", "shm", init="accord", timeout=50), 52)


def _explicit_nccl(rank, size):
    import accord.torch as hvd
    from accord.errors import ConfigError

    try:
        hvd.init()
    except ConfigError as exc:
        return str(exc)
    hvd.shutdown()
    return None


@pytest.mark.skipif(ON_CPU, reason="needs a real GPU shared by the ranks")
def test_explicit_nccl_on_a_shared_gpu_is_refused_at_init():
    messages = run_ranks(_explicit_nccl, 2, init="accord", timeout=50,
                         env={"ACCORD_GPU_BACKEND": "nccl"})
    for text in messages:
        assert text is not None, "init() accepted NCCL on one shared GPU"
        assert "2 ranks on host" in text and "share 1 GPU(s)" in text and "HINT:" in text, text


def _without_nccl(rank, size):
    import torch
    import torch.distributed as dist

    dist.is_nccl_available = lambda: False  # this rank's torch "has no NCCL"
    c = _start(rank)
    x = torch.arange(10, dtype=torch.float32, device=DEVICE)
    import accord.torch as hvd

    c.same("allreduce without NCCL", hvd.allreduce(x, op=hvd.Sum), torch.arange(10, dtype=torch.float32) * size)
    c.same("allgather without NCCL", hvd.allgather(x[:2]), torch.arange(2, dtype=torch.float32).repeat(size))
    return g.finish(c)


@pytest.mark.skipif(ON_CPU, reason="needs a real GPU")
def test_cuda_without_nccl_falls_back_to_host_memory():
    g.assert_clean(run_ranks(_without_nccl, 2, init="accord", timeout=50), 4)
