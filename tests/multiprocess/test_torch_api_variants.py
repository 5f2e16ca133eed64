"""More of accord.torch (Horovod's API) on real ranks: init's arguments, the async variants called
directly, compressed grouped allreduce, cross-rank argument errors, process-set barriers and
training, and changing backward_passes_per_step after construction.

Every rank regenerates every rank's input from (seed, rank); expected values come from numpy or
plain single-process torch, never from accord.
"""
import time

import numpy as np
import pytest
from helpers.ranks import run_ranks
from helpers.values import close as _close
from helpers.values import int_data as _data

pytestmark = pytest.mark.timeout(120)


def _wait_ready(hvd, handle, seconds=30.0):
    """Poll until the handle is ready (poll must turn True without synchronize being called)."""
    deadline = time.monotonic() + seconds
    while not hvd.poll(handle):
        assert time.monotonic() < deadline, f"handle {handle} never became ready"
        time.sleep(0.001)
    return True


def _model(seed=0):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3)).double()


def _batch(step, rank, rows=4):
    import torch

    rng = np.random.default_rng([step, rank, 7])
    return (torch.from_numpy(rng.normal(size=(rows, 5))), torch.from_numpy(rng.normal(size=(rows, 3))))


def _params(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _same(a, b, tol):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=tol, atol=tol, err_msg=k)


def _loss(model, step, rank):
    import torch

    x, y = _batch(step, rank)
    return torch.nn.functional.mse_loss(model(x), y)


# --- init's arguments, compressed grouped allreduce, argument errors, accumulation ---------------

def _init_compression_errors_accumulation(rank, size):
    import torch

    import accord.torch as hvd

    assert size == 2
    # comm as a list naming every rank (any order): a normal job
    hvd.init(comm=[1, 0])
    assert hvd.is_initialized() and (hvd.rank(), hvd.size()) == (rank, size)
    assert hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum).item() == 3.0
    hvd.shutdown()
    hvd.init(comm=[0, 1])
    assert (hvd.rank(), hvd.size()) == (rank, size)
    hvd.shutdown()
    # a strict subset: refused (after meeting, the same way on every rank), nothing left running
    with pytest.raises(NotImplementedError, match="HINT:") as info:
        hvd.init(comm=[0])
    assert "subset" in str(info.value)
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match="Invalid type of argument comm"):
        hvd.init(comm=5)
    assert not hvd.is_initialized()
    # process_sets: "dynamic" is accepted; another string is refused before anything starts
    with pytest.raises(ValueError, match="bogus"):
        hvd.init(process_sets="bogus")
    assert not hvd.is_initialized()
    hvd.init(process_sets="dynamic")
    assert hvd.is_initialized() and (hvd.rank(), hvd.size()) == (rank, size)
    single = hvd.add_process_set([1])  # sets can be added after a "dynamic" init
    if single.included():
        assert hvd.allreduce(torch.tensor([5.0]), op=hvd.Sum, process_set=single).item() == 5.0
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == size

    # grouped_allreduce with fp16 / bf16 on the wire: outputs keep float32, values are the sum
    # of the wire-rounded inputs, rounded once more to the wire dtype (one addition on 2 ranks)
    shapes = [(33,), (4, 5)]
    inputs = [[(_data(100 + i, r, s) / 3.0).astype(np.float32) for i, s in enumerate(shapes)]
              for r in range(size)]
    for comp, wire, tol in [(hvd.Compression.fp16, torch.float16, 2.0 ** -10),
                            (hvd.Compression.bf16, torch.bfloat16, 2.0 ** -7)]:
        ts = [torch.from_numpy(a.copy()) for a in inputs[rank]]
        got = hvd.grouped_allreduce(ts, op=hvd.Sum, compression=comp, name=f"grp.{wire}")
        assert len(got) == len(shapes)
        for i, g in enumerate(got):
            assert g.dtype == torch.float32 and tuple(g.shape) == shapes[i]
            exact = sum(inputs[r][i].astype(np.float64) for r in range(size))
            rounded = [torch.from_numpy(inputs[r][i]).to(wire).double() for r in range(size)]
            emulated = sum(rounded).to(wire).double().numpy()
            assert not np.array_equal(emulated, exact)  # the data does show the wire's rounding
            np.testing.assert_array_equal(g.double().numpy(), emulated)
            # and within the wire's precision of the float32 sum (|sum| <= 8/3)
            np.testing.assert_allclose(g.numpy(), exact, rtol=0, atol=3 * tol * 4)
            _close(ts[i].numpy(), inputs[rank][i])  # the input is untouched
        got = hvd.grouped_allreduce([torch.from_numpy(a.copy()) for a in inputs[rank]],
                                    compression=comp)  # Average
        for i, g in enumerate(got):
            assert g.dtype == torch.float32
            want = np.mean([inputs[r][i].astype(np.float64) for r in range(size)], 0)
            np.testing.assert_allclose(g.numpy(), want, rtol=0, atol=3 * tol * 2)

    # alltoall without splits, dim 0 not divisible by the set size: ValueError on every rank,
    # also when only one rank's tensor is bad (the other is told which rank was)
    with pytest.raises(ValueError, match="not divisible"):
        hvd.alltoall(torch.ones(3, 2))
    rows = 3 if rank == 0 else 2
    with pytest.raises(ValueError, match=r"invalid arguments on ranks \[0\]"):
        hvd.alltoall(torch.ones(rows, 2))
    # a reduce-op mismatch under one name: HorovodInternalError (a RuntimeError) on every rank
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.allreduce(torch.ones(3), op=hvd.Sum if rank == 0 else hvd.Max, name="opmix")
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "reduce ops" in message and "SUM" in message and "MAX" in message, message
    assert "rank 0 sent SUM" in message and "rank 1 sent MAX" in message, message
    got = hvd.alltoall(torch.arange(4) + 10 * rank)  # still usable afterwards
    assert got.tolist() == ([0, 1, 10, 11] if rank == 0 else [2, 3, 12, 13])

    # set_backward_passes_per_step(2) after construction with 1: gradients of two backward passes
    # add up locally, then average over the ranks (Horovod does not divide by the passes)
    model = _model(3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    opt.set_backward_passes_per_step(2)
    ref = _model(3)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(2):
        for micro in range(2):
            _loss(model, 2 * step + micro, rank).backward()
            for r in range(size):
                _loss(ref, 2 * step + micro, r).backward()
        for p in ref.parameters():
            p.grad /= size
        opt.synchronize()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-12, atol=1e-12,
                                       err_msg=name)
        with opt.skip_synchronize():
            opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    _same(_params(model), _params(ref), 1e-12)
    # a third backward pass before step() is refused, as Horovod refuses it
    _loss(model, 10, rank).backward()
    _loss(model, 11, rank).backward()
    with pytest.raises(AssertionError, match="Gradients were computed more than backward_passes_per_step"):
        _loss(model, 12, rank).backward()
    opt.synchronize()
    opt.zero_grad()
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == size
    hvd.shutdown()
    return True


