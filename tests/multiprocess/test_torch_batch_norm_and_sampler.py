"""More SyncBatchNorm and hvd.elastic on real ranks.

SyncBatchNorm: ``affine=False``, ``track_running_stats=False`` (train and eval), integer
``comm_scope`` (Perseus: 0 = this host, 1 = every rank) on fake hosts, a rank with zero rows, and
the module-level ``hvd.convert_sync_batchnorm`` on a small conv/linear net. Every rank rebuilds
every rank's input from (seed, rank) and compares with plain torch BatchNorm (or the unconverted
net) run on the concatenated batch in-process.

Elastic: ``ElasticSampler`` held by a ``TorchState`` -- commit, restore, sync (union of the
processed indices, the rest re-split) -- and a rank lost under ``hvd.elastic.run`` while the
survivors go on with the samples not processed yet.
"""
import os

import numpy as np
import pytest
from helpers.ranks import _start_accord_store, run_ranks

pytestmark = pytest.mark.timeout(120)

_HOSTS = ["hostA", "hostA", "hostB"]
_TOL = 1e-9


def _fake_hosts(rank):
    from accord.runtime.topology import topology_from_hostnames

    t = topology_from_hostnames(rank, _HOSTS)
    return {"ACCORD_HOSTNAME": _HOSTS[rank], "ACCORD_LOCAL_RANK": str(t.local_rank),
            "ACCORD_LOCAL_SIZE": str(t.local_size), "ACCORD_CROSS_RANK": str(t.cross_rank),
            "ACCORD_CROSS_SIZE": str(t.cross_size)}


def _rows(rank, rows):
    return rank + 2 if rows is None else rows[rank]


def _x(seed, rank, channels, spatial, rows=None):
    import torch

    rng = np.random.default_rng([seed, rank])
    n = _rows(rank, rows)
    return torch.from_numpy(rng.normal(size=(n, channels, *spatial)) * (rank + 1) + rank)


def _w(seed, rank, shape):
    import torch

    return torch.from_numpy(np.random.default_rng([seed + 1000, rank]).normal(size=tuple(shape)))


def _close(a, b, tol=_TOL):
    np.testing.assert_allclose(np.asarray(a.detach() if hasattr(a, "detach") else a),
                               np.asarray(b.detach() if hasattr(b, "detach") else b),
                               atol=tol, rtol=0)


def _compare(rank, peers, seed, channels, spatial, layer, ref, rows=None, train=True):
    """Run ``layer`` (SyncBatchNorm over ``peers``) on this rank's slice and the plain ``ref``
    BatchNorm on the concatenation of every peer's batch; compare output, input gradient,
    summed weight/bias gradients and running statistics."""
    import torch

    import accord.torch as hvd

    xs = [_x(seed, r, channels, spatial, rows) for r in peers]
    ws = [_w(seed, r, x.shape) for r, x in zip(peers, xs)]
    if ref.affine:
        with torch.no_grad():
            ref.weight.copy_(torch.linspace(0.5, 1.5, channels))
            ref.bias.copy_(torch.linspace(-1, 1, channels))
            layer.weight.copy_(ref.weight)
            layer.bias.copy_(ref.bias)
    layer.train(train)
    ref.train(train)
    full = torch.cat(xs).requires_grad_()
    out_ref = ref(full)
    (out_ref * torch.cat(ws)).sum().backward()

    me = peers.index(rank)
    x = xs[me].clone().requires_grad_()
    out = layer(x)
    (out * ws[me]).sum().backward()
    start = sum(t.shape[0] for t in xs[:me])
    stop = start + xs[me].shape[0]
    assert out.shape == xs[me].shape
    _close(out, out_ref[start:stop])
    _close(x.grad, full.grad[start:stop])
    if ref.track_running_stats:
        _close(layer.running_mean, ref.running_mean)
        _close(layer.running_var, ref.running_var)
        assert int(layer.num_batches_tracked) == int(ref.num_batches_tracked)
    else:
        assert layer.running_mean is None and layer.running_var is None
    if ref.affine:
        ps = layer._set()
        _close(hvd.allreduce(layer.weight.grad, op=hvd.Sum, process_set=ps), ref.weight.grad)
        _close(hvd.allreduce(layer.bias.grad, op=hvd.Sum, process_set=ps), ref.bias.grad)
    else:
        assert layer.weight is None and layer.bias is None
    return out_ref


