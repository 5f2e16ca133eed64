"""accord.torch (Horovod's API) on real ranks: every collective, its variants, autograd, errors.

Each test runs many checks inside one set of ranks (a rank costs about a second to start).
Every rank regenerates every rank's input from (seed, rank), so expected values are computed
independently with numpy.
"""
import os
import re

import numpy as np
import pytest
from helpers.ranks import run_ranks
from helpers.values import close as _close
from helpers.values import int_data as _data

pytestmark = pytest.mark.timeout(120)


def _np(t):
    return t.detach().float().numpy() if t.dtype in _half() else t.detach().numpy()


def _half():
    import torch

    return (torch.float16, torch.bfloat16)


# --- collectives, variants, dtypes, process sets ------------------------------------------------

def _collectives(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (rank, size, rank, size)
    assert (hvd.cross_rank(), hvd.cross_size(), hvd.is_initialized()) == (0, 1, True)
    everyone = range(size)

    # allreduce: ops x dtypes, out of place (input untouched) and in place
    for dtype in ["float32", "float64", "float16", "int32", "int64", "int8"]:
        base = [_data(1, r, (3, 4), dtype) for r in everyone]
        stack = np.stack([b.astype(np.float64) for b in base])
        for op, want in [(hvd.Sum, stack.sum(0)), (hvd.Min, stack.min(0)), (hvd.Max, stack.max(0)),
                         (hvd.Product, stack.prod(0))]:
            t = torch.from_numpy(base[rank].copy())
            got = hvd.allreduce(t, op=op, name=f"ar.{dtype}.{int(op)}")
            assert got.dtype == t.dtype and got is not t
            _close(_np(got), want)
            _close(_np(t), base[rank])
        if dtype.startswith("float"):
            _close(_np(hvd.allreduce(torch.from_numpy(base[rank].copy()))), stack.mean(0), 1e-3)
        t = torch.from_numpy(base[rank].copy())
        assert hvd.allreduce_(t, op=hvd.Sum) is t
        _close(_np(t), stack.sum(0))
    bf = torch.from_numpy(_data(2, rank, (5,))).to(torch.bfloat16)
    _close(_np(hvd.allreduce(bf, op=hvd.Sum)), sum(_data(2, r, (5,)) for r in everyone))

    # deprecated average=, prescale/postscale, compression
    x = torch.from_numpy(_data(3, rank, (6,)))
    with pytest.warns(DeprecationWarning):
        got = hvd.allreduce(x, average=False)
    _close(got.numpy(), sum(_data(3, r, (6,)) for r in everyone))
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    _close(got.numpy(), sum(_data(3, r, (6,)) for r in everyone) * 1.5)
    y = torch.from_numpy(_data(4, rank, (64,)) / 3.0)
    for comp in (hvd.Compression.fp16, hvd.Compression.bf16):
        got = hvd.allreduce(y, op=hvd.Sum, compression=comp)
        assert got.dtype == torch.float32
        _close(got.numpy(), sum(_data(4, r, (64,)) / 3.0 for r in everyone), 0.1)

    # async: poll, synchronize, many handles fused; unknown handle -> None
    hs = [(i, hvd.allreduce_async(torch.from_numpy(_data(10 + i, rank, (7,))), op=hvd.Sum))
          for i in range(12)]
    assert isinstance(hs[0][1], int)
    for i, h in hs:
        _close(hvd.synchronize(h).numpy(), sum(_data(10 + i, r, (7,)) for r in everyone))
    h = hvd.allreduce_async_(torch.ones(3), name="polled")
    while not hvd.poll(h):
        pass
    _close(hvd.synchronize(h).numpy(), np.ones(3))
    assert hvd.synchronize(123456) is None
    with pytest.raises(ValueError, match="was not created"):
        hvd.poll(123456)

    # grouped allreduce (+ in place)
    ts = [torch.from_numpy(_data(30 + i, rank, (i + 1, 2))) for i in range(3)]
    got = hvd.grouped_allreduce(ts, op=hvd.Sum, name="grp")
    for i, g in enumerate(got):
        _close(g.numpy(), sum(_data(30 + i, r, (i + 1, 2)) for r in everyone))
    assert hvd.grouped_allreduce_(ts, op=hvd.Average)[0] is ts[0]
    _close(ts[2].numpy(), np.mean([_data(32, r, (3, 2)) for r in everyone], 0), 1e-6)
    got = hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(2), torch.ones(3)], op=hvd.Sum))
    _close(got[1].numpy(), np.full(3, size))

    # allgather (ragged), grouped allgather, broadcast (root is a global rank)
    for dtype in ["float32", "int64", "uint8", "bool"]:
        parts = [_data(40, r, (r + 1, 3)).astype(dtype) if dtype != "uint8"
                 else np.abs(_data(40, r, (r + 1, 3))).astype(dtype) for r in everyone]
        got = hvd.allgather(torch.from_numpy(parts[rank]))
        np.testing.assert_array_equal(got.numpy(), np.concatenate(parts))
    got = hvd.grouped_allgather([torch.full((rank + 1,), rank), torch.full((1, 2), rank)])
    assert got[0].tolist() == [r for r in everyone for _ in range(r + 1)]
    assert got[1].tolist() == [[r, r] for r in everyone]
    root = size - 1
    b = torch.from_numpy(_data(50, rank, (2, 3)))
    _close(hvd.broadcast(b, root_rank=root).numpy(), _data(50, root, (2, 3)))
    _close(b.numpy(), _data(50, rank, (2, 3)))
    assert hvd.broadcast_(b, root_rank=0) is b
    _close(b.numpy(), _data(50, 0, (2, 3)))
    h = hvd.broadcast_async(torch.tensor([rank]), 1)
    assert hvd.synchronize(h).tolist() == [1]

    # alltoall: even split returns only the output; explicit splits return received splits
    src = torch.arange(size * 2) + 100 * rank
    got = hvd.alltoall(src)
    assert got.tolist() == [100 * r + 2 * rank + k for r in everyone for k in range(2)]
    splits = [(rank + j) % 3 for j in everyone]
    src = torch.from_numpy(_data(60, rank, (sum(splits), 2)))
    out, received = hvd.alltoall(src, splits=splits)
    assert received.dtype == torch.int32
    all_splits = [[(r + j) % 3 for j in everyone] for r in everyone]
    want = [_data(60, r, (sum(all_splits[r]), 2))[sum(all_splits[r][:rank]):][:all_splits[r][rank]]
            for r in everyone]
    _close(out.numpy(), np.concatenate(want))
    assert received.tolist() == [all_splits[r][rank] for r in everyone]
    out, received = hvd.alltoall(src, splits=torch.tensor(splits, dtype=torch.int64))
    assert received.dtype == torch.int64

    # reducescatter: Sum and Average, lower ranks get the extra rows; grouped
    rows = 2 * size + 1
    total = sum(_data(70, r, (rows, 2)) for r in everyone)
    counts = [rows // size + (1 if r < rows % size else 0) for r in everyone]
    start = sum(counts[:rank])
    got = hvd.reducescatter(torch.from_numpy(_data(70, rank, (rows, 2))), op=hvd.Sum)
    _close(got.numpy(), total[start:start + counts[rank]])
    got = hvd.reducescatter(torch.from_numpy(_data(70, rank, (rows, 2))))
    _close(got.numpy(), total[start:start + counts[rank]] / size, 1e-6)
    got = hvd.grouped_reducescatter([torch.from_numpy(_data(70, rank, (rows, 2))), torch.ones(size, 3)],
                                    op=hvd.Sum)
    _close(got[0].numpy(), total[start:start + counts[rank]])
    _close(got[1].numpy(), np.full((1, 3), size))

    # into given outputs (the handle returns them), also in place; the same values
    src = torch.from_numpy(_data(70, rank, (rows, 2)))
    out = torch.zeros(counts[rank], 2, dtype=src.dtype)
    h = hvd.reducescatter_async(src, op=hvd.Sum, output=out)
    assert hvd.synchronize(h) is out
    _close(out.numpy(), total[start:start + counts[rank]])
    flat = torch.from_numpy(_data(70, rank, (rows, 2)))
    h = hvd.reducescatter_async(flat, op=hvd.Sum, output=flat[start:start + counts[rank]])
    _close(hvd.synchronize(h).numpy(), total[start:start + counts[rank]])
    _close(flat[start:start + counts[rank]].numpy(), total[start:start + counts[rank]])
    parts = [_data(41, r, (r + 1, 3)) for r in everyone]
    gathered = torch.zeros(sum(r + 1 for r in everyone), 3, dtype=torch.from_numpy(parts[0]).dtype)
    at = sum(r + 1 for r in range(rank))
    mine = gathered[at:at + rank + 1]
    mine.copy_(torch.from_numpy(parts[rank]))
    h = hvd.grouped_allgather_async([mine, torch.full((1,), rank)], outputs=[gathered, None])
    got = hvd.synchronize(h)
    assert got[0] is gathered and got[1].tolist() == list(everyone)
    np.testing.assert_array_equal(gathered.numpy(), np.concatenate(parts))
    out = torch.empty(size, 2)
    grads = hvd.grouped_reducescatter_async([torch.ones(size * 2, 2), torch.ones(size, 2)], op=hvd.Sum,
                                            outputs=[None, out[rank:rank + 1]])
    assert hvd.synchronize(grads)[1].data_ptr() == out[rank:rank + 1].data_ptr()
    _close(out[rank:rank + 1].numpy(), np.full((1, 2), size))

    # process sets: registered at runtime; collectives within; root_rank stays global
    odd = hvd.add_process_set([r for r in everyone if r % 2 == 1])
    assert odd.process_set_id is not None and odd.size() == len(odd.ranks)
    with pytest.raises(ValueError, match="duplicate process set"):
        hvd.add_process_set(list(odd.ranks))
    if odd.included():
        assert odd.rank() == odd.ranks.index(rank)
        got = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, process_set=odd)
        assert got.item() == sum(odd.ranks)
        got = hvd.broadcast(torch.tensor([rank]), root_rank=odd.ranks[-1], process_set=odd)
        assert got.item() == odd.ranks[-1]
        assert hvd.allgather(torch.tensor([rank]), process_set=odd).tolist() == odd.ranks
    else:
        with pytest.raises(ValueError, match="not part of provided process set"):
            odd.rank()
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == size  # global still in step
    assert hvd.remove_process_set(odd) is True and odd.process_set_id is None
    assert hvd.remove_process_set(hvd.global_process_set) is False
    hvd.barrier()
    hvd.shutdown()
    assert not hvd.is_initialized()
    return True