def test_init_args_compressed_grouped_allreduce_errors_and_accumulation():
    assert run_ranks(_init_compression_errors_accumulation, 2, init="accord",
                     timeout=100) == [True] * 2


# --- the async variants, called directly ----------------------------------------------------------

def _async_variants(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    everyone = range(size)
    # submit everything first, then wait in reverse order
    ag_parts = [_data(1, r, (r + 1, 2)) for r in everyone]
    h_ag = hvd.allgather_async(torch.from_numpy(ag_parts[rank]), name="ag")
    grp = [torch.from_numpy(_data(2, rank, (rank + 2,))), torch.full((1, 3), rank, dtype=torch.int64)]
    h_gag = hvd.grouped_allgather_async(grp, name="gag")
    bc = torch.from_numpy(_data(3, rank, (2, 3)))
    h_bc = hvd.broadcast_async_(bc, root_rank=1, name="bc")
    splits = [(rank + j) % 3 for j in everyone]
    all_splits = [[(r + j) % 3 for j in everyone] for r in everyone]
    src = torch.from_numpy(_data(4, rank, (sum(splits), 2)))
    h_a2a = hvd.alltoall_async(src, splits=splits, name="a2a")
    h_a2a_even = hvd.alltoall_async(torch.arange(2 * size) + 100 * rank, name="a2a.even")
    rows = 2 * size + 1  # lower ranks get the extra row
    counts = [rows // size + (1 if r < rows % size else 0) for r in everyone]
    start = sum(counts[:rank])
    h_rs = {op: hvd.reducescatter_async(torch.from_numpy(_data(5, rank, (rows, 2))), op=op,
                                        name=f"rs.{int(op)}") for op in (hvd.Sum, hvd.Average)}
    rows2 = size + 2
    counts2 = [rows2 // size + (1 if r < rows2 % size else 0) for r in everyone]
    start2 = sum(counts2[:rank])
    h_grs = {op: hvd.grouped_reducescatter_async([torch.from_numpy(_data(6, rank, (rows, 2))),
                                                  torch.from_numpy(_data(7, rank, (rows2, 3)))],
                                                 op=op, name=f"grs.{int(op)}")
             for op in (hvd.Sum, hvd.Average)}
    handles = [h_ag, h_gag, h_bc, h_a2a, h_a2a_even, *h_rs.values(), *h_grs.values()]
    assert all(isinstance(h, int) for h in handles) and len(set(handles)) == len(handles)
    for h in reversed(handles):
        assert _wait_ready(hvd, h)

    # grouped reducescatter: Sum and Average, per tensor the rank's rows
    total, total2 = (sum(_data(6, r, (rows, 2)) for r in everyone),
                     sum(_data(7, r, (rows2, 3)) for r in everyone))
    for op, div in [(hvd.Average, size), (hvd.Sum, 1)]:
        got = hvd.synchronize(h_grs[op])
        assert isinstance(got, list) and len(got) == 2
        assert tuple(got[0].shape) == (counts[rank], 2) and tuple(got[1].shape) == (counts2[rank], 3)
        _close(got[0].numpy(), total[start:start + counts[rank]] / div, 1e-6)
        _close(got[1].numpy(), total2[start2:start2 + counts2[rank]] / div, 1e-6)
    # reducescatter
    total = sum(_data(5, r, (rows, 2)) for r in everyone)
    for op, div in [(hvd.Average, size), (hvd.Sum, 1)]:
        got = hvd.synchronize(h_rs[op])
        assert tuple(got.shape) == (counts[rank], 2)
        _close(got.numpy(), total[start:start + counts[rank]] / div, 1e-6)
    # alltoall without splits: (output, received splits) too
    out, received = hvd.synchronize(h_a2a_even)
    assert out.tolist() == [100 * r + 2 * rank + k for r in everyone for k in range(2)]
    assert received.tolist() == [2] * size
    # alltoall with splits: (output, received splits as int32)
    out, received = hvd.synchronize(h_a2a)
    assert received.dtype == torch.int32
    assert received.tolist() == [all_splits[r][rank] for r in everyone]
    want = [_data(4, r, (sum(all_splits[r]), 2))[sum(all_splits[r][:rank]):][:all_splits[r][rank]]
            for r in everyone]
    _close(out.numpy(), np.concatenate(want))
    # broadcast in place from global rank 1: the same tensor object, holding rank 1's values
    assert hvd.synchronize(h_bc) is bc
    _close(bc.numpy(), _data(3, 1, (2, 3)))
    # grouped allgather: a list, ragged first dims, dtypes kept
    got = hvd.synchronize(h_gag)
    _close(got[0].numpy(), np.concatenate([_data(2, r, (r + 2,)) for r in everyone]))
    assert got[1].dtype == torch.int64 and got[1].tolist() == [[r] * 3 for r in everyone]
    # allgather, ragged
    got = hvd.synchronize(h_ag)
    _close(got.numpy(), np.concatenate(ag_parts))
    # a synchronized handle is gone
    for h in handles:
        with pytest.raises(ValueError, match="was not created or has been cleared"):
            hvd.poll(h)
    hvd.shutdown()
    return True


def test_async_variants_poll_and_synchronize():
    assert run_ranks(_async_variants, 3, init="accord", timeout=100) == [True] * 3


# --- a process set of 2 of 3 ranks: barrier, broadcasts and DistributedOptimizer ------------------

def _process_set_training(rank, size, folder):
    import torch
    from helpers.marks import mark, marked, wait_marked

    import accord.torch as hvd

    hvd.init()
    assert size == 3
    members = [1, 2]
    ps = hvd.add_process_set(members)  # every rank registers it
    assert ps.included() == (rank in members)

    # barrier over the set, called by members only: rank 2 waits for rank 1 to arrive (rank 1
    # comes once rank 2 is on its way in, and marks its arrival just before its own barrier)
    if ps.included():
        hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps, name="before.barrier")
        if rank == 1:
            assert wait_marked(folder, "entering.2", timeout=60)
            time.sleep(0.6)  # (rank 2 is in its barrier by now; if not, nothing here fails)
            mark(folder, "arriving.1")
        else:
            mark(folder, "entering.2")
        assert hvd.barrier(process_set=ps) is None
        if rank == 2:
            assert marked(folder, "arriving.1"), "the set's barrier returned before rank 1 arrived"
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size  # global set still in step

    # broadcast_parameters and broadcast_object among members, root = global rank 2
    model = _model(seed=10 + rank)
    if ps.included():
        hvd.broadcast_parameters(model.state_dict(), root_rank=2, process_set=ps)
        _same(_params(model), _params(_model(seed=12)), 0)
        got = hvd.broadcast_object({"lr": 0.1, "from": rank} if rank == 2 else None, root_rank=2,
                                   process_set=ps)
        assert got == {"lr": 0.1, "from": 2}
        lr = got["lr"]
    else:
        lr = 0.1
    _same(_params(model), _params(_model(seed=12 if ps.included() else 10)), 0)

    # DistributedOptimizer over the set: members train as one big batch of both members'
    # batches; the non-member (Horovod: no hooks, synchronize() does nothing) trains locally
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                                   named_parameters=model.named_parameters(), process_set=ps)
    steps = 3
    for step in range(steps):
        _loss(model, step, rank).backward()
        opt.step()
        opt.zero_grad()
    ref = _model(seed=12 if ps.included() else 10)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    batch_of = members if ps.included() else [rank]
    for step in range(steps):
        (sum(_loss(ref, step, r) for r in batch_of) / len(batch_of)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    _same(_params(model), _params(ref), 1e-12)
    assert _params(model)["0.weight"].tolist() != _params(_model(12))["0.weight"].tolist()
    gathered = hvd.allgather_object(_params(model)["2.bias"].tolist())
    assert gathered[1] == gathered[2] != gathered[0]
    hvd.shutdown()
    return True


def test_process_set_barrier_broadcasts_and_optimizer(tmp_path):
    assert run_ranks(_process_set_training, 3, str(tmp_path), init="accord", timeout=100) == [True] * 3