# --- SyncBatchNorm variants on 2 ranks --------------------------------------------------------

def _bn_variants(rank, size):
    import torch

    import accord.torch as hvd
    from accord.engine import session

    hvd.init()
    everyone = list(range(size))

    # affine=False: no weight/bias, still the big-batch statistics
    layer = hvd.SyncBatchNorm(3, affine=False).double()
    _compare(rank, everyone, 31, 3, (4,), layer, torch.nn.BatchNorm1d(3, affine=False).double())
    layer = hvd.SyncBatchNorm(2, affine=False, momentum=0.3).double()
    _compare(rank, everyone, 32, 2, (3, 2), layer,
             torch.nn.BatchNorm2d(2, affine=False, momentum=0.3).double())

    # track_running_stats=False in training: big-batch statistics, no buffers
    layer = hvd.SyncBatchNorm(3, track_running_stats=False).double()
    assert layer.num_batches_tracked is None
    _compare(rank, everyone, 33, 3, (5,), layer,
             torch.nn.BatchNorm1d(3, track_running_stats=False).double())

    # ... and in eval mode: batch statistics of this rank's batch only (as torch's and Horovod's
    # SyncBatchNorm: eval never synchronizes), and no collective is submitted.
    layer.eval()
    x = _x(34, rank, 3, (5,))
    before = session.engine().stats()["collectives"]
    out = layer(x)
    assert session.engine().stats()["collectives"] == before
    ref = torch.nn.BatchNorm1d(3, track_running_stats=False).double().eval()
    with torch.no_grad():
        ref.weight.copy_(layer.weight)
        ref.bias.copy_(layer.bias)
    _close(out, ref(x))
    mean = x.mean(dim=(0, 2), keepdim=True)
    var = x.var(dim=(0, 2), unbiased=False, keepdim=True)
    w, b = layer.weight.detach().view(1, 3, 1), layer.bias.detach().view(1, 3, 1)
    _close(out, (x - mean) / torch.sqrt(var + layer.eps) * w + b)

    # both off at once, float32
    layer = hvd.SyncBatchNorm(4, affine=False, track_running_stats=False)
    xs = [_x(35, r, 4, (3,)).float() for r in everyone]
    full = torch.cat(xs)
    m = full.mean(dim=(0, 2), keepdim=True)
    v = full.var(dim=(0, 2), unbiased=False, keepdim=True)
    start = sum(t.shape[0] for t in xs[:rank])
    expect = ((full - m) / torch.sqrt(v + 1e-5))[start:start + xs[rank].shape[0]]
    _close(layer(xs[rank]), expect, 1e-5)

    # a rank holding zero rows: the statistics come from the other ranks' rows only
    rows = [0, 4] if size == 2 else [3, 0, 4]
    layer = hvd.SyncBatchNorm(3).double()
    _compare(rank, everyone, 36, 3, (2,), layer, torch.nn.BatchNorm1d(3).double(), rows=rows)
    layer = hvd.SyncBatchNorm(3, momentum=None).double()
    ref = torch.nn.BatchNorm1d(3, momentum=None).double()
    _compare(rank, everyone, 37, 3, (), layer, ref, rows=rows)
    _compare(rank, everyone, 38, 3, (), layer, ref, rows=rows[::-1])  # second step, cumulative
    hvd.shutdown()
    return True


def test_sync_batch_norm_affine_off_no_running_stats_and_empty_rank():
    assert run_ranks(_bn_variants, 2, init="accord", timeout=100) == [True, True]


# --- integer comm_scope on fake hosts, and convert_sync_batchnorm -----------------------------

def _net():
    import torch

    torch.manual_seed(7)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3, padding=1), torch.nn.BatchNorm2d(3), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 5),
        torch.nn.Sequential(torch.nn.BatchNorm1d(5, momentum=None)), torch.nn.Tanh(),
        torch.nn.Linear(5, 2)).double()


