"""SyncBatchNorm on real CPU ranks equals plain BatchNorm on the concatenated batch.

Every rank rebuilds every rank's input from (seed, rank), runs plain ``BatchNorm`` on the
concatenation in-process as the reference, and compares its own slice of the output, its input
gradient, the summed weight/bias gradients and the running statistics.
"""
import numpy as np
import pytest
from helpers.ranks import run_ranks

pytestmark = pytest.mark.timeout(120)

_HOSTS = ["hostA", "hostA", "hostB"]


def _x(seed, rank, channels, spatial):
    import torch

    rng = np.random.default_rng([seed, rank])
    rows = rank + 2  # ranks hold different batch sizes
    return torch.from_numpy(rng.normal(size=(rows, channels, *spatial)) * (rank + 1) + rank)


def _check(rank, ranks, seed, channels, spatial, layer, tol):
    """Compare ``layer`` (SyncBatchNorm over ``ranks``) with BatchNorm on their concatenation."""
    import torch

    import accord.torch as hvd

    xs = [_x(seed, r, channels, spatial) for r in ranks]
    ws = [torch.from_numpy(np.random.default_rng([seed + 1, r]).normal(size=tuple(x.shape)))
          for r, x in zip(ranks, xs)]
    kind = {2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}.get(len(spatial), torch.nn.BatchNorm1d)
    bn = kind(channels).double()
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, channels))
        bn.bias.copy_(torch.linspace(-1, 1, channels))
        layer.weight.copy_(bn.weight)
        layer.bias.copy_(bn.bias)
    full = torch.cat(xs).requires_grad_()
    out_ref = bn(full)
    (out_ref * torch.cat(ws)).sum().backward()

    me = ranks.index(rank)
    x = xs[me].clone().requires_grad_()
    out = layer(x)
    (out * ws[me]).sum().backward()
    start = sum(t.shape[0] for t in xs[:me])
    stop = start + xs[me].shape[0]
    np.testing.assert_allclose(out.detach().numpy(), out_ref[start:stop].detach().numpy(), atol=tol)
    np.testing.assert_allclose(x.grad.numpy(), full.grad[start:stop].numpy(), atol=tol)
    np.testing.assert_allclose(layer.running_mean.numpy(), bn.running_mean.numpy(), atol=tol)
    np.testing.assert_allclose(layer.running_var.numpy(), bn.running_var.numpy(), atol=tol)
    ps = layer._set()
    wsum = hvd.allreduce(layer.weight.grad, op=hvd.Sum, process_set=ps)
    bsum = hvd.allreduce(layer.bias.grad, op=hvd.Sum, process_set=ps)
    np.testing.assert_allclose(wsum.numpy(), bn.weight.grad.numpy(), atol=tol)
    np.testing.assert_allclose(bsum.numpy(), bn.bias.grad.numpy(), atol=tol)
    return bn


def _sync_bn(rank, size):
    import torch

    import accord.torch as hvd
    from accord.engine import session

    hvd.init()
    everyone = list(range(size))
    for seed, spatial in [(1, (5, 4)), (2, ()), (3, (3,)), (4, (2, 2, 2))]:
        layer = hvd.SyncBatchNorm(3).double()
        _check(rank, everyone, seed, 3, spatial, layer, 1e-9)
    # momentum=None (cumulative average) over two steps, float32 input
    layer = hvd.SyncBatchNorm(2, momentum=None)
    for step in range(2):
        x = _x(10 + step, rank, 2, (3,)).float()
        layer(x)
    ref = torch.nn.BatchNorm1d(2, momentum=None)
    for step in range(2):
        ref(torch.cat([_x(10 + step, r, 2, (3,)).float() for r in everyone]))
    np.testing.assert_allclose(layer.running_mean.numpy(), ref.running_mean.numpy(), atol=1e-5)
    np.testing.assert_allclose(layer.running_var.numpy(), ref.running_var.numpy(), atol=1e-5)

    # eval mode uses running statistics and does not communicate
    before = session.engine().stats()["collectives"]
    layer.eval()
    x = _x(20, rank, 2, (3,)).float()
    ref.eval()
    np.testing.assert_allclose(layer(x).detach().numpy(), ref(x).detach().numpy(), atol=1e-5)
    assert session.engine().stats()["collectives"] == before

    # convert_sync_batchnorm keeps parameters and buffers and swaps every BatchNorm
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 1), torch.nn.BatchNorm2d(3),
                              torch.nn.Sequential(torch.nn.BatchNorm1d(3)))
    net[1].running_mean.fill_(0.5)
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(net)
    assert isinstance(converted[1], hvd.SyncBatchNorm) and isinstance(converted[2][0], hvd.SyncBatchNorm)
    assert float(converted[1].running_mean[0]) == 0.5
    with pytest.raises(ValueError, match="expected at least 2D input"):
        hvd.SyncBatchNorm(3)(torch.ones(3))
    with pytest.raises(ValueError, match="comm_scope"):
        hvd.SyncBatchNorm(3, comm_scope="rack")
    hvd.shutdown()
    return True


@pytest.mark.parametrize("nprocs", [2, 3])
def test_sync_batch_norm_equals_big_batch(nprocs):
    assert run_ranks(_sync_bn, nprocs, init="accord", timeout=100) == [True] * nprocs


def _local_scope(rank, size):
    import accord.torch as hvd

    hvd.init()
    assert hvd.local_size() == _HOSTS.count(_HOSTS[rank])
    peers = [r for r, h in enumerate(_HOSTS) if h == _HOSTS[rank]]
    layer = hvd.SyncBatchNorm(3, comm_scope="local").double()
    _check(rank, peers, 5, 3, (4,), layer, 1e-9)
    layer = hvd.SyncBatchNorm(3, comm_scope=1).double()  # Perseus' 1 = global
    _check(rank, list(range(size)), 6, 3, (4,), layer, 1e-9)
    hvd.shutdown()
    return True


def _fake_hosts(rank):
    from accord.runtime.topology import topology_from_hostnames

    t = topology_from_hostnames(rank, _HOSTS)
    return {"ACCORD_HOSTNAME": _HOSTS[rank], "ACCORD_LOCAL_RANK": str(t.local_rank),
            "ACCORD_LOCAL_SIZE": str(t.local_size), "ACCORD_CROSS_RANK": str(t.cross_rank),
            "ACCORD_CROSS_SIZE": str(t.cross_size)}


def test_sync_batch_norm_local_scope_on_two_fake_hosts():
    results = run_ranks(_local_scope, 3, init="accord", per_rank_env=_fake_hosts, timeout=100)
    assert results == [True] * 3