@pytest.mark.parametrize("nprocs", [2, 3])
def test_collectives_match_numpy(nprocs):
    assert run_ranks(_collectives, nprocs, init="accord", timeout=100) == [True] * nprocs


# --- autograd: Horovod's backward rules ---------------------------------------------------------

def _autograd(rank, size):
    import torch

    import accord.torch as hvd

    hvd.init()
    everyone = range(size)
    g = lambda seed, r, shape: _data(seed, r, shape).astype("float64")  # noqa: E731

    def leaf(seed, shape):
        return torch.from_numpy(g(seed, rank, shape)).requires_grad_()

    # allreduce Sum / Average: the gradient is allreduced the same way
    for op, combine in [(hvd.Sum, np.sum), (hvd.Average, np.mean)]:
        x = leaf(1, (3,))
        hvd.allreduce(x, op=op).backward(torch.from_numpy(g(2, rank, (3,))))
        _close(x.grad.numpy(), combine([g(2, r, (3,)) for r in everyone], 0), 1e-12)
    xs = [leaf(3, (2,)), leaf(4, (1,))]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
    torch.autograd.backward(outs, [torch.full((2,), float(rank)), torch.ones(1)])
    _close(xs[0].grad.numpy(), np.full(2, sum(everyone)))
    _close(xs[1].grad.numpy(), np.full(1, size))

    # allgather: average the gradient, keep this rank's rows (first dims differ)
    x = leaf(5, (rank + 1, 2))
    total_rows = sum(r + 1 for r in everyone)
    hvd.allgather(x).backward(torch.from_numpy(g(6, rank, (total_rows, 2))))
    mean = np.mean([g(6, r, (total_rows, 2)) for r in everyone], 0)
    offset = sum(r + 1 for r in range(rank))
    _close(x.grad.numpy(), mean[offset:offset + rank + 1], 1e-12)
    xs = [leaf(7, (rank + 1,)), leaf(8, (1, 3))]
    outs = hvd.grouped_allgather(xs)
    torch.autograd.backward(outs, [torch.ones(total_rows) * (rank + 1), torch.ones(size, 3)])
    _close(xs[0].grad.numpy(), np.full(rank + 1, np.mean([r + 1 for r in everyone])), 1e-12)
    _close(xs[1].grad.numpy(), np.ones((1, 3)))

    # broadcast: averaged gradient on the root, zero elsewhere
    x = leaf(9, (4,))
    hvd.broadcast(x, root_rank=1).backward(torch.from_numpy(g(10, rank, (4,))))
    want = np.mean([g(10, r, (4,)) for r in everyone], 0) if rank == 1 else np.zeros(4)
    _close(x.grad.numpy(), want, 1e-12)

    # alltoall: the gradient travels back with the received splits
    splits = [(rank + j) % 2 + 1 for j in everyone]
    all_splits = [[(r + j) % 2 + 1 for j in everyone] for r in everyone]
    x = leaf(11, (sum(splits), 2))
    out, received = hvd.alltoall(x, splits=splits)
    out.backward(torch.from_numpy(g(12, rank, (out.shape[0], 2))))
    # rank j received all_splits[r][j] rows from rank r, so rows of x sent to j come back from j
    want = []
    for j in everyone:
        recv_j = [all_splits[r][j] for r in everyone]
        start = sum(recv_j[:rank])
        want.append(g(12, j, (sum(recv_j), 2))[start:start + splits[j]])
    _close(x.grad.numpy(), np.concatenate(want))

    # reducescatter: allgather of the gradient (times size for Sum)
    for op, factor in [(hvd.Sum, size), (hvd.Average, 1)]:
        x = leaf(13, (2 * size, 3))
        hvd.reducescatter(x, op=op).backward(torch.from_numpy(g(14, rank, (2, 3))))
        _close(x.grad.numpy(), np.concatenate([g(14, r, (2, 3)) * factor for r in everyone]))
    # ... times the prescale and postscale factors, which scaled the forward
    for op, factor in [(hvd.Sum, size * 6.0), (hvd.Average, 6.0)]:
        x = leaf(13, (2 * size, 3))
        hvd.reducescatter(x, op=op, prescale_factor=2.0, postscale_factor=3.0).backward(
            torch.from_numpy(g(14, rank, (2, 3))))
        _close(x.grad.numpy(), np.concatenate([g(14, r, (2, 3)) * factor for r in everyone]))
    xs = [leaf(15, (size, 2))]
    out = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    out[0].backward(torch.ones(1, 2))
    _close(xs[0].grad.numpy(), np.full((size, 2), size))
    xs = [leaf(15, (size, 2))]
    out = hvd.grouped_reducescatter(xs, op=hvd.Average, prescale_factor=0.5)
    out[0].backward(torch.ones(1, 2))
    _close(xs[0].grad.numpy(), np.full((size, 2), 0.5))
    hvd.shutdown()
    return True