def _check_converted(rank, peers, seed, comm_scope):
    """hvd.convert_sync_batchnorm(net) on each peer equals the unconverted net on the
    concatenated batch: output slice, summed parameter gradients, running statistics."""
    import copy

    import torch

    import accord.torch as hvd

    ref = _net()
    net = hvd.convert_sync_batchnorm(copy.deepcopy(ref), comm_scope=comm_scope)
    scope = "local" if comm_scope in (0, "local") else "global"
    bns = [net[1], net[5][0]]
    for bn in bns:
        assert type(bn) is hvd.SyncBatchNorm and bn.comm_scope == scope
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and
                   not isinstance(m, hvd.SyncBatchNorm) for m in net.modules())
    assert bns[1].momentum is None and bns[0].momentum == 0.1
    ps = bns[0]._set()
    assert ps.size() == len(peers) and ps.rank() == peers.index(rank)

    for step in range(2):
        xs = [_x(seed + step, r, 2, (4, 4)) for r in peers]
        ws = [_w(seed + step, r, (x.shape[0], 2)) for r, x in zip(peers, xs)]
        out_ref = ref(torch.cat(xs))
        (out_ref * torch.cat(ws)).sum().backward()
        me = peers.index(rank)
        out = net(xs[me])
        (out * ws[me]).sum().backward()
        start = sum(t.shape[0] for t in xs[:me])
        _close(out, out_ref[start:start + xs[me].shape[0]])
        for (name, p), (ref_name, q) in zip(net.named_parameters(), ref.named_parameters()):
            assert name == ref_name
            _close(hvd.allreduce(p.grad, op=hvd.Sum, process_set=ps), q.grad)
        for b, c in zip(net.buffers(), ref.buffers()):
            _close(b, c)
    for bn, plain in zip(bns, [ref[1], ref[5][0]]):
        assert int(bn.num_batches_tracked) == int(plain.num_batches_tracked) == 2
    # eval after training: running statistics, identical to the reference net's
    net.eval()
    ref.eval()
    x = _x(seed + 9, rank, 2, (4, 4))
    _close(net(x), ref(x))


def _integer_scopes(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    assert hvd.local_size() == _HOSTS.count(_HOSTS[rank])
    host_peers = [r for r, h in enumerate(_HOSTS) if h == _HOSTS[rank]]
    everyone = list(range(size))

    # Eval never synchronizes, even with track_running_stats=False (batch statistics of this
    # rank's batch): only rank 0 evaluates here, before any rank has used a local-scope layer,
    # so a forward that registered the per-host process sets (a collective) would hang.
    layer = hvd.SyncBatchNorm(3, comm_scope=0, track_running_stats=False).double().eval()
    if rank == 0:
        x = _x(40, rank, 3, (4,))
        ref = torch.nn.BatchNorm1d(3, track_running_stats=False).double().eval()
        _close(layer(x), ref(x))
    hvd.barrier()

    layer = hvd.SyncBatchNorm(3, comm_scope=0).double()
    assert layer.comm_scope == "local"
    _compare(rank, host_peers, 41, 3, (4,), layer, torch.nn.BatchNorm1d(3).double())
    layer = hvd.SyncBatchNorm(3, comm_scope=1).double()
    assert layer.comm_scope == "global"
    _compare(rank, everyone, 42, 3, (4,), layer, torch.nn.BatchNorm1d(3).double())
    # local scope, affine=False, and a host-A rank with zero rows
    layer = hvd.SyncBatchNorm(2, comm_scope=0, affine=False).double()
    _compare(rank, host_peers, 43, 2, (3,), layer,
             torch.nn.BatchNorm1d(2, affine=False).double(), rows=[5, 0, 3])

    _check_converted(rank, host_peers, 50, 0)
    _check_converted(rank, everyone, 60, 1)
    hvd.shutdown()
    return True


def test_integer_comm_scope_and_convert_on_two_fake_hosts():
    results = run_ranks(_integer_scopes, 3, init="accord", per_rank_env=_fake_hosts, timeout=110)
    assert results == [True] * 3


def _convert_global(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    _check_converted(rank, list(range(size)), 70, "global")
    # a bare BatchNorm module is itself replaced; its parameters and buffers are kept
    bn = torch.nn.BatchNorm1d(3).double()
    with torch.no_grad():
        bn.weight.fill_(2.0)
        bn.running_var.fill_(4.0)
    bn.eval()
    sync = hvd.convert_sync_batchnorm(bn)
    assert type(sync) is hvd.SyncBatchNorm and not sync.training
    assert sync.weight is bn.weight and sync.running_var is bn.running_var
    x = _x(71, rank, 3, ())
    _close(sync(x), 2.0 * x / np.sqrt(4.0 + 1e-5))
    hvd.shutdown()
    return True


def test_module_level_convert_sync_batchnorm_global():
    assert run_ranks(_convert_global, 2, init="accord", timeout=100) == [True, True]


# --- ElasticSampler in a TorchState on real ranks ---------------------------------------------

def _sampler_state(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    n = 11
    torch.manual_seed(rank)  # the ranks start from different weights: sync makes them rank 0's
    model = torch.nn.Linear(3, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(list(range(n)), shuffle=True, seed=5)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0)
    assert state.sampler is sampler and (sampler.num_replicas, sampler.rank) == (size, rank)

    initial = hvd.allgather_object(model.weight.detach().clone())
    assert not torch.equal(initial[0], initial[1])
    state.sync()
    torch.testing.assert_close(model.weight.detach(), initial[0], rtol=0, atol=0)

    first = list(sampler)
    assert len(first) == len(sampler) == 6  # 11 samples over 2 ranks: 6 each, one padded
    shares = hvd.allgather_object(first)
    assert set(shares[0]) | set(shares[1]) == set(range(n))
    assert len(set(shares[0]) & set(shares[1])) <= 1  # only the padding may repeat

    def step(indices):
        x = torch.tensor([[float(i), 1.0, -float(i) / 7] for i in indices], dtype=torch.float64)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    # rank 0 processes two batches of 2, rank 1 one batch of 3; then commit
    batch_size = 2 if rank == 0 else 3
    nbatches = 2 if rank == 0 else 1
    for b in range(nbatches):  # ranks record what each trained on (record_batch: every rank's share)
        step(first[b * batch_size:(b + 1) * batch_size])
        sampler.record_indices(first[b * batch_size:(b + 1) * batch_size])
    mine = set(first[:batch_size * nbatches])
    assert sampler.processed_indices == mine
    state.batch = nbatches
    state.commit()
    committed_w = model.weight.detach().clone()
    committed_buf = opt.state[model.weight]["momentum_buffer"].clone()

    # an uncommitted batch, then restore: model, optimizer, sampler, attributes go back
    step(first[4:6] if rank == 0 else first[3:5])
    sampler.record_indices(first[4:6] if rank == 0 else first[3:6])
    state.batch = 99
    assert not torch.equal(model.weight.detach(), committed_w)
    assert sampler.processed_indices != mine
    state.restore()
    torch.testing.assert_close(model.weight.detach(), committed_w, rtol=0, atol=0)
    torch.testing.assert_close(opt.state[model.weight]["momentum_buffer"], committed_buf,
                               rtol=0, atol=0)
    assert model.weight.grad is None
    assert sampler.processed_indices == mine and state.batch == nbatches
    assert len(sampler) == -(-(n - len(mine)) // size)  # restore re-splits this rank's rest

    # sync: processed = union over the ranks, remaining re-split; everything else is rank 0's
    everyone_mine = hvd.allgather_object(sorted(mine))
    union = set(everyone_mine[0]) | set(everyone_mine[1])
    w_root = hvd.broadcast_object(committed_w, root_rank=0)
    buf_root = hvd.broadcast_object(committed_buf, root_rank=0)
    if rank == 1:
        state.batch = 42  # uncommitted: sync replaces it with rank 0's committed value
    state.sync()
    assert sampler.processed_indices == union and len(union) == 7
    remaining = sorted(set(range(n)) - union)
    assert sorted(sampler.remaining_indices) == remaining
    assert len(sampler) == 2 and sampler.total_size == 4
    second = list(sampler)
    shares = hvd.allgather_object(second)
    assert set(shares[0]) | set(shares[1]) == set(remaining) and len(shares[0]) == len(shares[1]) == 2
    assert set(shares[0]).isdisjoint(shares[1])  # 4 left over 2 ranks: no padding
    torch.testing.assert_close(model.weight.detach(), w_root, rtol=0, atol=0)
    torch.testing.assert_close(opt.state[model.weight]["momentum_buffer"], buf_root, rtol=0, atol=0)
    assert state.batch == 2  # rank 0's committed value

    # a new epoch forgets the processed samples
    sampler.set_epoch(1)
    assert sampler.processed_indices == set() and len(sampler) == 6 and sampler.epoch == 1
    state.commit()
    sampler.record_indices([0, 1])
    state.restore()
    assert sampler.processed_indices == set() and sampler.epoch == 1
    hvd.shutdown()
    return {"mine": sorted(mine), "second": second}


def test_elastic_sampler_commit_restore_and_sync():
    results = run_ranks(_sampler_state, 2, init="accord", timeout=90)
    assert len(results[0]["mine"]) == 4 and len(results[1]["mine"]) == 3
    assert set(results[0]["mine"]).isdisjoint(results[1]["mine"])
    assert (set(results[0]["mine"]) | set(results[1]["mine"]) | set(results[0]["second"])
            | set(results[1]["second"])) == set(range(11))


# --- a lost rank under hvd.elastic.run with an ElasticSampler ---------------------------------

_N = 18
_BS = 2


def _elastic_sampler_with_death(rank, size):
    import torch
    import torch.distributed as dist

    import accord.torch as hvd

    dist.destroy_process_group()  # the death harness gives every rank a torch process group
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(list(range(_N)), shuffle=True, seed=11)
    model = torch.nn.Linear(2, 1).double()
    state = hvd.elastic.TorchState(model, None, sampler=sampler, epoch=0)
    resets, first, done = [], [], []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        order = list(state.sampler)
        if not first:
            first.append(order)
        for b in range(0, len(order), _BS):
            if rank == 2 and b == _BS:
                os._exit(17)  # a lost rank, after committing its first batch
            batch = order[b:b + _BS]
            total = hvd.allreduce(torch.tensor([float(len(batch))]), op=hvd.Sum, name=f"b.{b}")
            state.sampler.record_batch(b // _BS, _BS)
            state.commit()
            done.append((hvd.size(), batch, float(total)))
        return len(order)

    last_len = train(state)
    state.sync()  # every survivor's processed samples, gathered
    out = {"resets": resets, "first": first[0], "done": done, "last_len": last_len,
           "size": hvd.size(), "processed": sorted(sampler.processed_indices),
           "left": len(sampler)}
    hvd.shutdown()
    return out


def test_lost_rank_sampler_continues_with_unprocessed_samples():
    from helpers.dying_ranks import run_ranks_with_deaths

    server, env = _start_accord_store()
    env.update({"ACCORD_COLLECTIVE_TIMEOUT": "10", "ACCORD_ELASTIC_TIMEOUT": "30"})
    try:
        results = run_ranks_with_deaths(_elastic_sampler_with_death, 3, {2}, env=env, timeout=90)
    finally:
        server.close()
    firsts = [set(results[r]["first"]) for r in (0, 1)]
    assert all(len(f) == 6 for f in firsts) and firsts[0].isdisjoint(firsts[1])
    before, after = {}, {}
    for r, out in results.items():
        assert out["resets"] == [2] and out["size"] == 2
        sizes = [s for s, _, _ in out["done"]]
        assert sizes == [3, 2, 2, 2]  # one batch before the death, then the re-split share
        assert all(total == 2 * s for s, b, total in out["done"] if len(b) == 2)
        before[r] = out["done"][0][1]
        assert before[r] == out["first"][:_BS]
        after[r] = [i for _, b, _ in out["done"][1:] for i in b]
        assert [len(b) for _, b, _ in out["done"][1:]] == [2, 2, 2]
        assert out["last_len"] == 6
    # no committed sample is repeated, not even the dead rank's: record_batch records every
    # rank's share of the batch, so the survivors know what rank 2 trained on
    assert set(after[0]).isdisjoint(after[1]) and len(after[0] + after[1]) == 12
    seen = set(before[0]) | set(before[1]) | set(after[0]) | set(after[1])
    assert len(seen) == 16 and not (set(after[0]) | set(after[1])) & (set(before[0]) | set(before[1]))
    for out in results.values():
        assert out["processed"] == list(range(_N)) and out["left"] == 0