@pytest.mark.parametrize("nprocs", [2, 3])
def test_autograd_follows_horovod_rules(nprocs):
    assert run_ranks(_autograd, nprocs, init="accord", timeout=100) == [True] * nprocs


# --- errors: local ValueErrors, cross-rank mismatches, lifecycle, timeline, Adasum -----------------

def _errors_and_lifecycle(rank, size, tmp):
    import json

    import torch

    import accord.torch as hvd

    hvd.init()
    # local argument errors raise ValueError before anything is submitted
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce(torch.ones(4, 4).t()[0])
    with pytest.raises(ValueError, match="scalar"):
        hvd.reducescatter(torch.tensor(1.0))
    with pytest.raises(ValueError, match="Sum and Average"):
        hvd.reducescatter(torch.ones(4), op=hvd.Max)
    with pytest.raises(ValueError, match="entries"):
        hvd.alltoall(torch.ones(3), splits=[3])
    with pytest.raises(ValueError, match="root rank 7"):
        hvd.broadcast(torch.ones(2), root_rank=7)
    # a wrong output: InvalidArgumentError on every rank at synchronize(), naming what it saw
    from accord.errors import InvalidArgumentError

    mine = (2 * size) // size
    for output, seen in [(torch.empty(mine + 1, 3), f"output has shape [{mine + 1}, 3], the result has shape "
                                                     f"[{mine}, 3]"),
                         (torch.empty(mine, 3, dtype=torch.float64), "output has dtype torch.float64"),
                         (torch.empty(3, mine).t(), "output is not contiguous")]:
        h = hvd.reducescatter_async(torch.ones(2 * size, 3), name="bad.out", output=output)
        with pytest.raises(InvalidArgumentError, match=re.escape(seen)) as caught:
            hvd.synchronize(h)
        assert "HINT:" in str(caught.value)
    rows = size + 1 if rank == 0 else size  # rank 0 alone: the others raise too
    h = hvd.allgather_async(torch.ones(1, 2), name="bad.rows", output=torch.empty(rows, 2))
    with pytest.raises(InvalidArgumentError, match=f"rank 0: {size + 1}.*result has {size}"):
        hvd.synchronize(h)
    dtype = torch.int32 if rank == size - 1 else torch.float32
    h = hvd.allgather_async(torch.ones(1, 2), name="bad.dtype", output=torch.empty(size, 2, dtype=dtype))
    with pytest.raises(InvalidArgumentError, match=rf"ranks \[{size - 1}\]") as caught:
        hvd.synchronize(h)
    assert f"rank {size - 1}: allgather: output has dtype torch.int32, the result is torch.float32" \
        in str(caught.value)
    with pytest.raises(ValueError, match="2 outputs for 1 tensors"):
        hvd.grouped_allgather_async([torch.ones(1)], outputs=[None, None])
    h = hvd.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
    with pytest.raises(ValueError, match="already in flight"):
        hvd.allreduce_async(torch.ones(2), name="dup")
    _close(hvd.synchronize(h).numpy(), np.full(2, size))
    # a grouped call is submitted whole or not at all: here its second name is in flight
    from accord.engine import session as _session
    h = hvd.allreduce_async(torch.ones(2), name="grp_2of2", op=hvd.Sum)
    with pytest.raises(ValueError, match="already in flight"):
        hvd.grouped_allreduce_async([torch.ones(2), torch.ones(3)], name="grp", op=hvd.Sum)
    assert _session.engine().inflight_names() == ["allreduce.grp_2of2"]  # not grp_1of2
    _close(hvd.synchronize(h).numpy(), np.full(2, size))
    got = hvd.grouped_allreduce([torch.ones(2), torch.ones(3)], name="grp", op=hvd.Sum)
    _close(got[1].numpy(), np.full(3, size))
    # cross-rank mismatches: a RuntimeError subclass (HorovodInternalError) on every rank
    messages = []
    for make in [lambda: hvd.allreduce_async(torch.zeros(3 + rank), name="shape"),
                 lambda: hvd.allreduce_async(torch.zeros(2, dtype=torch.float32 if rank else torch.float64),
                                             name="dtype"),
                 lambda: hvd.broadcast_async(torch.zeros(2), root_rank=rank, name="root")]:
        with pytest.raises(hvd.HorovodInternalError) as info:
            hvd.synchronize(make())
        assert isinstance(info.value, RuntimeError)
        messages.append(str(info.value))
    assert "Mismatched allreduce shapes for 'allreduce.shape'" in messages[0], messages[0]
    assert "rank 0 sent [3], rank 1 sent [4]" in messages[0], messages[0]
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == size  # still usable

    # Adasum on a power-of-two size (CPU, no MPI); non-power-of-two raises like Horovod
    a = torch.from_numpy(_data(20, rank, (5,)).astype("float64"))
    if size & (size - 1) == 0:
        got = hvd.allreduce(a, op=hvd.Adasum)
        vs = [_data(20, r, (5,)).astype("float64") for r in range(size)]
        while len(vs) > 1:
            nxt = []
            for p, q in zip(vs[::2], vs[1::2]):
                d = p @ q
                nxt.append((1 - d / (2 * (p @ p))) * p + (1 - d / (2 * (q @ q))) * q)
            vs = nxt
        _close(got.numpy(), vs[0], 1e-12)
    else:
        with pytest.raises(NotImplementedError, match="power of 2"):
            hvd.allreduce(a, op=hvd.Adasum)

    # timeline on demand (rank 0 writes)
    path = os.path.join(tmp, "timeline.json")
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(3), name="timed")
    if rank == 0:  # readable while the job runs, before stop_timeline (Horovod's test reads it then)
        from helpers.stacks import wait_until

        def written() -> bool:
            with open(path) as fh:
                return "NEGOTIATE_ALLREDUCE" in fh.read()

        # the writer thread appends within ~0.1 s; 30 s only ends a wait for a write that never comes
        assert wait_until(written, timeout=30, interval=0.02), "the timeline was not written while open"
    hvd.stop_timeline()
    if rank == 0:
        with open(path) as fh:
            names = {e.get("args", {}).get("name") for e in json.load(fh)["traceEvents"]}
        assert any(n and "allreduce.timed" in n for n in names), names

    # init -> shutdown -> init keeps rank and size; queries fail in between
    hvd.shutdown()
    with pytest.raises(ValueError, match="Horovod has not been initialized; use hvd.init()."):
        hvd.rank()
    with pytest.raises(hvd.HorovodInternalError):
        hvd.allreduce(torch.ones(1))
    ps, same_as_global = hvd.ProcessSet([1, 0]), hvd.ProcessSet(list(range(size)))
    with pytest.raises(ValueError, match="is a duplicate"):  # as Horovod: it equals the global set
        hvd.init(process_sets=[same_as_global])
    assert hvd.is_initialized() and hvd.size() == size  # as Horovod: initialized all the same
    hvd.init(process_sets=[ps] if size > 2 else [hvd.ProcessSet([1])])  # init again, valid sets
    assert (hvd.rank(), hvd.size()) == (rank, size)
    if size > 2:
        assert ps.process_set_id == 1 and ps.ranks == [0, 1]
        if ps.included():
            assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps).item() == 2
    hvd.shutdown()
    assert ps.process_set_id is None  # shutdown invalidates registered sets
    assert ps.process_set_id is None
    return True


@pytest.mark.parametrize("nprocs", [2, 3])
def test_errors_lifecycle_adasum_timeline(nprocs, tmp_path):
    assert run_ranks(_errors_and_lifecycle, nprocs, str(tmp_path), init="accord",
                     timeout=100) == [True] * nprocs
